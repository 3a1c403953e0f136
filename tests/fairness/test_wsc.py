"""FairServe's WSC: normalised service per application, continuations first, the priority factor,
the VTC-style counter bound, and determinism.

`Engine` is the smallest continuous-batching loop the paper's Algorithm 1 runs in (the idea of
`MiniEngine` in test_vtc.py): a memory of M tokens, each running request holds its input plus what
it generated, each step generates one token per running request, and new requests are admitted
while the policy's head fits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwarden.api.enums import LengthPrediction, Ordering, PolicyName, QuantumUnit, Tier
from fleetwarden.fairness.config import (
    ApplicationConfig,
    DpaConfig,
    DrrConfig,
    FairnessConfig,
    GateConfig,
    StageConfig,
    TenantConfig,
    TokenWeightsConfig,
)
from fleetwarden.fairness.ordering import queue_factory
from fleetwarden.fairness.request import Request
from fleetwarden.fairness.wsc import ServiceWeights, WeightedServiceCounter

MEMORY = 1000
CONTENDED = 400
DEPTH = 24
"""Queued requests per backlogged user: more than its share of CONTENDED memory ever holds."""
STAGES = {
    "chat": {"answer": {"input": 20, "output": 20}},  # w = 40
    "summarise": {"summary": {"input": 100, "output": 100}},  # w = 200: five times chat
}
APP_OF = {"chat": ("chat", "answer"), "summarise": ("summarise", "summary")}


@dataclass
class Engine:
    """Continuous batching around a WSC; `served` counts raw tokens (input + output) per user."""

    policy: WeightedServiceCounter
    memory: int = MEMORY
    running: list[Request] = field(default_factory=list)
    lengths: dict[int, int] = field(default_factory=dict)
    served: Counter[str] = field(default_factory=Counter)
    queued: Counter[str] = field(default_factory=Counter)
    dispatched: list[int] = field(default_factory=list)
    now: float = 0.0
    seq: int = 0
    check: Callable[[Engine], None] | None = None

    def arrive(
        self,
        tenant: str,
        app: str | None,
        input_tokens: int,
        output_tokens: int,
        *,
        system_tokens: int = 0,
        continuation: bool = False,
    ) -> Request:
        app_name, stage = APP_OF.get(app or "", (app, "answer"))
        request = Request(
            self.seq,
            tenant,
            self.now,
            input_tokens,
            output_tokens,
            system_tokens=system_tokens,
            app=app_name,
            stage=stage,
            continuation=continuation,
        )
        self.lengths[self.seq] = output_tokens
        self.seq += 1
        self.queued[tenant] += 1
        self.policy.push(request, self.now)
        self._check()
        return request

    def used(self) -> int:
        return sum(r.input_tokens + r.output_tokens for r in self.running)

    def step(self) -> None:
        while (head := self.policy.peek(self.now)) is not None:
            if head.input_tokens + 1 > self.memory - self.used():
                break
            assert self.policy.pop(self.now) is head
            self.running.append(head)
            self.dispatched.append(head.seq)
            self.queued[head.tenant] -= 1
            self.served[head.tenant] += head.input_tokens
            self._check()
        self.now += 1.0
        for request in list(self.running):
            self.policy.charge(request, output_tokens=1, now=self.now)
            request.output_tokens += 1
            self.served[request.tenant] += 1
            if request.output_tokens >= self.lengths[request.seq]:
                self.running.remove(request)
                self.policy.complete(request, self.now)
        self._check()

    def _check(self) -> None:
        if self.check is not None:
            self.check(self)


def _backlogged(engine: Engine, users: dict[str, tuple[str, int, int]], steps: int) -> None:
    """Keep every user with DEPTH queued requests (of its app and size) for `steps` steps."""
    for _ in range(steps):
        for user, (app, n_in, n_out) in users.items():
            for _ in range(DEPTH - engine.queued[user]):
                engine.arrive(user, app, n_in, n_out)
        engine.step()


# -- behaviour --------------------------------------------------------------------------------


def test_apps_with_5x_expectations_get_equal_normalised_and_5x_raw_service() -> None:
    engine = Engine(WeightedServiceCounter(stages=STAGES), memory=CONTENDED)
    _backlogged(engine, {"a": ("chat", 20, 20), "b": ("summarise", 100, 100)}, steps=1000)
    counters = engine.policy.counters
    assert abs(counters["a"] - counters["b"]) <= 1.0  # one request's worth of normalised service
    assert engine.served["b"] / engine.served["a"] == pytest.approx(5.0, rel=0.1)


def test_vtc_like_raw_tokens_would_be_equal_without_stages() -> None:
    """The control: with no expectations configured, both are normalised by 1 and get equal tokens."""
    engine = Engine(WeightedServiceCounter(), memory=CONTENDED)
    _backlogged(engine, {"a": ("chat", 20, 20), "b": ("summarise", 100, 100)}, steps=1000)
    assert engine.served["b"] / engine.served["a"] == pytest.approx(1.0, rel=0.1)


def test_a_priority_factor_below_one_means_more_service() -> None:
    wsc = WeightedServiceCounter(stages=STAGES, priority_factors={"a": 0.5})
    engine = Engine(wsc, memory=CONTENDED)
    _backlogged(engine, {"a": ("chat", 20, 20), "b": ("chat", 20, 20)}, steps=600)
    assert engine.served["a"] / engine.served["b"] == pytest.approx(2.0, rel=0.1)


def test_continuations_go_first_least_served_user_first() -> None:
    wsc = WeightedServiceCounter()
    wsc.counters.update({"busy": 500.0, "mid": 200.0, "idle": 0.0})
    new = Request(0, "idle", 0.0, 10, 10)
    busy = Request(1, "busy", 0.0, 10, 10, continuation=True)
    mid = Request(2, "mid", 0.0, 10, 10, continuation=True)
    for request in (new, busy, mid):
        wsc.push(request, 0.0)
    assert wsc.peek(0.0) is mid
    assert [wsc.pop(1.0) for _ in range(3)] == [mid, busy, new]


def test_earliest_continuation_of_a_user_first_then_its_earliest_new_request() -> None:
    wsc = WeightedServiceCounter()
    first_new = Request(0, "a", 0.0, 10, 10)
    cont = [Request(i, "a", 0.0, 10, 10, continuation=True) for i in (1, 2)]
    later_new = Request(3, "a", 0.0, 10, 10)
    for request in (first_new, *cont, later_new):
        wsc.push(request, 0.0)
    assert [wsc.pop(0.0) for _ in range(4)] == [*cont, first_new, later_new]


def test_input_is_normalised_and_charged_at_dispatch_output_per_token() -> None:
    stages = {"app": {"s": {"input": 50, "system": 25, "output": 100}}}  # w = 50 + 50 + 100 = 200
    wsc = WeightedServiceCounter(stages=stages)
    request = Request(0, "a", 0.0, 120, 10, system_tokens=20, app="app", stage="s")
    assert wsc.normaliser(request) == 200.0
    wsc.push(request, 0.0)
    assert wsc.pop(0.0) is request
    assert wsc.counters["a"] == pytest.approx((100 + 2 * 20) / 200)
    wsc.charge(request, output_tokens=10, now=1.0)
    assert wsc.counters["a"] == pytest.approx((100 + 40 + 10) / 200)
    wsc.charge(request, input_tokens=-20, now=1.0)  # the engine counted 20 fewer prompt tokens
    assert wsc.counters["a"] == pytest.approx(130 / 200)


def test_unknown_app_or_stage_uses_the_default_normaliser() -> None:
    for default in (1.0, 40.0):
        wsc = WeightedServiceCounter(stages=STAGES, default_normaliser=default)
        for app, stage in ((None, None), ("chat", None), ("chat", "other"), ("nope", "answer")):
            assert wsc.normaliser(Request(0, "a", 0.0, 1, 1, app=app, stage=stage)) == default
    with pytest.raises(ValueError, match="default_normaliser"):
        WeightedServiceCounter(default_normaliser=0.0)


def test_a_stage_worth_nothing_under_the_weights_falls_back_to_the_default() -> None:
    wsc = WeightedServiceCounter(
        ServiceWeights(input=1.0, system=0.0, output=1.0), stages={"x": {"s": {"system": 10}}}
    )
    assert wsc.normaliser(Request(0, "a", 0.0, 1, 1, app="x", stage="s")) == 1.0


def test_a_joining_user_is_lifted_like_vtc() -> None:
    wsc = WeightedServiceCounter()
    wsc.push(Request(0, "a", 0.0, 100, 10), 0.0)
    wsc.push(Request(1, "b", 0.0, 50, 10), 0.0)
    wsc.push(Request(2, "b", 0.0, 50, 10), 0.0)
    assert [r.tenant for r in (wsc.pop(0.0), wsc.pop(0.0))] == ["a", "b"]  # type: ignore[union-attr]
    wsc.push(Request(3, "c", 1.0, 10, 10), 1.0)
    assert wsc.counters["c"] == 50.0  # the least queued counter (b), not a's 100
    assert wsc.pop(1.0).tenant == "b"  # type: ignore[union-attr]
    assert wsc.pop(1.0).tenant == "c"  # type: ignore[union-attr]
    wsc.push(Request(4, "d", 2.0, 10, 10), 2.0)  # empty queue: the last user to leave
    assert wsc.counters["d"] == wsc.counters["c"]


def test_tenant_weight_divides_service_like_weighted_vtc() -> None:
    wsc = WeightedServiceCounter(weights={"a": 4.0}, priority_factors={"a": 0.5})
    request = Request(0, "a", 0.0, 80, 10)
    wsc.push(request, 0.0)
    wsc.pop(0.0)
    assert wsc.counters["a"] == pytest.approx(80 * 0.5 / 4.0)


def test_remove_cancels_either_kind() -> None:
    wsc = WeightedServiceCounter()
    new, cont = Request(0, "a", 0.0, 1, 1), Request(1, "a", 0.0, 1, 1, continuation=True)
    wsc.push(new, 0.0)
    wsc.push(cont, 0.0)
    cont.continuation = False  # the shell's flag changing later does not lose the request
    assert wsc.remove(cont)
    assert not wsc.remove(cont)
    assert len(wsc) == 1
    assert wsc.queued_tenants() == ["a"]
    assert wsc.remove(new)
    assert wsc.queued_tenants() == []
    assert wsc.pop(0.0) is None


@pytest.mark.parametrize("ordering", list(Ordering))
def test_every_ordering_drains_every_request_exactly_once(ordering: Ordering) -> None:
    wsc = WeightedServiceCounter(queue_factory=queue_factory(ordering))
    requests = [
        Request(
            i,
            f"t{i % 3}",
            float(i),
            10,
            10,
            tier=list(Tier)[i % 3],
            deadline_s=float(20 - i),
            continuation=i % 4 == 0,
        )
        for i in range(12)
    ]
    for request in requests:
        wsc.push(request, request.arrival_s)
    wsc.remove(requests[5])
    seen = []
    while (popped := wsc.pop(30.0)) is not None:
        seen.append(popped.seq)
    assert sorted(seen) == [i for i in range(12) if i != 5]
    assert seen[:3] == [0, 4, 8]  # continuations first
    assert len(wsc) == 0


def _config() -> FairnessConfig:
    tenant = TenantConfig(weight=1.0, tier=Tier.IW_NORMAL, priority_factor=1.0)
    return FairnessConfig(
        source="test",
        served_model="m",
        policy=PolicyName.WSC,
        ordering=Ordering.FIFO,
        token_weights=TokenWeightsConfig(input=1, system=3, output=2),
        length_prediction=LengthPrediction.NONE,
        tenants={"vip": tenant.model_copy(update={"priority_factor": 0.25, "weight": 2.0})},
        defaults=tenant.model_copy(update={"priority_factor": 2.0}),
        applications={
            "rag": ApplicationConfig(stages={"s": StageConfig(input=10, system=10, output=5)})
        },
        interaction_throttling=True,
        early_rejection=False,
        overload_kv_utilization=0.9,
        drr=DrrConfig(unit=QuantumUnit.TOKENS, quantum={}),
        dpa=DpaConfig(severely_expired_s=2.0, urgent_within_s=0.5),
        tiers={},
        gate=GateConfig(max_waiting_requests=0, telemetry_max_age_s=5.0),
        tenant_header="x-tenant",
    )


def test_from_config_takes_weights_stages_and_tenant_factors() -> None:
    wsc = WeightedServiceCounter.from_config(_config())
    assert wsc.token_weights == ServiceWeights(input=1, system=3, output=2)
    request = Request(0, "vip", 0.0, 12, 5, system_tokens=2, app="rag", stage="s")
    assert wsc.normaliser(request) == 10 + 30 + 10
    wsc.push(request, 0.0)
    wsc.pop(0.0)
    assert wsc.counters["vip"] == pytest.approx((10 + 3 * 2) / 50 * 0.25 / 2.0)
    other = Request(1, "someone", 0.0, 50, 5, app="rag", stage="s")
    wsc.push(other, 0.0)  # lifted to vip's counter (the last to leave), then charged with E = 2
    lifted = wsc.counters["someone"]
    wsc.pop(0.0)
    assert wsc.counters["someone"] - lifted == pytest.approx(50 / 50 * 2.0)


# -- properties -------------------------------------------------------------------------------

MAX_INPUT, MAX_SYSTEM, MAX_OUTPUT = 150, 40, 120


def _events(apps: list[str | None]) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    arrive = st.tuples(
        st.just("arrive"),
        st.sampled_from("abcd"),
        st.sampled_from(apps),
        st.integers(1, MAX_INPUT),
        st.integers(0, MAX_SYSTEM),
        st.integers(1, MAX_OUTPUT),
    )
    step = st.tuples(st.just("step"), st.integers(1, 8))
    return st.lists(st.one_of(arrive, step), min_size=1, max_size=100)


def _play(engine: Engine, script: list[tuple[Any, ...]]) -> None:
    for event in script:
        if event[0] == "arrive":
            _, user, app, n_user, n_system, n_out = event
            engine.arrive(user, app, n_user + n_system, n_out, system_tokens=n_system)
        else:
            for _ in range(event[1]):
                engine.step()


KNOWN_APPS: list[str | None] = ["chat", "summarise"]
ALL_APPS: list[str | None] = [*KNOWN_APPS, None]


@pytest.mark.parametrize("apps", [KNOWN_APPS, ALL_APPS], ids=["known-apps", "with-unknown"])
@pytest.mark.parametrize("preferences", [False, True], ids=["equal", "E-and-weights"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_counter_gap_among_backlogged_users_is_bounded(
    apps: list[str | None], preferences: bool, data: st.DataObject
) -> None:
    """VTC's Lemma 4.3 carries over: max - min counter over queued users stays within
    max(input charge of one request, output price * M), every price in WSC units (divided by the
    least normaliser in play, times the largest E / weight). New interactions only: continuations
    override the counter order on purpose."""
    factors = {"a": 0.5, "b": 2.0} if preferences else {}
    weights = {"c": 3.0} if preferences else {}
    wsc = WeightedServiceCounter(stages=STAGES, priority_factors=factors, weights=weights)
    least = 1.0 if None in apps else 40.0  # chat's w = 40; an unknown app's is 1
    scale = 2.0 if preferences else 1.0  # the largest E / weight
    tw = wsc.token_weights
    worst_input = tw.input * MAX_INPUT + tw.system * MAX_SYSTEM
    bound = max(worst_input, tw.output * MEMORY) / least * scale

    _play(Engine(wsc, check=_gap_within(bound)), data.draw(_events(apps)))


def _gap_within(bound: float) -> Callable[[Engine], None]:
    def check(engine: Engine) -> None:
        counters = [engine.policy.counters[t] for t in engine.policy.queued_tenants()]
        if counters:
            assert max(counters) - min(counters) <= bound + 1e-9, (counters, bound)

    return check


def test_a_user_back_from_idle_is_not_owed_the_time_it_was_away() -> None:
    """ON/OFF load (VTC's LCF control): a runs alone far past the bound, then b arrives. Without
    the lift b would hold the engine until it caught up; with it the gap stays bounded."""
    script: list[tuple[Any, ...]] = [("arrive", "a", "chat", 20, 0, 20)] * 120
    script += [("step", 8)] * 40
    script += [("arrive", "a", "chat", 20, 0, 20)] * 2 + [("arrive", "b", "chat", 20, 0, 20)]
    script += [("step", 8)] * 5
    wsc = WeightedServiceCounter(stages=STAGES)
    bound = max(wsc.token_weights.input * 20, wsc.token_weights.output * MEMORY) / 40
    engine = Engine(wsc, check=_gap_within(bound))
    _play(engine, script)
    assert wsc.counters["a"] > 4 * bound  # a really was far ahead when b arrived


@settings(max_examples=60, deadline=None)
@given(_events(ALL_APPS))
def test_the_schedule_is_deterministic(script: list[tuple[Any, ...]]) -> None:
    """Equal counters break by arrival order only: two runs of one script dispatch identically."""
    runs = []
    for _ in range(2):
        engine = Engine(WeightedServiceCounter(stages=STAGES))
        _play(engine, script)
        runs.append(engine.dispatched)
    assert runs[0] == runs[1]


def test_ties_break_by_arrival_order() -> None:
    wsc = WeightedServiceCounter()
    for seq, user in enumerate("cabd"):
        wsc.push(Request(seq, user, 0.0, 0, 1), 0.0)  # zero input: counters stay tied at 0
    assert [wsc.pop(0.0).tenant for _ in range(4)] == list("cabd")  # type: ignore[union-attr]
