"""Run one workload under several scaling strategies, in parallel worker processes.

Why processes: a request-level run is single-threaded Python, so the only way to use a second
core is a second process. Each run is a pure function of (fleet, workload spec, strategy, seed):
a worker loads the fleet from its YAML and regenerates the workload from its (picklable,
seeded) spec rather than receiving millions of requests through a pipe, and returns the run's
deterministic JSON. The number of processes therefore changes only the wall time, never a byte
of the results.

Strategies: `reactive`, `lt-i`, `lt-u`, `lt-ua` override every ModelDeployment's
`scaling.strategy` (SageServe 6.4); `static` pins every endpoint at its `maxInstances` with no
scaling at all: the cost of not autoscaling. A pool that cannot hold every endpoint's
`maxInstances` gets what fits, in the operator's first-come order (`static_capacity`), and the
run's `meta.capacityShortfalls` says which endpoints got fewer.

Every strategy plans at the operator's period (the fleet's shortest `horizonSeconds`,
`plan_period`); SageServe's spot donation, which the operator does not implement, runs only when
the spec asks for it (`RunSpec.spot_donation`).

Fidelities: `request` (`fleetwarden.sim.cluster.simulate`, every request an event) and `fluid`
(`fleetwarden.sim.fluid.simulate_fluid`, per-step token aggregates); a worker rebuilds the fluid
rate model from the same seeded spec (`fluid_rates.rate_model_for`: the built-in and ServeGen
specs are read as rates, a trace is binned), so either fidelity stays a pure function of its
inputs.

Planners: `last-hour-peak` (`fleetwarden.sim.planning.LastHourPeakPlanner`) and `forecast`
(`fleetwarden.sim.forecast_planner.ForecastPlanner`, the operator's forecaster and ILP; imported
only when chosen, and the default when the module is installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import multiprocessing
import queue
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.sim.fleet_spec import Fleet, load_fleet
from fleetwarden.sim.plan_period import plan_period_s
from fleetwarden.sim.planning import HourlyPlanner, LastHourPeakPlanner
from fleetwarden.sim.static_capacity import static_placement
from fleetwarden.sim.workload import Workload

if TYPE_CHECKING:
    from fleetwarden.sim.results import SimResults

STRATEGIES = ("reactive", "lt-i", "lt-u", "lt-ua", "static")
DEFAULT_STRATEGIES = ("reactive", "lt-i", "lt-u", "lt-ua")
PLANNERS = ("last-hour-peak", "forecast")
FIDELITIES = ("request", "fluid")
FLUID_STEP_S = 60.0
"""The fluid step: the built-in workload's slot and the planner's series step."""
PROGRESS_EVERY_S = 600.0
"""Workers report simulated time at most once per this many simulated seconds."""

Progress = Callable[[str, float, float], None]
"""(strategy, simulated time, end time)."""


class RunError(ValueError):
    """A run cannot start: unknown strategy or planner, or the planner is not installed."""


class WorkloadSource(Protocol):
    """A picklable, seeded workload spec: `BuiltinWorkload`, `ServeGenWorkload`, `TraceWorkload`."""

    def build(self, fleet: Fleet) -> Workload: ...


@dataclass(frozen=True)
class RunSpec:
    """Everything a worker needs to reproduce one run, apart from the strategy."""

    fleet_paths: tuple[Path, ...]
    workload: WorkloadSource
    duration_s: float
    seed: int = 0
    planner: str = "last-hour-peak"
    fidelity: str = "request"
    refit_s: float = 86_400.0
    """`forecast` planner: simulated seconds between fresh ARIMA fits (forecasting/warm.py)."""
    theta_load: float = 1.0
    """Share of saturation the declared tokens/s per instance stands for (`fleet_profiles`)."""
    spot_donation: bool = False
    """SageServe's spot donation, not implemented by the operator (`sim.spot_donation`)."""


def default_planner() -> str:
    """`forecast` once `fleetwarden.sim.forecast_planner` exists, else `last-hour-peak`."""
    found = importlib.util.find_spec("fleetwarden.sim.forecast_planner") is not None
    return "forecast" if found else "last-hour-peak"


def make_planner(name: str, refit_s: float = 86_400.0) -> HourlyPlanner:
    """The planner called at every period start (lazy import: it may not be installed yet)."""
    if name == "last-hour-peak":
        return LastHourPeakPlanner()
    if name == "forecast":
        try:
            module = importlib.import_module("fleetwarden.sim.forecast_planner")
        except ImportError as exc:
            raise RunError(f"planner 'forecast' is not available: {exc}") from exc
        planner: HourlyPlanner = module.ForecastPlanner(refit_every_s=refit_s)
        return planner
    raise RunError(f"unknown planner {name!r} (choose from {', '.join(PLANNERS)})")


def check_strategies(names: Sequence[str]) -> tuple[str, ...]:
    """Validated, de-duplicated strategy names in the order given."""
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise RunError(f"unknown strategies {unknown} (choose from {', '.join(STRATEGIES)})")
    if not names:
        raise RunError("no strategy given")
    return tuple(dict.fromkeys(names))


