"""The batch service's configuration file (YAML or JSON), validated by pydantic.

Every knob has a unit in its name and a docstring with the reason for its default. Unknown keys
are errors: a misspelt quota must not silently fall back to the default.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetwarden.batch.policy import (
    TENANT_HEADER,
    RetryPolicy,
    TargetKind,
    tenant_header_problem,
)
from fleetwarden.batch.records import QueueKey
from fleetwarden.scaling.niw_release import ReleaseRule, ReleaseRuleError

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$"
"""Model, region and tenant names: no `|` (queue keys join model and region with it)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SqliteStoreConfig(_Model):
    """One SQLite file in WAL mode: the default, for a single replica on a PersistentVolume."""

    kind: Literal["sqlite"] = "sqlite"
    path: Path = Path("fleetwarden-batch.sqlite3")
    """Database file; its directory must exist and be on durable storage."""
    synchronous: Literal["full", "normal"] = "full"
    """`full` fsyncs the WAL at every commit, so an acknowledged upload, batch or result survives
    a power loss. `normal` survives process crashes (kill -9) but may lose the last commits on
    power loss; use it only where the disk itself is replicated."""
    busy_timeout_ms: int = Field(default=5000, ge=0)
    """How long a transaction waits for a lock held by another connection (backup tools)."""


class RedisStoreConfig(_Model):
    """Redis, for HA: state survives the batch pod; run Redis with `appendfsync always`."""

    kind: Literal["redis"] = "redis"
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="fwb", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    """Prefix of every key, so several services can share one Redis database."""
    replicas_ack: int = Field(default=0, ge=0)
    """After each write, WAIT for this many replicas: replication is asynchronous, so without it
    a failover can lose acknowledged writes."""
    ack_timeout_ms: int = Field(default=1000, ge=1)
    socket_timeout_s: float = Field(default=10.0, gt=0)


StoreConfig = Annotated[SqliteStoreConfig | RedisStoreConfig, Field(discriminator="kind")]


class QuotaConfig(_Model):
    """Per-tenant bounds; they also bound the store's size."""

    max_queued_items: int = Field(default=100_000, ge=1)
    """Items a tenant may have unfinished across all its batches; a batch that would exceed it
    is refused (429) at creation rather than accepted and starved."""
    max_file_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    """Largest upload (OpenAI allows 200 MB; 100 MB keeps SQLite pages and Redis values sane)."""


class QuotasConfig(_Model):
    default: QuotaConfig = Field(default_factory=QuotaConfig)
    tenants: dict[str, QuotaConfig] = Field(default_factory=dict)
    """Overrides per tenant name."""


class AuthConfig(_Model):
    """Bearer tokens and the tenant each one authenticates."""

    tokens: dict[str, str] = Field(default_factory=dict)
    """Token -> tenant. Mount the file from a Secret."""
    token_sha256: dict[str, str] = Field(default_factory=dict)
    """Hex SHA-256 of a token -> tenant, so the file need not hold tokens at all."""

    @field_validator("tokens", "token_sha256")
    @classmethod
    def _tenant_names(cls, value: dict[str, str]) -> dict[str, str]:
        for tenant in value.values():
            if not re.match(_NAME, tenant):
                raise ValueError(f"tenant name {tenant!r} must match {_NAME}")
        return value

    @field_validator("token_sha256")
    @classmethod
    def _hex(cls, value: dict[str, str]) -> dict[str, str]:
        lowered: dict[str, str] = {}
        for digest, tenant in value.items():
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
                raise ValueError(f"{digest!r} is not a hex SHA-256 digest")
            known = lowered.get(digest.lower())
            if known is not None and known != tenant:
                raise ValueError(
                    f"digest {digest[:12]}... is listed for two tenants ({known!r}, {tenant!r}; "
                    "hex is case-blind)"
                )
            lowered[digest.lower()] = tenant
        return lowered

    @model_validator(mode="after")
    def _one_tenant_per_token(self) -> AuthConfig:
        """A token in both maps for two tenants would belong to whichever map `digests` read
        last: refused, so a config never hands one token to two tenants without saying so. The
        same tenant twice is fine (a migration from tokens to digests, or a Secret overlay)."""
        for token, tenant in self.tokens.items():
            digest = hashlib.sha256(token.encode()).hexdigest()
            if self.token_sha256.get(digest, tenant) != tenant:
                raise ValueError(
                    f"a token is listed in both tokens (tenant {self.tokens[token]!r}) and "
                    f"token_sha256 (tenant {self.token_sha256[digest]!r}): list it once"
                )
        return self

    def digests(self) -> dict[str, str]:
        """Digest -> tenant over both maps: lookups compare digests, never raw tokens."""
        found = {hashlib.sha256(t.encode()).hexdigest(): n for t, n in self.tokens.items()}
        found.update(self.token_sha256)
        return found


