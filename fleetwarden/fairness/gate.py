"""The capacity gate: may the next request go to the engine now?

A request that is admitted keeps growing by one KV-cache token per generated token, so checking
only today's usage over-admits and the engine later preempts. The check here is the "staggered"
one from the VTC artifact's router (inherited from S-LoRA/LightLLM): sort the requests by tokens
still to generate, longest first; when the i-th of them finishes, the i+1 longest are all still
running and have each grown by its remaining length, so usage then is the tokens they hold now plus
(i+1) times that remaining length. The peak over all those moments is the memory the batch needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from fleetwarden.fairness.request import Request


def staggered_peak_tokens(entries: Iterable[tuple[int, int]]) -> int:
    """Peak KV tokens of a batch; `entries` are (tokens held now, tokens still to generate)."""
    ordered = sorted(entries, key=lambda entry: entry[1], reverse=True)
    peak = 0
    held = 0
    for index, (tokens_held, remaining) in enumerate(ordered):
        held += tokens_held
        peak = max(peak, held + (index + 1) * remaining)
    return peak


@dataclass(frozen=True)
class EngineTelemetry:
    """What the engine last said about itself (vLLM's metrics), and when."""

    observed_s: float
    waiting_requests: int
    kv_utilization: float | None = None


class GateReason(StrEnum):
    ADMIT = "admit"
    BUDGET = "token-budget"
    ENGINE_QUEUE = "engine-queue"
    STALE_TELEMETRY = "stale-telemetry"
    NO_TELEMETRY = "no-telemetry"


@dataclass(frozen=True)
class GateDecision:
    admit: bool
    reason: GateReason


class CapacityGate:
    """May the policy's head go to the engine now?

    Two checks. The in-flight token budget: with the candidate added, the staggered peak of every
    dispatched request (tokens held, tokens still expected) must fit `max_inflight_tokens`;
    expected output is the prediction when there is one, else `max_tokens`. The engine's own
    word: its waiting queue must hold at most `max_waiting_requests`, judged from telemetry no
    older than `telemetry_max_age_s`; older (or missing) telemetry counts as saturated. With
    nothing in flight the gate always admits, so broken metrics slow the engine to one request at
    a time instead of stopping it.
    """

    def __init__(
        self,
        max_inflight_tokens: int | None,
        *,
        max_waiting_requests: int = 0,
        telemetry_max_age_s: float = 5.0,
        require_telemetry: bool = True,
    ) -> None:
        self.max_inflight_tokens = max_inflight_tokens
        self.max_waiting_requests = max_waiting_requests
        self.telemetry_max_age_s = telemetry_max_age_s
        self.require_telemetry = require_telemetry
        self.telemetry: EngineTelemetry | None = None
        self._inflight: dict[int, Request] = {}

    @staticmethod
    def expected_output(request: Request) -> int:
        predicted = request.predicted_output_tokens
        return predicted if predicted is not None else request.max_output_tokens

    def observe(self, telemetry: EngineTelemetry) -> None:
        if self.telemetry is None or telemetry.observed_s >= self.telemetry.observed_s:
            self.telemetry = telemetry

    def inflight_entries(self) -> list[tuple[int, int]]:
        return [
            (r.input_tokens + r.output_tokens, max(0, self.expected_output(r) - r.output_tokens))
            for r in self._inflight.values()
        ]

    def decide(self, request: Request, now: float) -> GateDecision:
        if not self._inflight:
            return GateDecision(True, GateReason.ADMIT)
        if self.max_inflight_tokens is not None:
            entries = self.inflight_entries()
            entries.append((request.input_tokens, self.expected_output(request)))
            if staggered_peak_tokens(entries) > self.max_inflight_tokens:
                return GateDecision(False, GateReason.BUDGET)
        if self.require_telemetry:
            if self.telemetry is None:
                return GateDecision(False, GateReason.NO_TELEMETRY)
            if now - self.telemetry.observed_s > self.telemetry_max_age_s:
                return GateDecision(False, GateReason.STALE_TELEMETRY)
            if self.telemetry.waiting_requests > self.max_waiting_requests:
                return GateDecision(False, GateReason.ENGINE_QUEUE)
        return GateDecision(True, GateReason.ADMIT)

    def admits(self, request: Request, now: float) -> bool:
        return self.decide(request, now).admit

    @property
    def full(self) -> bool:
        """Whether the in-flight work will use the whole token budget at its peak (OIT's signal).

        Not "a one-token probe would be refused": the staggered check rightly lets a short
        request in beside a long one that ends later, so that probe almost never fails.
        """
        if self.max_inflight_tokens is None or not self._inflight:
            return False
        return staggered_peak_tokens(self.inflight_entries()) >= self.max_inflight_tokens

    def dispatched(self, request: Request) -> None:
        self._inflight[request.seq] = request

    def finished(self, request: Request) -> None:
        self._inflight.pop(request.seq, None)

    @property
    def inflight(self) -> int:
        return len(self._inflight)
