"""`fleetwarden simulate`: replay a workload through the fleet under several scaling strategies
and write a comparison report (docs/simulator.md)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_FLEET = Path("examples")
SERVEGEN_FRACTION = 0.01
"""ServeGen's default sampling fraction; `--rate-scale` multiplies it."""
MAX_HOURS = 366 * 24.0
"""The longest `--hours`: a (leap) year; even a fluid run of that takes CPU-hours."""


class UsageError(ValueError):
    """Bad command-line input; reported in one line with exit code 2."""


def parse_peak_instances(text: str) -> dict[str, float]:
    """`1.5` (every model) or `llama-3-70b=1.5,mistral-7b=0.1` (per served model)."""
    from fleetwarden.sim.input_values import InputValueError, finite_number

    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().rpartition("=")
        try:
            float(value)
        except ValueError:
            raise UsageError(f"--peak-instances: {part!r} is not MODEL=COUNT or COUNT") from None
        try:  # `float` reads "inf" and "nan": numpy's Poisson draw later fails on either
            count = finite_number(value, above=True)
        except InputValueError as exc:
            raise UsageError(f"--peak-instances: {part!r}: COUNT {exc}") from None
        out[name if sep else "*"] = count
    return out


def _check_flags(args: argparse.Namespace) -> None:
    """Every number finite and in range, and no trace-only flag without --trace, before the
    fleet is read: NaN and infinity pass plain comparisons (`--hours inf` was an OverflowError,
    `--rate-scale nan` numpy's "lam value too large"), and trace-only flags were ignored."""
    from fleetwarden.sim.input_values import InputValueError, finite_number, whole_number

    checks: list[tuple[str, Callable[[], object]]] = [
        ("--hours", lambda: finite_number(args.hours, above=True)),
        ("--refit-hours", lambda: finite_number(args.refit_hours)),
        ("--rate-scale", lambda: finite_number(args.rate_scale)),
        ("--seed", lambda: whole_number(args.seed, minimum=0)),
    ]
    for flag, check in checks:
        try:
            check()
        except InputValueError as exc:
            raise UsageError(f"{flag} {exc}") from None
    if args.hours > MAX_HOURS:
        raise UsageError(f"--hours must be at most {MAX_HOURS:g} (366 days), got {args.hours:g}")
    trace_only = [
        flag
        for flag, value, default in (
            ("--trace-model", args.trace_model, None),
            ("--speedup", args.speedup, 1.0),
            ("--repeat", args.repeat, 1),
        )
        if value != default  # NaN included
    ]
    if trace_only and args.trace is None:
        verb = "applies" if len(trace_only) == 1 else "apply"
        raise UsageError(f"{', '.join(trace_only)} {verb} to --trace only")


def _check_volume(args: argparse.Namespace, spec: Any, fleet: Any) -> None:
    """Refuse a request-level built-in run whose request count (estimated before any is drawn)
    is over the workload's caps, naming the flags that set it: `--peak-instances 1e9` was a
    330 GiB allocation. Fluid runs draw no request and are not capped."""
    from fleetwarden.sim.workload_builtin import VolumeError

    if args.fidelity != "request":
        return
    try:
        spec.check_volume(spec.peak_rates(fleet))
    except VolumeError as exc:
        rate = [f"--peak-instances {args.peak_instances}"] if args.peak_instances else []
        if args.rate_scale != 1 or not rate:
            rate.append(f"--rate-scale {args.rate_scale:g}")
        flags = " and ".join(rate)
        if exc.per_hour:
            gives, them = ("give", "them") if len(rate) > 1 else ("gives", "it")
            raise UsageError(
                f"{flags} {gives} about {exc.estimate:.3g} requests in the busiest hour, over "
                f"the built-in workload's cap of {exc.cap:,} an hour; lower {them}"
            ) from None
        raise UsageError(
            f"--hours {args.hours:g} at {flags} is about {exc.estimate:.3g} requests, over the "
            f"built-in workload's cap of {exc.cap:,} a run; lower either, or use --fidelity fluid"
        ) from None


