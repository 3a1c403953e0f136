"""Fair dispatch through the real sidecar: VTC protects a light tenant, and the sidecar makes the
same decisions as `fleetwarden replay` on the same workload (one brain, two bodies).

The engine is the stub (no GPU here): the simulator's engine model in real time.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass

import aiohttp

from fleetwarden.api.enums import PolicyName
from fleetwarden.fairness.config import GateConfig
from fleetwarden.fairness.factory import build_policy
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.scheduler import Admission
from fleetwarden.sidecar.dispatcher import Dispatcher
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.replay import replay
from fleetwarden.sim.trace import TraceRequest
from tests.support.sidecar_stack import fairness_config, running_sidecar, running_stub


async def _first_token_latency(
    http: aiohttp.ClientSession, url: str, tenant: str, prompt: int, out: int
) -> float:
    body = {"model": "stub-model", "prompt": [7] * prompt, "max_tokens": out, "stream": True}
    start = time.monotonic()
    first = None
    async with http.post(
        f"{url}/v1/completions", json=body, headers={"x-fleetwarden-tenant": tenant}
    ) as r:
        assert r.status == 200
        async for line in r.content:
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic() - start
    assert first is not None
    return first


@dataclass
class LightTurn:
    """One light request as the sidecar's dispatcher saw it."""

    queued_ahead: int
    """Requests already waiting in the sidecar's queue when the light request arrived."""
    dispatched_ahead: int
    """Requests dispatched after it arrived and before it: the queue it actually waited behind."""


def _record_light_turns(dispatcher: Dispatcher, turns: list[LightTurn]) -> None:
    """Wrap the real dispatcher's `offer` and `pump` to note, for each light request, how many
    requests waited ahead of it on arrival and how many of them went first."""
    arrivals: dict[int, tuple[int, int]] = {}  # light seq -> (queued on arrival, dispatches so far)
    dispatched: list[int] = []
    dispatcher.dispatch_log = dispatched
    offer, pump = dispatcher.offer, dispatcher.pump

    def recording_offer(request: Request) -> Admission:
        if request.tenant == "light":
            arrivals[request.seq] = (dispatcher.scheduler.queued, len(dispatched))
        return offer(request)

    def recording_pump() -> None:
        seen = len(dispatched)
        pump()
        for index in range(seen, len(dispatched)):
            if dispatched[index] in arrivals:
                queued, at_arrival = arrivals.pop(dispatched[index])
                turns.append(LightTurn(queued, index - at_arrival))

    dispatcher.offer = recording_offer  # type: ignore[method-assign]
    dispatcher.pump = recording_pump  # type: ignore[method-assign]


async def _light_turns_under(policy: PolicyName) -> tuple[list[LightTurn], float]:
    """A heavy tenant keeps 60 streams queued; a light tenant sends 4 requests one by one.

    Returns how each light request was dispatched, and (for the log only) its mean TTFT.
    """
    gate = GateConfig(
        max_inflight_tokens=VTC_A10G.kv_budget_tokens, max_waiting_requests=0, telemetry_max_age_s=5
    )
    config = fairness_config(policy=policy, gate=gate, early_rejection=False)
    turns: list[LightTurn] = []
    async with (
        running_stub(VTC_A10G, time_scale=0.1) as stub,
        running_sidecar(stub.url, config) as sc,
    ):
        _record_light_turns(sc.state.dispatcher, turns)
        stop = asyncio.Event()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def heavy_client() -> None:
                while not stop.is_set():
                    await _first_token_latency(http, sc.url, "heavy", 256, 64)

            heavy = [asyncio.create_task(heavy_client()) for _ in range(60)]
            while sc.state.dispatcher.scheduler.queued < 20:  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # the heavy tenant fills the engine, then the queue
            latencies = []
            for _ in range(4):
                latencies.append(await _first_token_latency(http, sc.url, "light", 64, 16))
                await asyncio.sleep(0.1)
            stop.set()
            for task in heavy:
                task.cancel()  # clients hang up; the sidecar cancels their engine requests
            await asyncio.gather(*heavy, return_exceptions=True)
    return turns, statistics.mean(latencies)


