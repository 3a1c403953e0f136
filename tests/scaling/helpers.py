"""Builders shared by the scaling tests: a config with SageServe's defaults and a signal maker."""

from __future__ import annotations

from fleetwarden.scaling import ScalingConfig, ScalingSignal

HOUR_S = 3600.0
T0 = 1_800_000_000.0
"""A whole hour since the epoch, so `T0 + m * 60` is minute m of an hour."""

CONFIG = ScalingConfig(min_instances=2, max_instances=10)


def signal(
    *,
    minute: float = 5.0,
    current: int = 5,
    target: int = 5,
    utilisation: float | None = 0.5,
    observed: float | None = None,
    forecast: float | None = None,
    starting: int = 0,
) -> ScalingSignal:
    """A signal at `minute` into the hour starting at T0."""
    return ScalingSignal(
        now_s=T0 + 60.0 * minute,
        current=current,
        target=target,
        utilisation=utilisation,
        observed_load_tps=observed,
        forecast_load_tps=forecast,
        starting=starting,
    )
