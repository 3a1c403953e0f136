"""Parity: a one-instance fleet without scaling serves a trace exactly as `fleetwarden replay` does.

The fleet simulator skips plain decode steps and charges policies lazily; the replay loop steps
every decode iteration and charges every token. Same engine rules, same policy objects: the same
dispatch order and the same first-token and completion times (up to floating-point rounding of
the closed-form step sums).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.factory import build_policy
from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.sim.cluster import SimOptions, simulate
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.replay import replay
from fleetwarden.sim.trace import TraceRequest
from fleetwarden.sim.workload import SimRequest
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

TOLERANCE_S = 1e-9


def _trace(seed: int, count: int, rate: float) -> list[TraceRequest]:
    rng = random.Random(seed)
    t = 0.0
    trace = []
    for _ in range(count):
        t += rng.expovariate(rate)
        trace.append(
            TraceRequest(t, f"t{rng.randrange(4)}", rng.randint(10, 1500), rng.randint(2, 500))
        )
    return trace


@pytest.mark.parametrize(
    ("policy", "rate"),
    [("fcfs", 3.0), ("vtc", 3.0), ("wsc", 3.0), ("drr", 3.0), ("vtc", 0.3)],
)
def test_one_instance_matches_replay(tmp_path: Path, policy: str, rate: float) -> None:
    fleet = write_fleet(tmp_path, pool_yaml(), model_yaml(policy=policy))
    model = fleet.model("org/m")
    trace = _trace(7, 600, rate)
    expected = replay(trace, build_policy(model.fairness), VTC_A10G)
    workload = [
        SimRequest(
            r.arrival_s,
            "org/m",
            "region-a",
            r.tenant,
            r.input_tokens,
            r.output_tokens,
            tier=Tier.IW_NORMAL,
        )
        for r in trace
    ]
    results = simulate(
        fleet,
        workload,
        SimOptions(
            duration_s=trace[-1].arrival_s + 7200,
            scaling=False,
            profiles={(model.key, "pool-a"): VTC_A10G},
            keep_requests=True,
        ),
    )
    assert results.requests is not None
    got = {r.seq: r for r in results.requests}
    assert len(got) == len(trace)
    for record in expected.records:
        mine = got[record.seq]
        assert mine.outcome == "completed"
        assert record.first_token_s is not None
        assert record.completion_s is not None
        assert mine.first_token_s == pytest.approx(record.first_token_s, abs=TOLERANCE_S)
        assert mine.completion_s == pytest.approx(record.completion_s, abs=TOLERANCE_S)
        assert mine.dispatch_s == pytest.approx(record.dispatch_s, abs=TOLERANCE_S)
    dispatch_order = [r.seq for r in sorted(results.requests, key=lambda r: r.dispatch_index)]
    assert dispatch_order == expected.dispatch_order


def test_length_prediction_matches_replay_with_a_fed_moving_average(tmp_path: Path) -> None:
    policy = (
        "apiVersion: fleetwarden.dev/v1alpha1\nkind: TenantPolicy\n"
        "metadata: {name: p, namespace: ns}\n"
        "spec: {policy: vtc, lengthPrediction: moving-average}\n"
    )
    fleet = write_fleet(tmp_path, pool_yaml(), model_yaml(policy="vtc"), policy)
    model = fleet.model("org/m")
    trace = _trace(11, 400, 3.0)
    average = MovingAverage()
    expected = replay(
        trace,
        build_policy(model.fairness, predictor=average),
        VTC_A10G,
        on_complete=lambda r: average.observe(r.tenant, r.output_tokens),
    )
    workload = [
        SimRequest(r.arrival_s, "org/m", "region-a", r.tenant, r.input_tokens, r.output_tokens)
        for r in trace
    ]
    options = SimOptions(
        duration_s=trace[-1].arrival_s + 7200,
        scaling=False,
        profiles={(model.key, "pool-a"): VTC_A10G},
        keep_requests=True,
    )
    results = simulate(fleet, workload, options)
    assert results.requests is not None
    got = {r.seq: r for r in results.requests}
    for record in expected.records:
        assert got[record.seq].completion_s == pytest.approx(record.completion_s, abs=TOLERANCE_S)
    assert [r.seq for r in sorted(results.requests, key=lambda r: r.dispatch_index)] == (
        expected.dispatch_order
    )
