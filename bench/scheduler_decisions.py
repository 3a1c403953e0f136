"""Benchmark: scheduling decisions per second; prints one JSON object.

For each policy: 100,000 requests from 10,000 tenants are pushed (the queue then holds them all),
then the queue is drained in steady state: every pop (a dispatch decision) is followed by one
charge of generated tokens to a running request and one new push, so the queue stays at 100,000
requests while decisions are measured. Reported: push rate while filling, and decisions (pop +
charge + push) per second in steady state. Target: at least 100,000 decisions/s per policy.

Usage: python bench/scheduler_decisions.py [--tenants 10000] [--queued 100000] [--decisions 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetwarden.fairness.fcfs import FirstComeFirstServed
from fleetwarden.fairness.request import Request, SchedulingPolicy
from fleetwarden.fairness.vtc import VirtualTokenCounter


def policies() -> dict[str, Callable[[], SchedulingPolicy]]:
    found: dict[str, Callable[[], SchedulingPolicy]] = {
        "fcfs": FirstComeFirstServed,
        "vtc": VirtualTokenCounter,
        "wvtc": lambda: VirtualTokenCounter(weights=lambda t: 1.0 + (hash(t) % 4)),
    }
    try:  # policies that may not exist in every checkout
        from fleetwarden.fairness.drr import DeficitRoundRobin
        from fleetwarden.fairness.wsc import WeightedServiceCounter

        found["wsc"] = WeightedServiceCounter
        found["drr"] = DeficitRoundRobin
    except ImportError:
        pass
    return found


def measure(
    make: Callable[[], SchedulingPolicy], tenants: int, queued: int, decisions: int
) -> dict[str, Any]:
    rng = random.Random(42)
    names = [f"tenant-{i}" for i in range(tenants)]
    policy = make()
    seq = 0
    now = 0.0

    def new_request() -> Request:
        nonlocal seq
        seq += 1
        return Request(seq, rng.choice(names), now, rng.randint(16, 2048), rng.randint(16, 512))

    fill = [new_request() for _ in range(queued)]
    start = time.perf_counter()
    for request in fill:
        policy.push(request, now)
    push_s = time.perf_counter() - start

    running: list[Request] = []
    arrivals = [new_request() for _ in range(decisions)]
    start = time.perf_counter()
    for arrival in arrivals:
        now += 0.001
        dispatched = policy.pop(now)
        if dispatched is not None:
            running.append(dispatched)
        victim = running[seq % len(running)]
        policy.charge(victim, output_tokens=1, now=now)
        victim.output_tokens += 1
        policy.push(arrival, now)
        if len(running) > 256:
            done = running.pop(0)
            policy.complete(done, now)
    steady_s = time.perf_counter() - start
    return {
        "pushes_per_second_filling": round(queued / push_s),
        "decisions_per_second": round(decisions / steady_s),
        "queued": len(policy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--decisions", type=int, default=200_000)
    args = parser.parse_args()
    results = {
        name: measure(make, args.tenants, args.queued, args.decisions)
        for name, make in policies().items()
    }
    print(
        json.dumps(
            {
                "benchmark": "scheduler_decisions",
                "tenants": args.tenants,
                "queued": args.queued,
                "decision": "pop + charge + push",
                "policies": results,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            }
        )
    )


if __name__ == "__main__":
    main()
