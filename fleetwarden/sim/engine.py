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

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetwarden.fairness.gate import staggered_peak_tokens
from fleetwarden.fairness.request import Request
from fleetwarden.sim.input_values import InputValueError, finite_number, read_yaml, whole_number

FIELDS = (
    "name",
    "kvBudgetTokens",
    "admitEveryDecodeSteps",
    "prefillCapTokens",
    "prefill",
    "decode",
)
PREFILL_FIELDS = ("baseSeconds", "perTokenSeconds")
DECODE_FIELDS = ("baseSeconds", "perRequestSeconds", "perContextTokenSeconds")


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
        # Finite: an infinite step never ends (the replay hangs), a NaN one poisons every time after.
        if not all(math.isfinite(t) and t >= 0 for t in times):
            raise ProfileError("times must be finite and >= 0")
        if self.decode_base_s + self.decode_per_request_s <= 0:
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
        """From the YAML layout of `examples/engines/*.yaml` (camelCase, nested times).

        Strict, since a profile is typed by hand: an unknown field (a typo such as
        `admitEveryDecodeStep`) is an error rather than a silent default, counts must be whole
        numbers and times finite numbers >= 0 (messages name the field)."""
        _known_fields(data, FIELDS, "")
        prefill = _section(data, "prefill", PREFILL_FIELDS)
        decode = _section(data, "decode", DECODE_FIELDS)
        kv_budget = _count(data, "kvBudgetTokens", None)
        return cls(
            name=str(data.get("name", "engine")),
            kv_budget_tokens=kv_budget,
            admit_every_decode_steps=_count(data, "admitEveryDecodeSteps", 1),
            prefill_cap_tokens=_count(data, "prefillCapTokens", kv_budget),
            prefill_base_s=_seconds(prefill, "prefill.baseSeconds", None),
            prefill_per_token_s=_seconds(prefill, "prefill.perTokenSeconds", None),
            decode_base_s=_seconds(decode, "decode.baseSeconds", None),
            decode_per_request_s=_seconds(decode, "decode.perRequestSeconds", 0.0),
            decode_per_context_token_s=_seconds(decode, "decode.perContextTokenSeconds", 0.0),
        )

    @classmethod
    def load(cls, path: Path) -> EngineProfile:
        """A profile file; every problem (unreadable, not YAML, bad field) is a ProfileError
        naming the file, so the command line reports it in one line."""
        try:
            data = read_yaml(path)
        except InputValueError as exc:
            raise ProfileError(f"{path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ProfileError(f"{path}: an engine profile is a YAML mapping")
        try:
            return cls.from_dict(data)
        except ProfileError as exc:
            raise ProfileError(f"{path}: {exc}") from exc


def _known_fields(data: dict[str, Any], fields: tuple[str, ...], prefix: str) -> None:
    unknown = sorted(f"{prefix}{key}" for key in data if key not in fields)
    if unknown:
        raise ProfileError(
            f"engine profile: unknown field(s) {', '.join(unknown)} (known: {', '.join(fields)})"
        )


def _section(data: dict[str, Any], key: str, fields: tuple[str, ...]) -> dict[str, Any]:
    if key not in data:
        raise ProfileError(f"engine profile: missing or malformed field {key!r} (required)")
    section = data[key]
    if not isinstance(section, dict):
        raise ProfileError(f"engine profile: {key} must be a mapping of {', '.join(fields)}")
    _known_fields(section, fields, f"{key}.")
    return section


def _value(data: dict[str, Any], key: str, default: object) -> object:
    name = key.rpartition(".")[2]
    if name in data:
        return data[name]
    if default is None:
        raise ProfileError(f"engine profile: missing or malformed field {key!r} (required)")
    return default


def _count(data: dict[str, Any], key: str, default: int | None) -> int:
    try:
        return whole_number(_value(data, key, default), minimum=1)
    except InputValueError as exc:
        raise ProfileError(f"engine profile: {key} {exc}") from None


def _seconds(data: dict[str, Any], key: str, default: float | None) -> float:
    try:
        return finite_number(_value(data, key, default))
    except InputValueError as exc:
        raise ProfileError(f"engine profile: {key} {exc}") from None


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
