"""Seeded random fleets for the planner's benchmark, tests and simulations.

Shaped like production rather than uniform noise, because uniform instances are either trivial
or hopeless: faster GPUs cost more per hour but less per token; model popularity and region size
are skewed (log-normal); the fleet running now was planned for last hour's load (within +-30%)
on one or two GPU types, not necessarily the cheapest; pools have 10-80% headroom over what runs
there now, except one in four, which is up to 25% short of it: some pools bind, most do not.
"""

from __future__ import annotations

import math
import random

from fleetwarden.forecasting.planner_model import ModelSpec, PlanInput, PoolSpec, RegionBounds


def random_instance(
    n_models: int, n_regions: int, n_gpu_types: int, seed: int, pool_slack: float = 1.0
) -> PlanInput:
    """A fleet of n_models x n_regions x n_gpu_types; `pool_slack` scales every pool's size."""
    rng = random.Random(seed)
    gpu_names = [f"gpu{k}" for k in range(n_gpu_types)]
    region_names = [f"region{j}" for j in range(n_regions)]
    gpu_cost = [rng.uniform(1.0, 10.0) for _ in gpu_names]
    speed = [c**0.8 * rng.uniform(0.8, 1.2) for c in gpu_cost]
    fastest = max(speed)
    models: list[ModelSpec] = []
    theta_of: list[list[float]] = []
    for i in range(n_models):
        base = rng.uniform(500.0, 1500.0)
        theta = [min(5000.0, max(500.0, base * s / fastest * 3.3)) for s in speed]
        theta_of.append(theta)
        models.append(
            ModelSpec(
                name=f"model{i}",
                throughput=dict(zip(gpu_names, theta, strict=True)),
                regions={},
                gpus_per_instance=rng.choice([1, 1, 2, 4]),
                epsilon=rng.choice([0.6, 0.7, 0.8, 0.9, 1.0]),
                load_seconds=rng.uniform(120.0, 1200.0),
            )
        )
    region_size = [rng.lognormvariate(0.0, 0.7) for _ in region_names]
    peak: dict[tuple[str, str], float] = {}
    current: dict[tuple[str, str, str], int] = {}
    used = {(r, k): 0 for r in region_names for k in gpu_names}
    bounds: list[dict[str, RegionBounds]] = [{} for _ in models]
    for i, m in enumerate(models):
        popularity = rng.lognormvariate(0.0, 1.0)
        for j, region in enumerate(region_names):
            value = popularity * region_size[j] * 8000.0 * rng.uniform(0.5, 1.5)
            peak[(m.name, region)] = value
            previous = value * rng.uniform(0.7, 1.3)
            types = rng.sample(range(n_gpu_types), k=min(n_gpu_types, rng.randint(1, 2)))
            for k in types:
                n = math.ceil(previous / len(types) / theta_of[i][k])
                current[(m.name, region, gpu_names[k])] = n
                used[(region, gpu_names[k])] += n * m.gpus_per_instance
            need = math.ceil(value / max(theta_of[i]))
            bounds[i][region] = RegionBounds(
                rng.choice([0, 1, 1, 2]), max(2, 3 * need + rng.randint(0, 5))
            )
    models = [
        ModelSpec(
            name=m.name,
            throughput=m.throughput,
            regions=bounds[i],
            gpus_per_instance=m.gpus_per_instance,
            epsilon=m.epsilon,
            load_seconds=m.load_seconds,
        )
        for i, m in enumerate(models)
    ]
    pools = []
    for region in region_names:
        average = sum(used[(region, k)] for k in gpu_names) / n_gpu_types
        for k, name in enumerate(gpu_names):
            size = max(
                used[(region, name)] * rng.uniform(1.1, 1.8), average * rng.uniform(0.3, 1.0)
            )
            if rng.random() < 0.25:  # a pool that is short of what runs there today
                size *= rng.uniform(0.75, 1.0)
            pools.append(PoolSpec(region, name, gpu_cost[k], gpus=max(1, int(size * pool_slack))))
    return PlanInput(tuple(models), tuple(pools), current, peak)