def _workload(args: argparse.Namespace, fleet: Any, duration_s: float) -> tuple[Any, str]:
    """The workload spec and the sentence saying what scale it simulates."""
    from fleetwarden.sim.run import WorkloadSource, instance_sizing
    from fleetwarden.sim.servegen_workload import ServeGenWorkload
    from fleetwarden.sim.trace_workload import TraceWorkload
    from fleetwarden.sim.workload_builtin import BuiltinWorkload

    scale = args.rate_scale
    spec: WorkloadSource
    if args.peak_instances and (args.servegen or args.trace):
        raise UsageError("--peak-instances applies to the built-in workload only")
    if args.servegen is not None:
        fraction = SERVEGEN_FRACTION * scale
        if not 0 < fraction <= 1:
            raise UsageError(f"--rate-scale {scale:g} gives a ServeGen fraction outside (0, 1]")
        spec = ServeGenWorkload(
            duration_s=duration_s, fraction=fraction, seed=args.seed, root=args.servegen
        )
        return spec, (
            f"ServeGen regeneration at {fraction:g} of the released per-client rates "
            f"(--rate-scale {scale:g} x {SERVEGEN_FRACTION:g}); region placement is synthetic."
        )
    if args.trace is not None:
        if scale != 1.0:
            raise UsageError("--rate-scale does not apply to --trace (use --speedup)")
        if not (math.isfinite(args.speedup) and args.speedup > 0):  # NaN fails `<= 0` too
            raise UsageError(f"--speedup must be a finite number > 0, got {args.speedup}")
        if args.repeat < 1:
            raise UsageError(f"--repeat must be >= 1, got {args.repeat}")
        model = args.trace_model or next(iter(fleet.models.values())).served_name
        try:
            fleet.model(model)
        except KeyError as exc:  # unknown or ambiguous; the message lists the served names
            raise UsageError(f"--trace-model: {exc.args[0]}") from None
        spec = TraceWorkload(
            path=args.trace,
            model=model,
            speedup=args.speedup,
            repeat=args.repeat,
            duration_s=duration_s,
        )
        return spec, (
            f"Trace {args.trace} replayed as {model} at speed-up {args.speedup:g}, "
            f"{args.repeat} cop{'y' if args.repeat == 1 else 'ies'}; placement is synthetic."
        )
    if args.peak_instances:
        sizing = instance_sizing(fleet, parse_peak_instances(args.peak_instances))
        spec = BuiltinWorkload(
            duration_s=duration_s, seed=args.seed, rate_scale=scale, peak_tps=sizing
        )
        _check_volume(args, spec, fleet)
        return spec, (
            f"Built-in workload sized by instances (--peak-instances {args.peak_instances}, "
            f"rate-scale {scale:g}): peak interactive demand of each model in each region is "
            "that many instances' declared tokens/s, where the default sizing (60% of capacity "
            "at maxInstances) would be millions of requests a day for the example fleet."
        )
    spec = BuiltinWorkload(duration_s=duration_s, seed=args.seed, rate_scale=scale)
    _check_volume(args, spec, fleet)
    return spec, (
        f"Built-in workload at {scale:g} x its default sizing (peak interactive demand at 60% of "
        "each region's capacity at maxInstances)."
    )


def _progress(
    console: Any, strategies: tuple[str, ...], end_s: float
) -> tuple[Any, Callable[..., None]]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description:>8}"),
        BarColumn(),
        TextColumn("{task.fields[hours]:>5.1f} h"),
        TimeRemainingColumn(),
        console=console,
    )
    tasks = {s: bar.add_task(s, total=end_s, hours=0.0) for s in strategies}

    def update(strategy: str, now: float, end: float) -> None:
        bar.update(tasks[strategy], completed=min(now, end), hours=now / 3600)

    return bar, update


def run(args: argparse.Namespace) -> int:
    """Simulate and report; exit 2 with a one-line reason on bad input."""
    # The forecast planner fits ARIMA in every worker process; OpenBLAS threads fighting over the
    # same cores make statsmodels' small matrix operations 5-10x slower (see cli/forecast.py).
    # Set before numpy's first import (the sim modules below); a value already set wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from rich.console import Console
    from rich.table import Table

    from fleetwarden.sim.cluster import SimulationError
    from fleetwarden.sim.fleet_spec import FleetSpecError, load_fleet
    from fleetwarden.sim.report import ReportInputs, write_report
    from fleetwarden.sim.report_html import CLI_COLUMNS, table_rows
    from fleetwarden.sim.run import (
        RunError,
        RunSpec,
        check_strategies,
        default_planner,
        run_strategies,
    )
    from fleetwarden.sim.warmup import with_warmup
    from fleetwarden.sim.workload import WorkloadError

    console = Console(stderr=True)
    try:
        if not args.hours > 0:
            raise UsageError("--hours must be > 0")
        if args.jobs is not None and args.jobs < 1:
            raise UsageError("--jobs must be >= 1")
        if not args.refit_hours >= 0:
            raise UsageError("--refit-hours must be >= 0")
        if not 0 < args.theta_load <= 1:
            raise UsageError("--theta-load must be in (0, 1]")
        _check_flags(args)
        strategies = check_strategies([s.strip() for s in args.strategies.split(",") if s.strip()])
        fleet_paths = tuple(args.fleet or [DEFAULT_FLEET])
        for path in fleet_paths:
            if not path.exists():
                raise UsageError(f"--fleet {path}: no such file or directory")
        fleet = load_fleet(list(fleet_paths))
        duration = args.hours * 3600.0
        spec, scale = _workload(args, fleet, duration)
        spec = with_warmup(spec, args.warmup_days, fleet)  # the planner's history before time 0
        info = spec.build(fleet).info
        planner = args.planner or default_planner()
        run_spec = RunSpec(
            fleet_paths,
            spec,
            duration,
            args.seed,
            planner,
            args.fidelity,
            refit_s=args.refit_hours * 3600.0,
            theta_load=args.theta_load,
            spot_donation=args.spot_donation,
        )
        jobs = args.jobs or min(len(strategies), os.cpu_count() or 1)
        args.out.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        if args.quiet or not console.is_terminal:
            results = run_strategies(run_spec, strategies, jobs=jobs)
        else:
            bar, update = _progress(console, strategies, duration)
            with bar:
                results = run_strategies(run_spec, strategies, jobs=jobs, progress=update)
        wall = time.perf_counter() - started
        inputs = ReportInputs(
            fleet=[str(p) for p in fleet_paths],
            workload_kind=info.kind,
            workload_parameters=info.parameters,
            workload_notes=info.notes,
            hours=args.hours,
            seed=args.seed,
            planner=planner,
            scale=scale,
        )
        summary, report = write_report(args.out, inputs, results)
    except (
        UsageError,
        RunError,
        FleetSpecError,
        WorkloadError,
        SimulationError,
        OSError,
    ) as exc:
        print(f"fleetwarden simulate: {exc}", file=sys.stderr)
        return 2
    count = f"{summary['workload']['requests']:,} requests"
    if args.fidelity == "fluid":
        count = f"fluid fidelity, ~{count} (tokens over mean request size)"
    table = Table(title=f"{args.hours:g} simulated hours, {count}")
    for column in CLI_COLUMNS:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in table_rows(summary, CLI_COLUMNS):
        table.add_row(*row)
    out = Console(width=None if console.is_terminal else 160)
    out.print(table)
    out.print(f"simulated in {wall:.0f} s wall ({jobs} process{'es' if jobs > 1 else ''})")
    out.print(f"report: {report}")
    return 0


