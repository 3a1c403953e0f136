"""Engine profiles for every (model, GPU type) of a fleet, from the ModelDeployment's throughput.

A ModelDeployment declares tokens/s per instance per GPU type (SageServe's theta), not an engine
profile, so the simulator derives one whose steady-state throughput is exactly that:

1. Shape. Start from the VTC paper's A10G profile (`examples/engines/vtc-a10g.yaml`, the one
   profile fitted to real measurements) and give it the instance's KV budget, `kv_budget_tokens`
   (default 65,536: about 30 requests of the built-in mix, the running batch a vLLM instance keeps
   at its latency targets). A budget r times the base's holds r times the batch, so the
   per-request and per-context-token decode terms are divided by r: a full batch then costs the
   same per step as a full batch on the base profile. The prefill cap becomes 8,192 tokens (vLLM's
   default `max_num_batched_tokens`), and waiting requests are admitted at every step, as vLLM's
   scheduler does. The base's admission every 10 decode steps is S-LoRA's, the router of the VTC
   paper's testbed: kept for `fleetwarden replay`, which reproduces that paper, but on a vLLM
   fleet it adds up to 10 steps to every first token (the demo's IW-F attainment rose from 54%
   to 75% under reactive scaling when it went).
2. Speed. Replay a saturated queue of the reference mix (the built-in workload's applications,
   fixed seed) through that shape with `fleetwarden.sim.replay` and measure tokens/s (prompt plus
   output, SageServe's TPS) between the 10th and 90th percentile completion. Multiplying every
   time of the profile by s divides that throughput by exactly s (the run is the same sequence of
   steps, each s times longer), so s = measured / declared gives the declared throughput.

The match holds for the reference mix; a workload with other lengths gets a different tokens/s
from the same instance, as real hardware would. `SimOptions.profiles` overrides any profile.

What "declared" means is a choice, `theta_load`. By default (1.0) the declared tokens/s is the
instance's saturated throughput, as the simulator issue words it. SageServe benchmarks theta as
the load an instance serves *within its latency SLA*, so an instance is not full at theta; with
`theta_load` < 1 the engine saturates at theta / theta_load (0.7 puts theta where the scalers'
scale-out threshold calls an instance full). The planner sizes fleets in units of theta either
way, so the choice decides how much headroom a planned instance has: docs/simulator.md shows
what it changes.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import numpy as np

from fleetwarden.fairness.fcfs import FirstComeFirstServed
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.fleet_spec import Model, Placement
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.replay import replay
from fleetwarden.sim.trace import TraceRequest
from fleetwarden.sim.workload_builtin import DEFAULT_APPS

DEFAULT_KV_BUDGET_TOKENS = 65_536
DEFAULT_THETA_LOAD = 1.0
PREFILL_CAP_TOKENS = 8_192
ADMIT_EVERY_DECODE_STEPS = 1
REFERENCE_REQUESTS = 400
REFERENCE_SEED = 20250910


def reference_mix(count: int = REFERENCE_REQUESTS, seed: int = REFERENCE_SEED) -> list[int]:
    """(input, output) token pairs of the reference mix, flattened: in0, out0, in1, out1, ..."""
    rng = np.random.default_rng(seed)
    names = sorted(DEFAULT_APPS)
    shares = np.array([DEFAULT_APPS[n].share for n in names])
    picks = rng.choice(len(names), size=count, p=shares / shares.sum())
    pairs: list[int] = []
    for pick in picks:
        app = DEFAULT_APPS[names[int(pick)]]
        pairs += [int(app.input.sample(rng, 1)[0]), int(app.output.sample(rng, 1)[0])]
    return pairs


def shaped(kv_budget_tokens: int, base: EngineProfile = VTC_A10G) -> EngineProfile:
    """Step 1 of the module docstring: the base profile resized to `kv_budget_tokens`."""
    if kv_budget_tokens < 1:
        raise ValueError("kv_budget_tokens must be >= 1")
    r = kv_budget_tokens / base.kv_budget_tokens
    return replace(
        base,
        name=f"{base.name}-kv{kv_budget_tokens}",
        kv_budget_tokens=kv_budget_tokens,
        admit_every_decode_steps=ADMIT_EVERY_DECODE_STEPS,
        prefill_cap_tokens=max(base.prefill_cap_tokens, PREFILL_CAP_TOKENS),
        decode_per_request_s=base.decode_per_request_s / r,
        decode_per_context_token_s=base.decode_per_context_token_s / r,
    )


def time_scaled(profile: EngineProfile, factor: float, name: str) -> EngineProfile:
    """Every duration of `profile` times `factor`."""
    return replace(
        profile,
        name=name,
        prefill_base_s=profile.prefill_base_s * factor,
        prefill_per_token_s=profile.prefill_per_token_s * factor,
        decode_base_s=profile.decode_base_s * factor,
        decode_per_request_s=profile.decode_per_request_s * factor,
        decode_per_context_token_s=profile.decode_per_context_token_s * factor,
    )


@lru_cache(maxsize=64)
def saturated_tps(profile: EngineProfile) -> float:
    """Tokens/s of `profile` on a saturated queue of the reference mix (module docstring)."""
    pairs = reference_mix()
    budget = profile.kv_budget_tokens
    trace = [
        TraceRequest(0.0, "reference", pairs[i], pairs[i + 1])
        for i in range(0, len(pairs), 2)
        if pairs[i] + pairs[i + 1] <= budget
    ]
    result = replay(trace, FirstComeFirstServed(), profile)
    done = sorted(
        (r.completion_s, r.trace.input_tokens + r.trace.output_tokens)
        for r in result.records
        if r.completion_s is not None
    )
    lo, hi = len(done) // 10, (9 * len(done)) // 10
    span = done[hi][0] - done[lo][0]
    if span <= 0:
        raise ValueError(f"profile {profile.name}: reference run too short to measure")
    return sum(tokens for _, tokens in done[lo + 1 : hi + 1]) / span


def saturation_tps(placement: Placement, theta_load: float = DEFAULT_THETA_LOAD) -> float:
    """Tokens/s one instance of `placement` serves when saturated (module docstring)."""
    if not (math.isfinite(theta_load) and 0 < theta_load <= 1):
        raise ValueError(f"theta_load must be in (0, 1], got {theta_load}")
    return placement.throughput_tps / theta_load


def derive_profile(
    model: Model,
    placement: Placement,
    *,
    kv_budget_tokens: int = DEFAULT_KV_BUDGET_TOKENS,
    theta_load: float = DEFAULT_THETA_LOAD,
    base: EngineProfile = VTC_A10G,
) -> EngineProfile:
    """The profile of one instance of `model` on `placement`'s GPU type (module docstring)."""
    shape = shaped(kv_budget_tokens, base)
    factor = saturated_tps(shape) / saturation_tps(placement, theta_load)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"cannot derive a profile for {model.key} on {placement.gpu_type}")
    return time_scaled(shape, factor, f"{model.served_name}@{placement.gpu_type}")
