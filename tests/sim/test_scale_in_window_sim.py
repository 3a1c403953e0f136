"""The scale-in stabilisation window end to end: `spec.scaling.scaleInStabilizationSeconds` in the
example fleet's YAML reaches the simulator's scalers (through `ScalingConfig.from_settings`, as in
the operator) and damps the reactive baseline's flapping.

Two hours of the built-in workload at a rate where reactive scaling adds and removes instances
again and again; the same run with a 5-minute window removes, and so reloads, far less.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.scaling import ScalingConfig
from fleetwarden.sim.cluster import FleetSimulation, SimOptions, simulate
from fleetwarden.sim.fleet_spec import Fleet, load_fleet
from fleetwarden.sim.results import SimResults
from fleetwarden.sim.workload import SimRequest
from fleetwarden.sim.workload_builtin import BuiltinWorkload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HOURS = 2
MODELS = "20-modeldeployments.yaml"


def _fleet(directory: Path, window_s: int | None) -> Fleet:
    """The example fleet, with `scaleInStabilizationSeconds` set in every ModelDeployment."""
    directory.mkdir()
    for path in EXAMPLES.glob("*.yaml"):
        text = path.read_text()
        if path.name == MODELS and window_s is not None:
            assert text.count("\n  scaling:\n") == 2
            field = f"    scaleInStabilizationSeconds: {window_s}\n"
            text = text.replace("\n  scaling:\n", f"\n  scaling:\n{field}")
        (directory / path.name).write_text(text)
    return load_fleet(directory)


@cache
def _workload() -> tuple[SimRequest, ...]:
    spec = BuiltinWorkload(duration_s=HOURS * 3600, seed=0, rate_scale=0.2, start_hour=7)
    return tuple(spec.build(load_fleet(EXAMPLES)))


def _run(fleet: Fleet) -> SimResults:
    options = SimOptions(duration_s=HOURS * 3600, strategy=ScalingStrategy.REACTIVE)
    return simulate(fleet, _workload(), options)


def _reloads(events: list[list[Any]], within_s: float = 1800.0) -> int:
    """Removals followed by an add on the same endpoint within `within_s`: each costs a load."""
    by_endpoint: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for t, name, step, *_ in events:
        by_endpoint[name].append((t, step))
    count = 0
    for steps in by_endpoint.values():
        for i, (t, step) in enumerate(steps):
            if step < 0 and any(s > 0 and u - t <= within_s for u, s in steps[i + 1 :]):
                count += 1
    return count


def test_the_field_reaches_the_simulators_scalers(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path / "w300", 300)
    options = SimOptions(duration_s=60.0, strategy=ScalingStrategy.REACTIVE)
    endpoints = FleetSimulation(fleet, (), options).endpoints
    assert len(endpoints) == 5
    for (model_key, pool), endpoint in endpoints.items():
        model = fleet.models[model_key]
        assert model.spec.scaling.scale_in_stabilization_seconds == 300
        assert endpoint.scaler is not None
        # the operator's builder, called as the operator calls it
        expected = ScalingConfig.from_settings(
            model.spec.scaling,
            min_instances=model.placement(pool).min_instances,
            max_instances=model.placement(pool).max_instances,
            period_s=options.period_s,
            leave_zero_toward_target=True,
        )
        assert endpoint.scaler.config == expected
        assert endpoint.scaler.config.scale_in_stabilisation_s == 300.0


def test_a_window_damps_reactive_flapping(tmp_path: Path) -> None:
    plain = _run(_fleet(tmp_path / "plain", None))
    zero = _run(_fleet(tmp_path / "w0", 0))
    windowed = _run(_fleet(tmp_path / "w300", 300))

    # window 0 is the baseline exactly: the same decisions at the same times
    assert zero.series["events"] == plain.series["events"]
    assert zero.totals == plain.totals

    base, damped = plain.totals, windowed.totals
    # the baseline flaps: it removes instances it re-adds soon after
    assert base["scale_in"] >= 10
    assert _reloads(plain.series["events"]) >= 5
    # the window removes, and so re-launches, far less
    assert damped["scale_in"] * 2 <= base["scale_in"]
    assert damped["launches"] < base["launches"]
    assert _reloads(windowed.series["events"]) < _reloads(plain.series["events"])
    # it only delays removals: it serves at least as much of the workload
    assert damped["completed"] >= base["completed"]
    # scale-out is never what the window holds back: every removal waited, no add did
    reasons = {event[3] for event in windowed.series["events"] if event[2] < 0}
    assert reasons <= {"utilisation-low", "above-max"}
