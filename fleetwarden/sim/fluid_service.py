"""How a fluid endpoint serves a load: KV utilisation and TTFT from per-step aggregates.

The request-level engine (`fleetwarden.sim.engine`) runs continuous batching: a batch of B
requests takes `c + d*B + e*context` per decode step, a prefill `a + b*prompt`. In a steady state
where requests of mean prompt `p` and output `o` arrive at `rho` times the instance's declared
throughput X (tokens/s, prompt + output, what `derive_profile` time-scales the profile to), each
request holds on average h = p + o/2 KV tokens over its o decode steps, and each step serves the
batch plus a share B/o of one prefill per request. Solving throughput(B) = rho*X for the batch:

    B = rho*X*o*c / (T - rho*X*(o*d + o*e*h + b*p))      with T = p + o,

and the KV utilisation the scaler reads is B*h / kvBudget (Little's law on the profile's own step
times; 1.0 once the denominator is spent, i.e. the instance saturates). Time scaling keeps the
curve's shape, so a faster GPU reaches the same utilisation at the same rho.

TTFT per tier (the queueing approximation, documented in the report):

- base: one prefill of a mean prompt, plus half an admission interval (`k` decode steps at the
  steady batch's step time), as a request waits for the next admission boundary;
- queueing: when load is under capacity, M/M/1's waiting factor rho/(1-rho) applied to the
  admission interval (capped at `MAX_WAIT_FACTOR`): batches fill as rho nears 1;
- prefill in progress: an engine that admits at every step (vLLM, the fleet profiles) makes a new
  request wait for the prefill under way, if any, rather than for a boundary: the engine's share
  of time in prefill times the mean prefill (`prefill_share`);
- backlog: tokens queued ahead at a tier's priority (IW-F ahead of IW-N ahead of NIW) over the
  endpoint's capacity: the time to drain them first.

Every request arriving in a step gets that step's TTFT: percentiles are over requests, but
within a step there is no spread, so tails are flatter than the request-level model's.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetwarden.sim.engine import EngineProfile

MAX_WAIT_FACTOR = 50.0
"""Cap of rho/(1-rho): past it the backlog term describes the wait."""
RHO_CAP = 0.9
"""The load the waiting factor is read at, at most (factor 9). At a higher measured load the
endpoint has a queue, and the fluid loop charges the wait explicitly (each chunk's FIFO position
in the step and the steps it waited); reading M/M/1's factor there too counted the same
queueing twice (calibrated against the request-level demo, docs/simulator.md)."""


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """One endpoint's instance: declared throughput, its engine profile, the stream's lengths."""

    throughput_tps: float
    profile: EngineProfile
    input_tokens: float
    output_tokens: float

    @property
    def _held(self) -> float:
        return self.input_tokens + self.output_tokens / 2

    def batch(self, rho: float) -> float:
        """Steady batch size at load `rho` of one instance's throughput (inf: saturated)."""
        if rho <= 0:
            return 0.0
        p, o, profile = self.input_tokens, max(self.output_tokens, 1.0), self.profile
        rate = rho * self.throughput_tps
        per = (
            o * profile.decode_per_request_s
            + o * profile.decode_per_context_token_s * self._held
            + profile.prefill_per_token_s * p
        )
        room = (p + o) - rate * per
        if room <= 0:
            return float("inf")
        return rate * o * profile.decode_base_s / room

    def kv_utilisation(self, rho: float) -> float:
        """KV-cache usage fraction at load `rho` (module docstring), within [0, 1]."""
        batch = self.batch(rho)
        return min(1.0, batch * self._held / self.profile.kv_budget_tokens)

    def step_s(self, rho: float) -> float:
        """Decode step time of the steady batch (capped at the batch the KV budget holds)."""
        profile = self.profile
        batch = min(self.batch(rho), profile.kv_budget_tokens / max(self._held, 1.0))
        return profile.decode_seconds(1, 0) + (
            profile.decode_per_request_s + profile.decode_per_context_token_s * self._held
        ) * max(batch - 1, 0.0)

    def ttft_s(self, rho: float, backlog_ahead_tokens: float, capacity_tps: float) -> float:
        """TTFT of a request arriving at load `rho` behind `backlog_ahead_tokens` (docstring)."""
        profile = self.profile
        admission = profile.admit_every_decode_steps * self.step_s(rho)
        prefill = profile.prefill_seconds(int(self.input_tokens))
        base = prefill + admission / 2
        rho = min(rho, RHO_CAP)
        waiting = min(MAX_WAIT_FACTOR, rho / (1 - rho))
        drain = backlog_ahead_tokens / capacity_tps if capacity_tps > 0 else float("inf")
        return base + admission * waiting / 2 + self.prefill_share(rho) * prefill + drain

    def prefill_share(self, rho: float) -> float:
        """Fraction of the engine's time spent prefilling at load `rho` (at most 1).

        A request arriving during a prefill waits for it to end before its own is admitted: with
        probability equal to this share, for a residual prefill whose mean is the mean prefill
        when prompt lengths vary about as much as an exponential (the chat/RAG mix does).
        """
        requests_per_s = (
            rho * self.throughput_tps / max(self.input_tokens + self.output_tokens, 1.0)
        )
        return min(1.0, requests_per_s * self.profile.prefill_seconds(int(self.input_tokens)))

    def e2e_s(self, rho: float, ttft_s: float) -> float:
        return ttft_s + self.output_tokens * self.step_s(rho)