def register(commands: Any) -> None:
    """Add the `simulate` subcommand to the top-level parser's subparsers."""
    sp = commands.add_parser(
        "simulate", help="simulate the fleet under several scaling strategies and write a report"
    )
    sp.add_argument(
        "--fleet",
        type=Path,
        action="append",
        help="fleet YAML file or directory (repeatable; default: examples/)",
    )
    source = sp.add_mutually_exclusive_group()
    source.add_argument("--builtin", action="store_true", help="the built-in workload (default)")
    source.add_argument("--servegen", type=Path, metavar="DIR", help="ServeGen data directory")
    source.add_argument("--trace", type=Path, metavar="FILE", help="unified-schema parquet trace")
    sp.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    sp.add_argument(
        "--strategies",
        default="reactive,lt-i,lt-u,lt-ua",
        help="comma-separated: reactive, lt-i, lt-u, lt-ua, static (pinned at maxInstances)",
    )
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument(
        "--out", type=Path, default=Path("out/simulate"), help="report directory (out/simulate)"
    )
    sp.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="multiply the workload's rates (ServeGen: its sampling fraction, default 0.01)",
    )
    sp.add_argument(
        "--peak-instances",
        metavar="SPEC",
        help="built-in only: size peak demand in instances, e.g. 1.5 or llama-3-70b=1.5,mistral-7b=0.1",
    )
    sp.add_argument("--trace-model", help="served model a --trace goes to (default: the first)")
    sp.add_argument("--speedup", type=float, default=1.0, help="--trace: divide arrival times")
    sp.add_argument("--repeat", type=int, default=1, help="--trace: play it this many times")
    sp.add_argument("--jobs", type=int, help="worker processes (default: one per core)")
    sp.add_argument(
        "--planner",
        choices=("last-hour-peak", "forecast"),
        help="hourly planner (default: forecast when installed, else last-hour-peak)",
    )
    sp.add_argument(
        "--theta-load",
        type=float,
        default=1.0,
        help="share of an instance's saturated throughput that the ModelDeployment's declared "
        "tokens/s stands for (default 1.0: the declared figure is the saturated throughput; "
        "SageServe measures theta within the latency SLA, e.g. 0.7)",
    )
    sp.add_argument(
        "--refit-hours",
        type=float,
        default=24.0,
        help="forecast planner: simulated hours between fresh ARIMA fits of a (model, region); "
        "the hours between reuse the fitted parameters (default 24; 0 refits every hour, "
        "as the operator does)",
    )
    sp.add_argument(
        "--warmup-days",
        type=float,
        help="days of the workload's own load the planner's history already holds at time 0, "
        "as production's planner reads days of Prometheus history; no request of it is "
        "simulated (default: the fleet's longest historyDays, at most 7; 0: none; a trace has "
        "no earlier part, so none)",
    )
    sp.add_argument(
        "--fidelity",
        choices=("request", "fluid"),
        default="request",
        help="request: every request an event (default); fluid: per-minute token aggregates "
        "for multi-day, many-region runs (no tenants)",
    )
    sp.add_argument(
        "--spot-donation",
        action="store_true",
        help="SageServe's spot donation, not implemented by the operator: scaled-in instances "
        "are donated to spot (where the pool and the ModelDeployment's niw.spot allow it) and "
        "a later scale-out reclaims one in 60 s instead of a model load (default: off)",
    )
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(func=run)
