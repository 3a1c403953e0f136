"""ServeGen regeneration: inter-arrival shapes, rates and lengths match the released statistics."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from fleetwarden.forecasting import servegen as sg
from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.servegen_workload import ServeGenWorkload, Window, arrivals, available, gaps
from fleetwarden.sim.workload import QuantileLength, SimRequest, WorkloadError
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

needs_data = pytest.mark.skipif(
    not available(), reason="ServeGen data (../shared/data/servegen) not present"
)


@pytest.mark.parametrize(("pattern", "p1"), [("Gamma", 0.25), ("Weibull", 0.6), ("", 0.0)])
def test_gaps_keep_the_shape_and_have_the_released_mean(pattern: str, p1: float) -> None:
    rng = np.random.default_rng(1)
    window = Window(client=1, t_s=0, rate=2.0, pattern=pattern, p1=p1, p2=123.0)
    drawn = gaps(rng, window, 2.0, 400_000)
    assert drawn.mean() == pytest.approx(0.5, rel=0.02)
    if pattern == "Gamma":
        expected_cv = 1 / math.sqrt(p1)
    elif pattern == "Weibull":
        expected_cv = math.sqrt(math.gamma(1 + 2 / p1) / math.gamma(1 + 1 / p1) ** 2 - 1)
    else:
        expected_cv = 1.0
    assert drawn.std() / drawn.mean() == pytest.approx(expected_cv, rel=0.05)


def test_arrivals_in_a_window_count_rate_times_length() -> None:
    rng = np.random.default_rng(2)
    window = Window(client=1, t_s=0, rate=0.5, pattern="Gamma", p1=0.3, p2=0.0)
    counts = [arrivals(rng, window, 0.5, 600.0).size for _ in range(800)]
    assert np.mean(counts) == pytest.approx(300, rel=0.03)
    assert all(0 <= t < 600 for t in arrivals(rng, window, 0.5, 600.0))


def test_quantile_lengths_reproduce_their_quantiles() -> None:
    lengths = QuantileLength(p50=200, p90=900, p99=3000, max=6000)
    drawn = lengths.sample(np.random.default_rng(3), 200_000)
    assert np.percentile(drawn, 50) == pytest.approx(200, rel=0.02)
    assert np.percentile(drawn, 90) == pytest.approx(900, rel=0.02)
    assert np.percentile(drawn, 99) == pytest.approx(3000, rel=0.03)
    assert drawn.max() <= 6000


def test_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    fleet = write_fleet(tmp_path / "fleet", pool_yaml(), model_yaml())
    with pytest.raises(WorkloadError, match="ServeGen data not found"):
        ServeGenWorkload(root=tmp_path).build(fleet)


@cache
def _fleet() -> Fleet:
    import tempfile

    directory = Path(tempfile.mkdtemp())
    return write_fleet(
        directory,
        pool_yaml("pool-a", "region-a"),
        pool_yaml("pool-b", "region-b"),
        model_yaml("large", regions=(("pool-a", 1, 4), ("pool-b", 1, 4))),
        model_yaml("mid", regions=(("pool-a", 1, 4),)),
    )


@cache
def _regenerated(seed: int = 0) -> tuple[SimRequest, ...]:
    spec = ServeGenWorkload(
        models={"m-large": "org/large"},
        duration_s=2 * 3600,
        start_s=12 * 3600,
        fraction=0.05,
        seed=seed,
    )
    return tuple(spec.build(_fleet()))


@needs_data
def test_per_client_rates_match_the_released_rates() -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(
        sg.DEFAULT_ROOT / sg.RATES_FILE,
        columns=["client_id", "t_s", "rate_rps"],
        filters=[("model", "=", "m-large"), ("t_s", ">=", 12 * 3600), ("t_s", "<", 14 * 3600)],
    )
    expected: Counter[str] = Counter()
    for client, rate in zip(
        table.column("client_id").to_pylist(), table.column("rate_rps").to_pylist(), strict=True
    ):
        if rate and rate > 0:
            expected[f"client-{client}"] += rate * sg.WINDOW_S * 0.05
    got = Counter(r.tenant for r in _regenerated())
    assert sum(got.values()) == pytest.approx(sum(expected.values()), rel=0.03)
    for tenant, count in expected.most_common(5):
        assert got[tenant] == pytest.approx(count, rel=0.12), tenant


@needs_data
def test_lengths_follow_each_clients_statistics() -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(
        sg.DEFAULT_ROOT / sg.TOKENS_FILE,
        filters=[("model", "=", "m-large"), ("t_s", "=", 43200), ("field", "=", "input_tokens")],
    ).to_pylist()
    got = Counter(r.tenant for r in _regenerated())
    stats = max(table, key=lambda row: got[f"client-{row['client_id']}"])
    inputs = [r.input_tokens for r in _regenerated() if r.tenant == f"client-{stats['client_id']}"]
    assert len(inputs) > 2000
    assert np.percentile(inputs, 50) == pytest.approx(stats["p50"], rel=0.05)
    assert np.percentile(inputs, 90) == pytest.approx(stats["p90"], rel=0.08)


@needs_data
def test_regeneration_is_seeded_and_places_clients_stably() -> None:
    first, again, other = _regenerated(0), _regenerated(0), _regenerated(1)
    assert first == again
    assert first != other
    placement = {r.tenant: (r.region, r.tier) for r in first}
    assert all(placement[r.tenant] == (r.region, r.tier) for r in other if r.tenant in placement)
    assert {r.region for r in first} == {"region-a", "region-b"}
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(first))


@needs_data
def test_collection_gaps_are_filled_from_the_day_before() -> None:
    series = sg.load_model_series("m-mid").series
    gap = next(i for i, v in enumerate(series.values) if not math.isfinite(v) and i * 600 >= 86400)
    start = series.start_s + gap * series.step_s
    spec = ServeGenWorkload(
        models={"m-mid": "org/mid"}, start_s=start, duration_s=600, fraction=0.001
    )
    assert len(list(spec.build(_fleet()))) > 50
