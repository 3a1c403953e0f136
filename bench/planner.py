"""Benchmark: the capacity planner's integer program (SageServe section 5); prints one JSON object.

For each size (models, regions, GPU types) in (4,3,1), (20,20,5) and (50,20,5), seeded random
fleets from `fleetwarden.forecasting.planner_instances.random_instance` (seeds 0..N-1: throughput
500-5000 tokens/s, instances at 1-40 $/h, one pool in four short of what runs there today) are
planned with the default configuration: HiGHS, tight formulation, 1% relative gap. Per instance:
wall and CPU seconds, status, how it was proven (LP bound + heuristic, or branch and bound), the
proven gap, the objective minimised (hourly cost of the planned fleet plus start-up cost) and the
paper's objective (the change in cost). Per size: median and max seconds and how many instances met
the target. Targets: (20,20,5) under 2 s and (50,20,5) under 10 s, wall, on a 2-core machine.

CPU seconds are reported next to wall seconds because this machine is shared: when other work
runs, wall time stretches while CPU time does not.

`--naive` also runs the paper's formulation as written (delta and z variables, HiGHS directly),
with the same objective and gap rule, for comparison; it is slow, hence off by default.

Usage: python bench/planner.py [--seeds 5] [--gap 0.01] [--time-limit 60] [--naive]
       [--naive-limit 60] [--sizes 4x3x1,20x20x5,50x20x5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetwarden.cli.native_output import native_stdout_to_stderr
from fleetwarden.forecasting.planner import Formulation, PlannerConfig, plan
from fleetwarden.forecasting.planner_instances import random_instance

TARGETS_S = {"4x3x1": None, "20x20x5": 2.0, "50x20x5": 10.0}


def solve(size: tuple[int, int, int], seed: int, config: PlannerConfig) -> dict[str, Any]:
    spec = random_instance(*size, seed=seed)
    wall, cpu = time.perf_counter(), time.process_time()
    result = plan(spec, config)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "seed": seed,
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "status": result.status.value,
        "method": result.method,
        "gap": None if result.gap is None else round(result.gap, 5),
        "objective": round(result.solver_objective, 2),
        "paper_objective": round(result.objective, 2),
        "relaxed": result.relaxed,
        "full_pools": len(result.full_pools),
    }


def summarise(name: str, runs: list[dict[str, Any]], gap: float) -> dict[str, Any]:
    target = TARGETS_S.get(name)
    seconds = [r["seconds"] for r in runs]
    proven = [r["status"] == "optimal" and r["gap"] is not None and r["gap"] <= gap for r in runs]
    met = sum(p and (target is None or s <= target) for p, s in zip(proven, seconds, strict=True))
    return {
        "target_seconds": target,
        "median_seconds": round(statistics.median(seconds), 3),
        "max_seconds": round(max(seconds), 3),
        "median_cpu_seconds": round(statistics.median(r["cpu_seconds"] for r in runs), 3),
        "max_cpu_seconds": round(max(r["cpu_seconds"] for r in runs), 3),
        "met_target": f"{met}/{len(runs)}",
        "instances": runs,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--naive", action="store_true", help="also run the naive formulation")
    parser.add_argument("--naive-limit", type=float, default=60.0)
    parser.add_argument("--sizes", default=",".join(TARGETS_S))
    args = parser.parse_args()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    tight = PlannerConfig(mip_rel_gap=args.gap, time_limit_seconds=args.time_limit)
    naive = PlannerConfig(
        mip_rel_gap=args.gap, time_limit_seconds=args.naive_limit, formulation=Formulation.NAIVE
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    results: dict[str, Any] = {}
    naive_results: dict[str, Any] = {}
    with native_stdout_to_stderr():  # HiGHS's banner stays out of the JSON
        for size in sizes:
            name = "x".join(map(str, size))
            shape = (size[0], size[1], size[2])
            runs = [solve(shape, seed, tight) for seed in range(args.seeds)]
            results[name] = summarise(name, runs, args.gap)
            if args.naive:
                runs = [solve(shape, seed, naive) for seed in range(args.seeds)]
                naive_results[name] = summarise(name, runs, args.gap)
    output: dict[str, Any] = {
        "benchmark": "planner",
        "gap": args.gap,
        "seeds": args.seeds,
        "solver": "highs",
        "formulation": "tight",
        "sizes": results,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "python": platform.python_version(),
            "load_average_1m_at_start": load,
        },
    }
    if args.naive:
        output["naive"] = {"time_limit": args.naive_limit, "sizes": naive_results}
    print(json.dumps(output))


if __name__ == "__main__":
    main()
