"""A model of one inference engine instance doing continuous batching, as a pure step machine.

The same model backs `fleetwarden replay`, the stub engine the sidecar is tested against, and the
fleet simulator, so a policy is always judged against one notion of an engine. It follows the
VTC paper's Algorithm 1 and the S-LoRA router the VTC artifact runs on:

- new requests are admitted only when the engine is idle or every `admit_every_decode_steps`
  decode steps; an admission prefills a minibatch of at most `prefill_cap_tokens` prompt tokens;
- a request is admitted only if the batch would still fit in `kv_budget_tokens` when everything
  runs to completion (the staggered check in `fleetwarden.fairness.gate`);
- prefill takes `a + b * prompt_tokens` seconds and yields each new request's first token;
- each decode step takes `c + d * batch + e * context_tokens` seconds and yields one token for
  every running request.

Nothing here reads a clock: the caller owns time and advances it by the durations returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetwarden.fairness.gate import staggered_peak_tokens
from fleetwarden.fairness.request import Request


class ProfileError(ValueError):
    """An engine profile is missing a field or has an impossible value."""


@dataclass(frozen=True)
class EngineProfile:
    """Performance of one engine instance (one model on one GPU type)."""

    name: str
    kv_budget_tokens: int
    """KV-cache capacity in tokens (the VTC paper's M)."""
    admit_every_decode_steps: int
    """Admit new requests when idle, else only every this many decode steps (S-LoRA's k)."""
    prefill_cap_tokens: int
    """Most prompt tokens prefilled in one admission."""
    prefill_base_s: float
    prefill_per_token_s: float
    decode_base_s: float
    decode_per_request_s: float
    decode_per_context_token_s: float

    def __post_init__(self) -> None:
        if self.kv_budget_tokens < 1 or self.prefill_cap_tokens < 1:
            raise ProfileError("kvBudgetTokens and prefillCapTokens must be >= 1")
        if self.admit_every_decode_steps < 1:
            raise ProfileError("admitEveryDecodeSteps must be >= 1")
        times = (
            self.prefill_base_s,
            self.prefill_per_token_s,
            self.decode_base_s,
            self.decode_per_request_s,
            self.decode_per_context_token_s,
        )
        if min(times) < 0 or self.decode_base_s + self.decode_per_request_s <= 0:
            raise ProfileError("times must be >= 0 and a decode step must take time")

    def prefill_seconds(self, prompt_tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * prompt_tokens

    def decode_seconds(self, batch: int, context_tokens: int) -> float:
        return (
            self.decode_base_s
            + self.decode_per_request_s * batch
            + self.decode_per_context_token_s * context_tokens
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineProfile:
        """From the YAML layout of `examples/engines/*.yaml` (camelCase, nested times)."""
        try:
            prefill, decode = data["prefill"], data["decode"]
            return cls(
                name=str(data.get("name", "engine")),
                kv_budget_tokens=int(data["kvBudgetTokens"]),
                admit_every_decode_steps=int(data.get("admitEveryDecodeSteps", 1)),
                prefill_cap_tokens=int(data.get("prefillCapTokens", data["kvBudgetTokens"])),
                prefill_base_s=float(prefill["baseSeconds"]),
                prefill_per_token_s=float(prefill["perTokenSeconds"]),
                decode_base_s=float(decode["baseSeconds"]),
                decode_per_request_s=float(decode.get("perRequestSeconds", 0.0)),
                decode_per_context_token_s=float(decode.get("perContextTokenSeconds", 0.0)),
            )
        except (KeyError, TypeError) as exc:
            raise ProfileError(f"engine profile: missing or malformed field {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> EngineProfile:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            raise ProfileError(f"{path}: an engine profile is a YAML mapping")
        return cls.from_dict(data)


@dataclass(slots=True, eq=False)
class Running:
    """A request in the running batch, with the length it will actually generate."""

    request: Request
    target_output_tokens: int
    first_token_s: float | None = None


@dataclass
class EngineModel:
    """The running batch of one instance and the rules for changing it."""

    profile: EngineProfile
    running: list[Running] = field(default_factory=list)
    steps_since_admission: int = 0

    @property
    def idle(self) -> bool:
        return not self.running

    def may_admit(self) -> bool:
        """Admissions happen when idle or every k decode steps."""
        return self.idle or self.steps_since_admission >= self.profile.admit_every_decode_steps

    def held_tokens(self) -> int:
        return sum(r.request.input_tokens + r.request.output_tokens for r in self.running)

    def fits(self, candidates: list[Request]) -> bool:
        """Whether `candidates` can join the batch without ever exceeding the KV budget."""
        entries = [
            (
                r.request.input_tokens + r.request.output_tokens,
                r.request.max_output_tokens - r.request.output_tokens,
            )
            for r in self.running
        ]
        entries += [(c.input_tokens, c.max_output_tokens) for c in candidates]
        return staggered_peak_tokens(entries) <= self.profile.kv_budget_tokens

    def prefill(self, batch: list[Request], now: float, targets: list[int]) -> float:
        """Start `batch`; returns the prefill duration. Each gets its first token at the end."""
        duration = self.profile.prefill_seconds(sum(r.input_tokens for r in batch))
        for request, target in zip(batch, targets, strict=True):
            self.running.append(Running(request, target, first_token_s=now + duration))
        self.steps_since_admission = 0
        return duration

    def decode_seconds(self) -> float:
        return self.profile.decode_seconds(len(self.running), self.held_tokens())

    def after_decode_step(self) -> None:
        self.steps_since_admission += 1

    def finished(self) -> list[Running]:
        """Remove and return requests that generated all their tokens."""
        done = [r for r in self.running if r.request.output_tokens >= r.target_output_tokens]
        if done:
            self.running = [
                r for r in self.running if r.request.output_tokens < r.target_output_tokens
            ]
        return done