class LimitsConfig(_Model):
    """Bounds on input files and batches, for every tenant."""

    max_line_bytes: int = Field(default=1024 * 1024, ge=64)
    """Longest input line; longer lines fail the batch (line_too_large)."""
    max_lines: int = Field(default=50_000, ge=1)
    """Most requests per batch (OpenAI's limit)."""
    min_completion_window_s: float = Field(default=60.0, gt=0)
    max_completion_window_s: float = Field(default=7 * 86400.0, gt=0)
    """OpenAI accepts only `24h`; fleetwarden accepts any window in this range."""
    max_list_limit: int = Field(default=100, ge=1)


class ReleaseConfig(_Model):
    """SageServe's release rule; see `fleetwarden.scaling.niw_release.ReleaseRule`."""

    one_below: float = 0.60
    two_below: float = 0.50
    promote_after_s: float = 10 * 3600.0

    @model_validator(mode="after")
    def _valid(self) -> ReleaseConfig:
        self.rule()
        return self

    def rule(self) -> ReleaseRule:
        """The shared rule object."""
        try:
            return ReleaseRule(self.one_below, self.two_below, self.promote_after_s)
        except ReleaseRuleError as exc:
            raise ValueError(str(exc)) from exc


class RetryConfig(_Model):
    """Engine errors; see `fleetwarden.batch.policy.RetryPolicy` for each field's reason."""

    max_attempts: int = Field(default=5, ge=1)
    base_delay_s: float = Field(default=1.0, ge=0)
    max_delay_s: float = Field(default=300.0, ge=0)
    jitter: float = Field(default=0.2, ge=0, le=1)
    max_interruptions: int = Field(default=3, ge=0)

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            self.max_attempts,
            self.base_delay_s,
            self.max_delay_s,
            self.jitter,
            self.max_interruptions,
        )


class DispatchConfig(_Model):
    """The dispatcher's timing."""

    signal_interval_s: float = Field(default=1.0, gt=0)
    """How often each target's utilisation is read and the release rule applied: the paper's
    periodic capacity signal. Each signal releases at most two items on a shared target."""
    maintenance_interval_s: float = Field(default=1.0, gt=0)
    """Validation, lease recovery, expiry and finalisation run this often."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest an engine may take for one item."""
    lease_s: float = Field(default=660.0, gt=0)
    """An in-flight item returns to its queue if not settled within this; must exceed the request
    timeout so a slow but live request is not dispatched twice."""
    commit_batch: int = Field(default=256, ge=1)
    """Results committed per store transaction (one fsync for many items)."""
    single_replica: bool | None = None
    """Only one batch process runs against the store, so at startup every in-flight item is
    the previous process's and returns to its queue at once instead of after its lease. Unset, it
    follows the store (`BatchServiceConfig.single_replica`): true for SQLite, false for Redis,
    whose point is several replicas: there a restarting replica would take back the items a live
    one is still running and send them a second time."""
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    """On SIGTERM, wait this long for in-flight items; the rest are re-queued on next start."""

    @model_validator(mode="after")
    def _lease_covers_request(self) -> DispatchConfig:
        if self.lease_s <= self.request_timeout_s:
            raise ValueError("dispatch.lease_s must be greater than dispatch.request_timeout_s")
        return self


class EngineMetricsSourceConfig(_Model):
    """Utilisation read from a /metrics page: an engine's own (vLLM KV-cache usage), or a
    sidecar's (`fleetwarden_kv_cache_utilization`, e.g. through the serving Service, which
    samples one pod per read; see `utilisation.kv_cache_usage`)."""

    kind: Literal["engine_metrics"] = "engine_metrics"
    url: str
    timeout_s: float = Field(default=2.0, gt=0)
    max_age_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """How old the engine's reading can be: 0, it is read live. See
    `fleetwarden.batch.policy.fresh_reading`."""


class PrometheusSourceConfig(_Model):
    """Utilisation from Prometheus: the planner's query, `$model` and `$region` substituted."""

    kind: Literal["prometheus"] = "prometheus"
    url: str
    query: str
    timeout_s: float = Field(default=5.0, gt=0)
    max_age_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """How old the newest sample behind a reading can be, at most the metric's scrape interval
    (the chart's ServiceMonitor scrapes every 30 s). When above 0, after a release the rule acts
    again only on a reading at least this much later, one that can show the released items (see
    `fleetwarden.batch.policy.fresh_reading`). Off (0) by default: at 30 s a shared region would
    take at most 2 items per 30 s, too few to fill spare capacity with items lasting seconds;
    without it a stale low reading can fill `max_in_flight`, which the sidecar then holds behind
    interactive traffic (tier `niw`). Set it where that matters more than NIW throughput."""