def instance_sizing(
    fleet: Fleet, peak_instances: Mapping[str, float]
) -> dict[str, dict[str, float]]:
    """Peak interactive tokens/s per served model and region: `peak_instances[model]` (or
    `["*"]`) instances' worth of the model's declared throughput in that region.

    The built-in default (60% of capacity at maxInstances) is millions of requests a day for the
    example fleet; sizing by instances states the demand in the unit scaling decisions are
    made in, so a small run still has peaks that need several instances.
    """
    sizing: dict[str, dict[str, float]] = {}
    for model in fleet.models.values():
        count = peak_instances.get(model.served_name, peak_instances.get("*"))
        if count is None:
            continue
        regions = sizing.setdefault(model.served_name, {})
        for region in model.regions:
            pools = [p for p in model.placements if p.region == region]
            mean_tps = sum(p.throughput_tps for p in pools) / len(pools)
            regions[region] = count * mean_tps
    unknown = set(peak_instances) - {"*"} - {m.served_name for m in fleet.models.values()}
    if unknown:
        raise RunError(f"--peak-instances names models the fleet lacks: {sorted(unknown)}")
    return sizing


def options_for(spec: RunSpec, strategy: str, fleet: Fleet, progress: Any = None) -> Any:
    """The `SimOptions` of one strategy (typed Any: cluster is imported lazily by workers)."""
    from fleetwarden.sim.cluster import SimOptions

    common: dict[str, Any] = {
        "duration_s": spec.duration_s,
        "seed": spec.seed,
        "planner": make_planner(spec.planner, spec.refit_s),
        "theta_load": spec.theta_load,
        "progress": progress,
        "period_s": plan_period_s(fleet),
        "spot_donation": spec.spot_donation,
    }
    if strategy == "static":
        pinned = static_placement(fleet).instances
        return SimOptions(scaling=False, initial_instances=pinned, **common)
    return SimOptions(strategy=ScalingStrategy(strategy), **common)


def _annotated(results: SimResults, strategy: str, fleet: Fleet) -> str:
    """The run's JSON, with what the results alone do not say: a `static` run's endpoints pinned
    below `maxInstances` for lack of pool capacity (empty for the scaling strategies)."""
    shortfalls = static_placement(fleet).shortfalls if strategy == "static" else ()
    results.meta["capacityShortfalls"] = list(shortfalls)
    return results.to_json()


def run_one(spec: RunSpec, strategy: str, progress: Progress | None = None) -> str:
    """One strategy's run in the spec's fidelity; its results as deterministic JSON."""
    fleet = load_fleet(list(spec.fleet_paths))
    last = [-math.inf]

    def tick(now: float, end: float) -> None:
        if progress is not None and (now - last[0] >= PROGRESS_EVERY_S or now >= end):
            last[0] = now
            progress(strategy, now, end)

    options = options_for(spec, strategy, fleet, tick)
    if spec.fidelity == "fluid":
        from fleetwarden.sim.fluid import simulate_fluid
        from fleetwarden.sim.fluid_rates import rate_model_for

        rates = rate_model_for(spec.workload, fleet, FLUID_STEP_S)
        return _annotated(simulate_fluid(fleet, rates, options, FLUID_STEP_S), strategy, fleet)
    from fleetwarden.sim.cluster import simulate

    return _annotated(simulate(fleet, spec.workload.build(fleet), options), strategy, fleet)


# -- worker processes ----------------------------------------------------------------------------

_QUEUE: Any = None


def _init_worker(progress_queue: Any) -> None:
    global _QUEUE
    _QUEUE = progress_queue


def _report(strategy: str, now: float, end: float) -> None:
    if _QUEUE is not None:
        _QUEUE.put((strategy, now, end))


def _worker(spec: RunSpec, strategy: str) -> str:
    return run_one(spec, strategy, _report)


def run_strategies(
    spec: RunSpec,
    strategies: Sequence[str],
    *,
    jobs: int = 1,
    progress: Progress | None = None,
) -> dict[str, str]:
    """Every strategy's results JSON, keyed in the order given; `jobs` > 1 runs them in that
    many spawned processes (spawn, not fork: the parent may be running a progress thread)."""
    names = check_strategies(strategies)
    make_planner(spec.planner)  # fail here, not in a worker
    if spec.fidelity not in FIDELITIES:
        raise RunError(f"unknown fidelity {spec.fidelity!r} (choose from {', '.join(FIDELITIES)})")
    if jobs <= 1 or len(names) == 1:
        return {name: run_one(spec, name, progress) for name in names}
    context = multiprocessing.get_context("spawn")
    updates = context.Queue()
    done: dict[str, str] = {}
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(names)),
        mp_context=context,
        initializer=_init_worker,
        initargs=(updates,),
    ) as pool:
        pending: dict[Future[str], str] = {pool.submit(_worker, spec, n): n for n in names}
        while pending:
            finished, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            _drain(updates, progress)
            for future in finished:
                done[pending.pop(future)] = future.result()
        _drain(updates, progress)
    return {name: done[name] for name in names}


def _drain(updates: Any, progress: Progress | None) -> None:
    while True:
        try:
            strategy, now, end = updates.get_nowait()
        except queue.Empty:
            return
        if progress is not None:
            progress(strategy, now, end)
