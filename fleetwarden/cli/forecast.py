"""`fleetwarden forecast`: backtest the hourly peak forecast, export ServeGen series as CSV."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

DAY_S = 86_400.0


def _single_threaded_blas() -> None:
    """Pin OpenBLAS to one thread before numpy loads (unless the user chose otherwise).

    statsmodels' fits are many small matrix operations; OpenBLAS threads fighting over busy cores
    make them 5-10x slower. This must happen before numpy is imported, so it is done here, in the
    process's entry point, and never inside the library.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def run_backtest(args: argparse.Namespace) -> int:
    """Backtest over a `timestamp_s,value` CSV; exit 2 with a one-line reason on bad input."""
    _single_threaded_blas()
    from fleetwarden.forecasting.backtest import backtest
    from fleetwarden.forecasting.forecast import ForecastConfig
    from fleetwarden.forecasting.series_io import SeriesFileError, read_series_csv

    try:
        _check_positive(args, "step", "horizon", "train_days", "warmup_days", "hours")
        series = read_series_csv(args.series, step_s=args.step)
        config = ForecastConfig(horizon_s=args.horizon)
    except (SeriesFileError, ValueError) as exc:
        print(f"fleetwarden forecast backtest: {exc}", file=sys.stderr)
        return 2
    result = backtest(
        series,
        config,
        train_s=None if args.train_days is None else args.train_days * DAY_S,
        warmup_s=args.warmup_days * DAY_S,
        max_hours=args.hours,
    )
    if result.hours_evaluated == 0:
        print(
            "fleetwarden forecast backtest: no hour to evaluate (the series needs "
            f"{args.warmup_days:g} days of warm-up plus one horizon with data)",
            file=sys.stderr,
        )
        return 2
    data = result.to_dict(with_hours=args.per_hour)
    print(json.dumps(data, indent=2) if args.json else _text(data))
    return 0


def run_export(args: argparse.Namespace) -> int:
    """Write one ServeGen model's series as a backtest CSV."""
    from fleetwarden.forecasting import servegen
    from fleetwarden.forecasting.series_io import write_series_csv

    root = args.root if args.root is not None else servegen.DEFAULT_ROOT
    try:
        loaded = servegen.load_model_series(args.model, servegen.Unit(args.unit), root=root)
        write_series_csv(loaded.series, args.out)
    except (servegen.ServeGenError, OSError) as exc:
        print(f"fleetwarden forecast servegen: {exc}", file=sys.stderr)
        return 2
    print(
        f"{args.out}: {len(loaded.series.values)} samples of {loaded.unit} every "
        f"{loaded.series.step_s:g} s, {loaded.gap_windows} collection gaps left empty"
    )
    return 0


def _check_positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")


def _text(data: dict[str, Any]) -> str:
    train = "all history" if data["train_days"] is None else f"last {data['train_days']:g} days"
    lines = [
        f"hours evaluated: {data['hours_evaluated']} (skipped {data['hours_skipped']}); "
        f"step {data['step_s']:g} s, horizon {data['horizon_s']:g} s, training on {train}",
        f"{'':16}{'MAPE %':>8}{'median APE %':>14}{'under-forecast %':>18}",
    ]
    for key, label in (
        ("forecast", "forecast"),
        ("persistence", "persistence"),
        ("seasonal_naive", "seasonal naive"),
    ):
        s = data[key]
        lines.append(
            f"{label:16}{s['mape_pct']:8.2f}{s['median_ape_pct']:14.2f}"
            f"{s['under_forecast_rate_pct']:18.1f}"
        )
    models = ", ".join(f"{name} {n}" for name, n in data["models"].items())
    lines.append(f"mean fit {data['mean_fit_s']:.2f} s; models used: {models}")
    lines.append(f"beats both baselines: {'yes' if data['beats_baselines'] else 'no'}")
    return "\n".join(lines)


def register(commands: Any) -> None:
    """Add the `forecast` command group to the top-level parser's subparsers."""
    fc = commands.add_parser("forecast", help="backtest the hourly load forecast")
    actions = fc.add_subparsers(dest="forecast_command", required=True)

    bt = actions.add_parser(
        "backtest",
        help="rolling-origin backtest of the hourly peak against persistence and seasonal naive",
    )
    bt.add_argument("--series", type=Path, required=True, help="CSV with columns timestamp_s,value")
    bt.add_argument(
        "--step",
        type=float,
        help="seconds between samples (default: the CSV's median spacing; 300 for one point)",
    )
    bt.add_argument("--horizon", type=float, default=3600.0, help="seconds ahead (default 3600)")
    bt.add_argument(
        "--train-days", type=float, help="train on the last N days only (default: all history)"
    )
    bt.add_argument(
        "--warmup-days",
        type=float,
        default=2.0,
        help="history before the first evaluated hour (default 2, ARIMA's minimum)",
    )
    bt.add_argument("--hours", type=int, help="evaluate only the last N scorable hours")
    bt.add_argument("--per-hour", action="store_true", help="include every hour in the JSON")
    bt.add_argument("--json", action="store_true", help="print one JSON object")
    bt.set_defaults(func=run_backtest)

    ex = actions.add_parser(
        "servegen", help="write a ServeGen model's load (clients summed) as a backtest CSV"
    )
    ex.add_argument("--model", required=True, help="m-large, m-mid or m-small")
    ex.add_argument("--unit", choices=("requests/s", "tokens/s"), default="requests/s")
    ex.add_argument("--root", type=Path, help="ServeGen folder (default ../shared/data/servegen)")
    ex.add_argument("--out", type=Path, required=True, help="CSV to write")
    ex.set_defaults(func=run_export)