async def test_vtc_lets_the_light_tenant_pass_the_heavy_queue_where_fcfs_does_not() -> None:
    """Under FCFS each light request waits behind every heavy request queued before it; under VTC
    it goes at once (the lift puts the light tenant level with the heavy one, whose counter grows
    with every dispatch). Asserted on the dispatcher's decisions, not on wall-clock latency, which
    a loaded CI machine stretches; the mean TTFTs are printed for the reader."""
    fcfs, fcfs_ttft = await _light_turns_under(PolicyName.FCFS)
    vtc, vtc_ttft = await _light_turns_under(PolicyName.VTC)
    print(f"light tenant mean TTFT: vtc {vtc_ttft:.3f} s, fcfs {fcfs_ttft:.3f} s")
    print(f"light turns: vtc {vtc}, fcfs {fcfs}")
    assert len(fcfs) == len(vtc) == 4
    for turn in fcfs:
        assert turn.queued_ahead >= 5  # the heavy queue was there: the test can tell
        assert turn.dispatched_ahead == turn.queued_ahead  # FCFS: strictly behind all of it
    for turn in vtc:
        assert turn.queued_ahead >= 5
        assert turn.dispatched_ahead <= 1  # VTC: past the queue (at most one tie before it)


def _workload(seed: int, n: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    tenants = ["a", "a", "a", "b", "b", "c", "d"]
    blocker = TraceRequest(0.0, "warmup", 300, 40)
    rest = [
        TraceRequest(
            0.001 * (i + 1), rng.choice(tenants), rng.randint(200, 300), rng.randint(5, 20)
        )
        for i in range(n)
    ]
    return [blocker, *rest]


async def test_sidecar_dispatches_in_the_same_order_as_replay() -> None:
    """Parity: one seeded workload through the sidecar and through `replay`, same VTC config.

    Both run one request at a time (the replay engine's KV budget fits one request, the
    sidecar's gate budget is 1 token), and every request arrives while the first is running, so
    the order is the policy's alone and must match request for request.
    """
    trace = _workload(seed=7, n=24)
    gate = GateConfig(max_inflight_tokens=1, max_waiting_requests=0, telemetry_max_age_s=5)
    config = fairness_config(policy=PolicyName.VTC, gate=gate)

    one_at_a_time = EngineProfile("parity", 340, 1, 340, 0.0, 0.0, 0.01, 0.0, 0.0)
    expected = replay(trace, build_policy(config), one_at_a_time).dispatch_order

    fast = EngineProfile("fast", 100_000, 1, 100_000, 0.0, 0.0, 0.004, 0.0, 0.0)
    async with running_stub(fast) as stub, running_sidecar(stub.url, config) as sc:
        dispatcher = sc.state.dispatcher
        dispatcher.dispatch_log = []
        async with aiohttp.ClientSession() as http:
            tasks = []
            for index, item in enumerate(trace):
                body = {
                    "model": "stub-model",
                    "prompt": [5] * item.input_tokens,
                    "max_tokens": item.output_tokens,
                }
                headers = {"x-fleetwarden-tenant": item.tenant}
                tasks.append(
                    asyncio.create_task(
                        http.post(f"{sc.url}/v1/completions", json=body, headers=headers)
                    )
                )
                while dispatcher.scheduler.queued + dispatcher.scheduler.running < index + 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)  # arrival order is the trace order
            assert dispatcher.scheduler.running == 1  # everything arrived while the first ran
            for response in await asyncio.gather(*tasks):
                assert response.status == 200
                response.close()
    assert dispatcher.dispatch_log == expected
    assert expected != sorted(expected)  # VTC reordered the arrivals: the test can tell