SourceConfig = Annotated[
    EngineMetricsSourceConfig | PrometheusSourceConfig, Field(discriminator="kind")
]


class TargetConfig(_Model):
    """Where one (model, region) queue's items go."""

    model: str = Field(pattern=_NAME)
    region: str = Field(pattern=_NAME)
    kind: TargetKind = TargetKind.SHARED
    base_url: str
    """Server root (the item's url, e.g. /v1/chat/completions, is appended)."""
    max_in_flight: int = Field(default=32, ge=1)
    """Most items this target runs at once, promoted items included."""
    api_key: str | None = None
    """Bearer token sent to the target, if it wants one."""
    tenant_header: str = TENANT_HEADER
    """Header the batch's tenant is sent in: the one the target's sidecar trusts (its
    ModelDeployment's `spec.sidecar.tenantHeader`; `fleetwarden batch-targets` writes it). Any
    other and the sidecar counts and schedules every item as tenant `default`. Stored lowercase."""
    utilisation: SourceConfig | None = None
    """Capacity signal; required for shared targets (spot targets run NIW only)."""
    release: ReleaseConfig | None = None
    """This target's release rule (its ModelDeployment's `niw.releaseAt` and
    `promoteAfterSeconds`; `fleetwarden batch-targets` writes it); empty uses the top-level
    `release`."""

    @field_validator("tenant_header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        problem = tenant_header_problem(value)
        if problem is not None:
            raise ValueError(f"tenant_header: {problem}")
        return value.lower()

    @model_validator(mode="after")
    def _signal_for_shared(self) -> TargetConfig:
        if self.kind is TargetKind.SHARED and self.utilisation is None:
            raise ValueError(f"target {self.model}/{self.region}: shared targets need utilisation")
        return self

    @property
    def queue(self) -> QueueKey:
        return QueueKey(self.model, self.region)

    @property
    def name(self) -> str:
        return f"{self.model}/{self.region}/{self.kind.value}"


class MetricsConfig(_Model):
    due_buckets_s: list[float] = Field(
        default_factory=lambda: [3600.0, 2 * 3600.0, 4 * 3600.0, 8 * 3600.0, 12 * 3600.0, 86400.0]
    )
    """Horizons of the cumulative deadline profile (spot sizing input)."""


class BatchServiceConfig(_Model):
    """The whole file."""

    listen: str = "127.0.0.1:8090"
    """host:port; `--listen` overrides it."""
    store: StoreConfig = Field(default_factory=SqliteStoreConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    quotas: QuotasConfig = Field(default_factory=QuotasConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    release: ReleaseConfig = Field(default_factory=ReleaseConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    dispatch: DispatchConfig = Field(default_factory=DispatchConfig)
    targets: list[TargetConfig] = Field(default_factory=list)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @model_validator(mode="after")
    def _consistent(self) -> BatchServiceConfig:
        seen = set()
        for target in self.targets:
            if target.name in seen:
                raise ValueError(f"target {target.name} appears twice")
            seen.add(target.name)
        tenants = set(self.auth.digests().values())
        unknown = set(self.quotas.tenants) - tenants
        if unknown:
            raise ValueError(f"quotas for tenants without a token: {sorted(unknown)}")
        return self

    @property
    def single_replica(self) -> bool:
        """Whether a starting process re-queues every lease in the store (`dispatch`'s setting,
        else true for SQLite and false for Redis)."""
        given = self.dispatch.single_replica
        return self.store.kind == "sqlite" if given is None else given

    def quota(self, tenant: str) -> QuotaConfig:
        return self.quotas.tenants.get(tenant, self.quotas.default)

    def models(self) -> set[str]:
        return {t.model for t in self.targets}

    def regions(self, model: str) -> list[str]:
        """The model's regions in file order; the first is its home region."""
        found: list[str] = []
        for target in self.targets:
            if target.model == model and target.region not in found:
                found.append(target.region)
        return found

    def queues(self) -> list[QueueKey]:
        return sorted({t.queue for t in self.targets})

    @classmethod
    def load(cls, path: Path, overlays: Sequence[Path] = ()) -> BatchServiceConfig:
        """Read a YAML or JSON file (JSON is YAML, but a .json file gets JSON's error messages),
        then deep-merge each overlay file over it.

        Overlays exist for secrets: in Kubernetes the config is a ConfigMap and the bearer tokens
        (and a Redis URL with its password) an overlay mounted from a Secret, so neither file
        holds the other's content.
        """
        raw = _read(path)
        for overlay in overlays:
            raw = _merged(raw, _read(overlay))
        return cls.model_validate(raw)


def _read(path: Path) -> dict[str, Any]:
    text = path.read_text()
    raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the config must be a mapping")
    return raw


def _merged(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` over `base`: mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged
