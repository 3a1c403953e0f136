"""The sidecar's fairness config: what the operator renders from a TenantPolicy and pushes to pods.

It is a resolved, self-contained document: every default already applied (token weights chosen by
policy, tiers' targets copied from the ModelDeployment), so a sidecar needs nothing but this file to
schedule. Its `version` is a content hash, so the same inputs always give the same version, re-running
the operator writes nothing, and a sidecar can tell at once whether it runs the current config.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from fleetwarden.api.enums import LengthPrediction, Ordering, PolicyName, QuantumUnit, Tier

CONFIG_FILE_NAME = "fairness.json"
"""Key of the config in the ConfigMap, and file name in the sidecar's config mount."""

VTC_TOKEN_WEIGHTS = {"input": 1.0, "system": 1.0, "output": 2.0}
"""VTC paper defaults: w_p = 1, w_q = 2; system-prompt tokens are input to VTC."""
FAIRSERVE_TOKEN_WEIGHTS = {"input": 1.0, "system": 2.0, "output": 1.0}
"""FairServe defaults: alpha = 1, beta = 2, gamma = 1."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Bounds. A sidecar also reads hand-written configs (`--config`, `PUT /admin/config`), so each
# field is bounded as the CRD field it is rendered from is (TenantPolicy; the ModelDeployment's
# tiers and capacity gate): whatever the operator renders is accepted, and what it never could is
# refused here, naming the field (422, exit 2), instead of passing and misbehaving later. A DRR
# quantum of 0 failed only when a sidecar installed the config; a negative in-flight token budget
# held the engine to one request at a time and made OIT see overload whenever one was running; an
# infinite weight made a tenant's charges 0 under weighted VTC.


RateLimit = Annotated[int | None, Field(ge=1)]
"""Requests or tokens per minute of a tenant, the defaults or an application: None is unlimited,
else at least 1, as the TenantPolicy CRD has it (`minimum: 1`). There is no "blocked" value: 0 is
refused here too, because a limit no request fits made every request a 429 with `Retry-After`,
which clients (the OpenAI SDKs among them) retry forever. A negative limit is refused likewise
(it used to pass here and fail only when a sidecar installed the config, half-way through)."""


class TokenWeightsConfig(_Frozen):
    input: float = Field(ge=0, allow_inf_nan=False)
    system: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)


class TenantConfig(_Frozen):
    weight: float = Field(gt=0, le=1e6)
    tier: Tier
    priority_factor: float = Field(gt=0, le=1e3)
    rpm: RateLimit = None
    tpm: RateLimit = None


class StageConfig(_Frozen):
    input: int = Field(ge=0)
    system: int = Field(ge=0)
    output: int = Field(ge=0)


class ApplicationConfig(_Frozen):
    rpm: RateLimit = None
    tpm: RateLimit = None
    stages: dict[str, StageConfig] = Field(default_factory=dict)


class TierConfig(_Frozen):
    ttft_s: float = Field(gt=0, le=3600)
    tbt_s: float = Field(gt=0, le=60)


class DrrConfig(_Frozen):
    unit: QuantumUnit
    quantum: dict[Tier, Annotated[int, Field(ge=1)]]


class DpaConfig(_Frozen):
    severely_expired_s: float = Field(ge=0, allow_inf_nan=False)
    urgent_within_s: float = Field(ge=0, allow_inf_nan=False)


class GateConfig(_Frozen):
    max_inflight_tokens: int | None = Field(default=None, ge=1)
    max_waiting_requests: int = Field(ge=0)
    telemetry_max_age_s: float = Field(gt=0, le=600)


class FairnessConfig(_Frozen):
    """Everything a sidecar needs to order, throttle and admit requests."""

    source: str
    """Where it came from: `TenantPolicy <namespace>/<name>` or `default`."""
    served_model: str
    policy: PolicyName
    ordering: Ordering
    token_weights: TokenWeightsConfig
    length_prediction: LengthPrediction
    tenants: dict[str, TenantConfig]
    defaults: TenantConfig
    applications: dict[str, ApplicationConfig]
    interaction_throttling: bool
    early_rejection: bool
    overload_kv_utilization: float = Field(gt=0, le=1)
    drr: DrrConfig
    dpa: DpaConfig
    tiers: dict[Tier, TierConfig]
    gate: GateConfig
    tenant_header: str

    @property
    def version(self) -> str:
        """Content hash: equal configs have equal versions, on every machine and every run."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_document(self) -> str:
        """The JSON document stored in the ConfigMap: the config plus its version."""
        body = self.model_dump(mode="json")
        body["version"] = self.version
        return json.dumps(body, sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_document(cls, text: str) -> FairnessConfig:
        """Parse a document written by `to_document`; the version is recomputed, never trusted."""
        body = json.loads(text)
        body.pop("version", None)
        return cls.model_validate(body)
