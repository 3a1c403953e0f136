"""The forecaster against both baselines on a day of real ServeGen load.

The full study (docs/forecasting.md, 166 to 192 hours on each of six series) is the evidence that
the default beats persistence and seasonal naive; it takes minutes per series. This test replays one
day of it as a regression guard: the 24 hourly origins of day 8 of m-small requests/s, a whole
diurnal cycle. Over that day the full run scored ARIMA at 4.3 % MAPE against 10.6 % (persistence)
and 7.0 % (seasonal naive), under-forecasting in 11 hours against 16 and 18: a margin wide enough
that BLAS or optimiser noise cannot flip the outcome, so a failure here means the model got worse.
Day 9 is not used: a burst of batch traffic makes every forecaster miss by 20-30 % there (see the
docs), which is a fine thing to report and a poor thing to assert on.

The data is read in place from `../shared/data/servegen` next to the repository, resolved from this
file, and never copied into the repository; the test skips when the folder is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwarden.forecasting import servegen
from fleetwarden.forecasting.backtest import backtest

SERVEGEN = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "servegen"
HOUR_S = 3600.0
SLICE_END_H = 9 * 24
"""The slice ends at the start of day 9 (0-based), so its last origin is 23:00 of day 8."""
SLICE_HOURS = 24

pytestmark = pytest.mark.skipif(
    not servegen.available(SERVEGEN),
    reason=f"ServeGen data not found at {SERVEGEN} (../shared/data/servegen from the repo root)",
)


def test_arima_beats_both_baselines_on_a_day_of_m_small() -> None:
    series = servegen.load_model_series("m-small", root=SERVEGEN).series
    # Cutting the series at the slice's end changes nothing before it: every origin still sees
    # exactly the history it saw in the full run (everything before it, nothing after).
    day = series.until(series.start_s + SLICE_END_H * HOUR_S)
    result = backtest(day, max_hours=SLICE_HOURS)

    assert result.hours_evaluated == SLICE_HOURS
    assert result.hours[0].origin_s == series.start_s + (SLICE_END_H - SLICE_HOURS) * HOUR_S
    assert result.models == {"arima": SLICE_HOURS}
    f, p, s = result.forecast, result.persistence, result.seasonal_naive
    assert f.mape_pct < min(p.mape_pct, s.mape_pct)
    assert f.under_forecast_rate_pct <= min(p.under_forecast_rate_pct, s.under_forecast_rate_pct)
    assert result.beats_baselines
