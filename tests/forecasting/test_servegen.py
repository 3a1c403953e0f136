"""Model-level series from the ServeGen traces (the backtest on them: test_servegen_backtest.py).

Needs `../shared/data/servegen/` (never copied into the repository); skipped when it is absent.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from fleetwarden.forecasting import servegen

pytestmark = pytest.mark.skipif(
    not servegen.available(),
    reason=f"ServeGen data not found at {servegen.DEFAULT_ROOT} (../shared/data/servegen)",
)


def _upstream_hourly(model: str) -> dict[int, tuple[float, int]]:
    """hour -> (mean req/s, gap windows) from ServeGen's own hourly summary."""
    rows: dict[int, tuple[float, int]] = {}
    with (servegen.DEFAULT_ROOT / "servegen_model_hourly.csv").open() as handle:
        for row in csv.DictReader(handle):
            if row["model"] == model:
                mean = float(row["mean_rps"]) if row["mean_rps"] else math.nan
                rows[int(row["hour"])] = (mean, int(row["gap_windows"]))
    return rows


@pytest.mark.parametrize("model", servegen.LANGUAGE_MODELS)
def test_model_series_sums_clients_and_marks_upstream_gaps(model: str) -> None:
    loaded = servegen.load_model_series(model)
    series = loaded.series
    assert series.step_s == 600.0
    assert len(series.values) == 1440  # 10 days of 10-minute windows
    hourly = series.as_array().reshape(-1, 6)
    upstream = _upstream_hourly(model)
    # The gaps are exactly the windows ServeGen's own summary counts as gaps.
    gaps_per_hour = np.isnan(hourly).sum(axis=1)
    assert loaded.gap_windows == sum(g for _, g in upstream.values())
    assert [int(g) for g in gaps_per_hour] == [upstream[h][1] for h in range(240)]
    # Hours without gaps average to the summary's mean rate.
    for hour in (0, 100, 239):
        mean, gaps = upstream[hour]
        if gaps == 0:
            assert hourly[hour].mean() == pytest.approx(mean, rel=1e-9)


def test_tokens_per_second_has_the_same_gaps_and_plausible_lengths() -> None:
    requests = servegen.load_model_series("m-small").series.as_array()
    tokens = servegen.load_model_series("m-small", servegen.Unit.TOKENS_PER_S).series.as_array()
    assert np.array_equal(np.isnan(requests), np.isnan(tokens))
    per_request = tokens[~np.isnan(tokens)] / requests[~np.isnan(requests)]
    # Chat-style requests: tens to thousands of tokens each (input + output).
    assert 10 < float(np.median(per_request)) < 10_000


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(servegen.ServeGenError, match="m-large"):
        servegen.load_model_series("m-huge")
