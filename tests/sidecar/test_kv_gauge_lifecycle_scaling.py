"""From the sidecars' expositions to the scaler's and the batch service's decisions (review r07).

Each pod is a real `SidecarMetrics`; what Prometheus would answer for `promql.utilisation()` is
the mean of the KV samples the pods export (`avg by (model, region)`; no sample anywhere is an
empty result, i.e. None). Prometheus scrapes not-ready pods too (prometheus-operator#4877), so
whatever a loading pod exports enters that mean. The scaler then discounts starting pods once
(`ScalingSignal.scale_out_utilisation`). The figures are the review's.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.batch.policy import TargetKind, release_plan
from fleetwarden.metrics import names
from fleetwarden.scaling import DecisionReason, ReactiveScaler, ScalingConfig, ScalingSignal
from fleetwarden.scaling.niw_release import ReleaseRule
from fleetwarden.sidecar.metrics import SidecarMetrics

CONFIG = ScalingConfig(min_instances=1, max_instances=10)


def region(ready: list[float], loading: int) -> list[SidecarMetrics]:
    """One sidecar per pod: the ready ones have read their engine, the loading ones have not."""
    pods = []
    for value in [*ready, *([None] * loading)]:
        pod = SidecarMetrics("m", "r")
        if value is not None:
            pod.kv_now.set(value)
        pods.append(pod)
    return pods


def prometheus_avg(pods: list[SidecarMetrics]) -> float | None:
    """`avg by (model, region) (fleetwarden_kv_cache_utilization)` over every pod's scrape."""
    values = [
        sample.value
        for pod in pods
        for family in text_string_to_metric_families(b"".join(pod.exposition_slices()).decode())
        if family.name == names.KV_CACHE_UTILIZATION
        for sample in family.samples
    ]
    return sum(values) / len(values) if values else None


@pytest.mark.parametrize(
    ("ready", "loading", "out", "in_", "step", "reason"),
    [
        # A hot region stays hot while one pod loads: add one (was 0.534 -> hold).
        ([0.95, 0.95, 0.95], 1, 0.7125, 0.95, 1, DecisionReason.UTILISATION_HIGH),
        # A ready pod at 50 %: hold (was 0.25 -> remove an instance, the loading one).
        ([0.50], 1, 0.25, 0.50, 0, DecisionReason.IN_BAND),
        # Nothing loading: unchanged.
        ([0.20, 0.40], 0, 0.30, 0.30, 0, DecisionReason.IN_BAND),
    ],
)
def test_starting_pods_are_discounted_once_on_scale_out_and_not_on_scale_in(
    ready: list[float],
    loading: int,
    out: float,
    in_: float,
    step: int,
    reason: DecisionReason,
) -> None:
    current = len(ready) + loading
    signal = ScalingSignal(
        0.0, current, current, utilisation=prometheus_avg(region(ready, loading)), starting=loading
    )
    assert signal.scale_out_utilisation == pytest.approx(out)
    assert signal.usable_utilisation == pytest.approx(in_)
    decision = ReactiveScaler(CONFIG).decide(signal)
    assert (decision.step, decision.reason) == (step, reason)


def test_a_region_with_every_pod_loading_has_no_utilisation() -> None:
    """No pod has measured anything: the query is empty and the scaler holds, it never reads
    the loading pods as idle and removes them."""
    utilisation = prometheus_avg(region([], 2))
    assert utilisation is None
    decision = ReactiveScaler(CONFIG).decide(ScalingSignal(0.0, 2, 2, utilisation, starting=2))
    assert decision.reason is DecisionReason.MISSING_UTILISATION


def test_niw_is_not_released_onto_hot_pods_while_others_load() -> None:
    """1 ready pod at 0.92 and 2 loading: the shared-target signal is 0.92, which releases
    nothing (was 0.307, which released 2 items per signal)."""
    utilisation = prometheus_avg(region([0.92], 2))
    assert utilisation == pytest.approx(0.92)
    assert release_plan(TargetKind.SHARED, ReleaseRule(), utilisation, 32).by_deadline == 0
