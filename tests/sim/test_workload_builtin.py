"""The built-in workload matches its parameters, and its figures match the traces they come from."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.sim.workload import SimRequest, zipf_shares
from fleetwarden.sim.workload_builtin import (
    DEFAULT_APPS,
    HOUR_FACTORS,
    WEEKEND_FACTOR,
    ZIPF_EXPONENT,
    BuiltinWorkload,
    Burst,
)
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
UNIFIED = DATA / "unified"
needs_data = pytest.mark.skipif(
    not (UNIFIED / "ragpulse.parquet").is_file(),
    reason="../shared/data/unified not present (the figures are re-derived from it)",
)
DAY = 86_400.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return write_fleet(tmp_path_factory.mktemp("fleet"), pool_yaml(), model_yaml())


def _generate(fleet, **params) -> list[SimRequest]:  # type: ignore[no-untyped-def]
    params.setdefault("peak_tps", {"org/m": {"region-a": 2375.0 * 2}})
    return list(BuiltinWorkload(**params).build(fleet))


def _expected_iw(spec: BuiltinWorkload, rate_at_peak: float, start: float, end: float) -> float:
    peak = spec.peak_cycle()
    grid = np.arange(start, end, 10.0) + 5.0
    return sum(rate_at_peak / peak * spec.cycle(float(t), "region-a") * 10.0 for t in grid)


def test_interactive_arrivals_follow_the_cycles(fleet) -> None:  # type: ignore[no-untyped-def]
    spec = BuiltinWorkload(duration_s=7 * DAY, seed=1, peak_tps={"org/m": {"region-a": 475.0}})
    requests = list(spec.build(fleet))
    peak_rate = spec.peak_rates(fleet)["org/m", "region-a"]
    iw = [r for r in requests if r.tier is not Tier.NIW]
    assert len(iw) == pytest.approx(_expected_iw(spec, peak_rate, 0, 7 * DAY), rel=0.02)
    by_day = np.bincount([int(r.arrival_s // DAY) for r in iw], minlength=7)
    assert by_day[5:].mean() / by_day[:5].mean() == pytest.approx(WEEKEND_FACTOR, abs=0.03)
    by_hour = np.bincount([int(r.arrival_s % DAY // 3600) for r in iw], minlength=24)
    expected = [
        sum(
            _expected_iw(spec, peak_rate, d * DAY + h * 3600, d * DAY + (h + 1) * 3600)
            for d in range(7)
        )
        for h in range(24)
    ]
    assert np.corrcoef(by_hour, expected)[0, 1] > 0.99
    # NIW is flat and 28% of the week's requests
    niw = [r for r in requests if r.tier is Tier.NIW]
    assert len(niw) / len(requests) == pytest.approx(0.28, abs=0.01)
    niw_days = np.bincount([int(r.arrival_s // DAY) for r in niw], minlength=7)
    assert niw_days.std() / niw_days.mean() < 0.05


def test_lengths_tenants_and_tiers_match_their_distributions(fleet) -> None:  # type: ignore[no-untyped-def]
    requests = _generate(
        fleet,
        duration_s=6 * 3600,
        seed=2,
        start_hour=10,
        peak_tps={"org/m": {"region-a": 12_000.0}},
    )
    for name, app in DEFAULT_APPS.items():
        mine = [r for r in requests if r.app == name]
        assert len(mine) / len(requests) == pytest.approx(app.share, abs=0.01)
        for lengths, dist in (
            ([r.input_tokens for r in mine], app.input),
            ([r.output_tokens for r in mine], app.output),
        ):
            assert np.percentile(lengths, 50) == pytest.approx(dist.p50, rel=0.05)
            assert np.percentile(lengths, 99) == pytest.approx(dist.p99, rel=0.12)
    shares = zipf_shares(20, ZIPF_EXPONENT)
    counts = Counter(r.tenant for r in requests)
    assert counts["tenant-00"] / len(requests) == pytest.approx(shares[0], abs=0.01)
    assert counts["tenant-19"] / len(requests) == pytest.approx(shares[19], abs=0.005)
    tiers = Counter(r.tier for r in requests)
    assert tiers[Tier.IW_FAST] / (tiers[Tier.IW_FAST] + tiers[Tier.IW_NORMAL]) == pytest.approx(
        0.42 / 0.72, abs=0.01
    )


def test_seeded_and_independent_of_the_run_length(fleet) -> None:  # type: ignore[no-untyped-def]
    short = _generate(fleet, duration_s=2 * 3600, seed=5)
    long = _generate(fleet, duration_s=5 * 3600, seed=5)
    assert short == long[: len(short)]
    assert short != _generate(fleet, duration_s=2 * 3600, seed=6)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(long))


def test_bursts_multiply_the_interactive_rate(fleet) -> None:  # type: ignore[no-untyped-def]
    burst = Burst(start_s=3600, duration_s=3600, factor=4.0)
    flat = {"diurnal_depth": 0.0, "duration_s": 2 * 3600.0, "seed": 3}
    requests = _generate(fleet, bursts=(burst,), **flat)
    iw = Counter(int(r.arrival_s // 3600) for r in requests if r.tier is not Tier.NIW)
    assert iw[1] / iw[0] == pytest.approx(4.0, rel=0.08)


def test_regions_get_traffic_by_capacity(tmp_path: Path) -> None:
    fleet = write_fleet(
        tmp_path,
        pool_yaml("pool-a", "region-a"),
        pool_yaml("pool-b", "region-b"),
        model_yaml(regions=(("pool-a", 1, 8), ("pool-b", 1, 2))),
    )
    requests = list(BuiltinWorkload(duration_s=3600, rate_scale=0.2, start_hour=12).build(fleet))
    regions = Counter(r.region for r in requests)
    assert regions["region-a"] / regions["region-b"] == pytest.approx(4.0, rel=0.1)


@needs_data
def test_daily_and_weekly_cycles_are_ragpulses() -> None:
    import pyarrow.parquet as pq

    arrivals = np.array(
        pq.read_table(UNIFIED / "ragpulse.parquet").column("arrival_s"), dtype=float
    )
    local = arrivals + 12 * 3600 + 116  # first request: 12:01:56 local (UTC+8), a Wednesday
    counts = np.bincount((local % DAY // 3600).astype(int), minlength=24)
    assert np.allclose(counts / counts.mean(), HOUR_FACTORS, atol=0.002)
    days = np.bincount((local // DAY).astype(int))
    weekday_of = [(2 + d) % 7 for d in range(len(days))]  # day 0 is Wednesday
    per_weekday = np.zeros(7)
    for count, weekday in zip(days, weekday_of, strict=True):
        per_weekday[weekday] += count  # the two half Wednesdays add up to one day
    assert per_weekday[5:].mean() / per_weekday[:5].mean() == pytest.approx(
        WEEKEND_FACTOR, abs=0.01
    )


@needs_data
@pytest.mark.parametrize(
    ("source", "app"),
    [("azure2023_conv", "chat"), ("azure2023_code", "code"), ("ragpulse", "rag")],
)
def test_length_figures_are_the_traces_percentiles(source: str, app: str) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(UNIFIED / f"{source}.parquet")
    profile = DEFAULT_APPS[app]
    for column, dist in (("input_tokens", profile.input), ("output_tokens", profile.output)):
        values = np.array(table.column(column))
        assert np.percentile(values, 50) == pytest.approx(dist.p50, rel=0.01)
        assert np.percentile(values, 99) == pytest.approx(dist.p99, rel=0.01)


@needs_data
def test_tenant_skew_is_servegens() -> None:
    import pyarrow.parquet as pq

    path = DATA / "servegen" / "servegen_client_rates_10min.parquet"
    slopes = []
    for model in ("m-large", "m-mid"):
        table = pq.read_table(
            path, columns=["client_id", "rate_rps"], filters=[("model", "=", model)]
        )
        totals: Counter[int] = Counter()
        for client, rate in zip(
            table.column("client_id").to_pylist(), table.column("rate_rps").to_pylist(), strict=True
        ):
            if rate is not None and not math.isnan(rate):
                totals[client] += rate
        shares = np.array(sorted(totals.values(), reverse=True)[:50]) / sum(totals.values())
        slopes.append(-np.polyfit(np.log(np.arange(1, 51)), np.log(shares), 1)[0])
    assert np.mean(slopes) == pytest.approx(ZIPF_EXPONENT, abs=0.05)
