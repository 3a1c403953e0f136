"""ModelDeployment: one model served from several RegionPools.

The operator turns each `regions[]` entry into a serving Deployment (engine + fleetwarden sidecar), a
Service and a ConfigMap holding the sidecar's fairness config. Replicas start at `minInstances`; the
planner and the scaling strategy move them within [minInstances, maxInstances].
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from fleetwarden.api.enums import PolicyName, ScalingStrategy
from fleetwarden.api.v1alpha1.common import (
    ApiModel,
    Condition,
    ContainerResources,
    DnsLabel,
    DnsSubdomain,
    EnvVar,
    FiniteFloat,
    NonEmptyName,
    list_map,
    validations,
)
from fleetwarden.common.passthrough import parse_passthrough

DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.11.0"

SERVICE_PORT = 80
"""Port of each region's Service that clients call (it targets the sidecar). The Service also
exposes the sidecar's own port, as `metrics`, so `sidecar.port` may not be this one: two Service
ports with one port number and protocol are refused by the API server."""


class EngineSpec(ApiModel):
    """The inference engine container (vLLM's OpenAI server by default)."""

    image: str = Field(default=DEFAULT_ENGINE_IMAGE, min_length=1)
    """Engine container image."""
    args: list[str] = Field(default_factory=list, max_length=128)
    """Extra engine arguments, appended after the model name and port."""
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, json_schema_extra=list_map("name")
    )
    """Extra environment variables for the engine."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port the engine listens on inside the pod (the sidecar proxies to it)."""
    resources: ContainerResources = Field(default_factory=ContainerResources)
    """CPU and memory for the engine; GPUs come from gpusPerInstance."""


class ModelSpec(ApiModel):
    """What is served."""

    name: NonEmptyName
    """Model to load, as the engine names it (e.g. a Hugging Face id or a local path)."""
    served_name: str | None = Field(default=None, min_length=1, max_length=253)
    """Name clients use in the OpenAI `model` field; defaults to `name`."""
    gpus_per_instance: int = Field(default=1, ge=1, le=64)
    """GPUs one serving instance (pod) uses, e.g. the tensor-parallel degree."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """The engine container."""


class RegionPlacement(ApiModel):
    """Serve the model from one RegionPool."""

    model_config = {
        "json_schema_extra": validations(
            ("self.minInstances <= self.maxInstances", "minInstances must be <= maxInstances"),
        )
    }

    pool: DnsLabel
    """Name of the RegionPool."""
    min_instances: int = Field(default=1, ge=0, le=10000)
    """Fewest instances kept in this region, whatever the forecast says."""
    max_instances: int = Field(ge=1, le=10000)
    """Most instances in this region."""

    @model_validator(mode="after")
    def _min_le_max(self) -> RegionPlacement:
        if self.min_instances > self.max_instances:
            raise ValueError("minInstances must be <= maxInstances")
        return self


class ForecastSettings(ApiModel):
    """The hourly load forecast (SageServe section 6.3)."""

    model_config = {
        "json_schema_extra": validations(
            (
                "self.horizonSeconds % self.stepSeconds == 0",
                "horizonSeconds must be a multiple of stepSeconds",
            ),
        )
    }

    history_days: int = Field(default=7, ge=1, le=60)
    """Days of history the model is fitted on."""
    step_seconds: int = Field(default=300, ge=10, le=3600)
    """Sample step of the tokens/s series."""
    horizon_seconds: int = Field(default=3600, ge=60, le=86400)
    """How far ahead each plan looks."""
    order: list[int] | None = Field(default=None, min_length=3, max_length=3)
    """ARIMA (p, d, q); empty chooses by AIC over a small grid."""
    niw_buffer: float = Field(default=0.10, ge=0, le=1)
    """Fraction of the last hour's NIW tokens/s added to the forecast peak (SageServe's beta)."""

    @model_validator(mode="after")
    def _whole_steps(self) -> ForecastSettings:
        if self.horizon_seconds % self.step_seconds:
            raise ValueError("horizonSeconds must be a multiple of stepSeconds")
        return self


class ScalingSettings(ApiModel):
    """How instances move between plans (SageServe sections 5 and 6.4)."""

    model_config = {
        "json_schema_extra": validations(
            (
                "self.scaleInUtilization < self.scaleOutUtilization",
                "scaleInUtilization must be < scaleOutUtilization",
            ),
            ("self.downFactor < self.upFactor", "downFactor must be < upFactor"),
        )
    }

    strategy: ScalingStrategy = ScalingStrategy.LT_UA
    """reactive, lt-i, lt-u or lt-ua."""
    scale_out_utilization: float = Field(default=0.70, gt=0, le=1)
    """KV-cache utilisation above which an instance is added."""
    scale_in_utilization: float = Field(default=0.30, ge=0, lt=1)
    """KV-cache utilisation below which an instance is removed."""
    cooldown_seconds: int = Field(default=15, ge=1, le=3600)
    """Least time between two scaling events of one region."""
    scale_in_stabilization_seconds: int = Field(default=0, ge=0, le=3600)
    """Scale-in stabilization window: remove an instance only after the strategy has asked to
    remove one at every evaluation for at least this long (cooldown holds do not count either
    way); any other answer, or missing utilization, restarts the window. Scale-out and the
    min/max bounds never wait for it. 0 (the default) removes at the first ask."""
    epsilon: float = Field(default=1.0, gt=0, le=1)
    """Fraction of its own forecast peak each region must serve locally; the rest may be rerouted."""
    last_window_minutes: int = Field(default=20, ge=0, le=60)
    """LT-UA: in the last minutes of the hour, scaling may pass the plan's target."""
    up_factor: FiniteFloat = Field(default=5.0, gt=1)
    """LT-UA: pass the target upward when observed load >= upFactor x forecast."""
    down_factor: float = Field(default=0.5, gt=0, lt=1)
    """LT-UA: pass the target downward when observed load <= downFactor x forecast."""
    forecast: ForecastSettings = Field(default_factory=ForecastSettings)
    """The forecaster."""

    @model_validator(mode="after")
    def _ordered(self) -> ScalingSettings:
        if self.scale_in_utilization >= self.scale_out_utilization:
            raise ValueError("scaleInUtilization must be < scaleOutUtilization")
        return self


class TierTargets(ApiModel):
    """Latency targets of one interactive tier."""

    ttft_seconds: float = Field(gt=0, le=3600)
    """Time-to-first-token target."""
    tbt_seconds: float = Field(default=0.05, gt=0, le=60)
    """Time-between-tokens target (the fluidity index's per-token deadline)."""


class TierSettings(ApiModel):
    """Service-level targets per tier (SageServe's IW-F and IW-N; NIW deadlines are in `niw`)."""

    iw_f: TierTargets = Field(default_factory=lambda: TierTargets(ttft_seconds=1.0), alias="iwF")
    """Interactive fast."""
    iw_n: TierTargets = Field(default_factory=lambda: TierTargets(ttft_seconds=10.0), alias="iwN")
    """Interactive normal."""


class NiwSpotSettings(ApiModel):
    """Spot Deployments that run NIW backlog on the pools' spot nodes."""

    enabled: bool = False
    """Create a spot Deployment per region whose replicas follow the NIW backlog."""
    max_instances: int = Field(default=4, ge=0, le=10000)
    """Most spot instances per region."""


class NiwSettings(ApiModel):
    """Non-interactive work (SageServe sections 6.1 and 6.2)."""

    model_config = {
        "json_schema_extra": validations(
            (
                "self.releaseAt[0] > self.releaseAt[1]",
                "releaseAt must be [one-item, two-item] thresholds, first higher",
            ),
        )
    }

    release_at: list[float] = Field(
        default_factory=lambda: [0.60, 0.50], min_length=2, max_length=2
    )
    """Utilisation below which one NIW item is released per signal, then below which two are."""
    promote_after_seconds: int = Field(default=36000, ge=0)
    """Age after which a queued NIW item is promoted to interactive priority."""
    deadline_seconds: int = Field(default=86400, ge=60)
    """Deadline, counted from arrival, of the simulator's NIW items whose workload sets none.
    Used by the simulator only; the operator and the batch service do not read it: a real
    batch's items are due at the end of its own `completion_window` (24h when left out)."""
    spot: NiwSpotSettings = Field(default_factory=NiwSpotSettings)
    """Spot capacity for NIW work."""

    @model_validator(mode="after")
    def _ordered(self) -> NiwSettings:
        for value in self.release_at:
            if not 0 <= value <= 1:
                raise ValueError("releaseAt values must be within [0, 1]")
        if self.release_at[0] <= self.release_at[1]:
            raise ValueError("releaseAt must be [one-item, two-item] thresholds, first higher")
        return self


class CapacityGateSettings(ApiModel):
    """When the sidecar may hand the engine another request."""

    max_inflight_tokens: int | None = Field(default=None, ge=1)
    """In-flight token budget (prompt + expected output, at the staggered peak). Empty: no token
    budget; the gate then admits by the engine's waiting queue alone (`maxWaitingRequests`, from
    telemetry no older than `telemetryMaxAgeSeconds`)."""
    max_waiting_requests: int = Field(default=0, ge=0)
    """Dispatch only while the engine's own waiting queue holds at most this many requests."""
    telemetry_max_age_seconds: float = Field(default=5.0, gt=0, le=600)
    """Engine metrics older than this count as saturated."""


_SIDECAR_PORT_IS_SERVICE_PORT = (
    f"port must not be {SERVICE_PORT}: the Service serves clients on port {SERVICE_PORT} and "
    "also exposes the sidecar's port (as metrics)"
)
_SIDECAR_PORT_IS_ENGINE_PORT = (
    "sidecar.port must differ from model.engine.port: both containers share the pod's network"
)


PassthroughEntry = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[A-Z]+ /v1/[^\s?#%\\]+$")
]
"""`METHOD /v1/path`; the CRD checks the shape, the model the sidecar's full rules."""


class SidecarSettings(ApiModel):
    """The fleetwarden scheduler sidecar in every serving pod."""

    model_config = {
        "json_schema_extra": validations(
            (f"self.port != {SERVICE_PORT}", _SIDECAR_PORT_IS_SERVICE_PORT),
        )
    }

    image: str | None = Field(default=None, min_length=1)
    """Sidecar image; empty uses the operator's default (`--sidecar-image`)."""
    port: int = Field(default=8080, ge=1, le=65535)
    """Port the sidecar container listens on; the region's Service sends clients' calls on port 80
    to it and also exposes it as port `metrics`. Not 80 (the Service would get two ports 80) and
    not `model.engine.port` (both containers share the pod's network)."""
    policy: PolicyName = PolicyName.FCFS
    """Policy used while no TenantPolicy selects this ModelDeployment."""
    capacity_gate: CapacityGateSettings = Field(default_factory=CapacityGateSettings)
    """The capacity gate."""
    tenant_header: str = Field(
        default="x-fleetwarden-tenant",
        min_length=1,
        max_length=128,
        pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$",
    )
    """Trusted header the gateway sets with the tenant's name: an HTTP field name (letters,
    digits and !#$%&'*+-.^_`|~), matched case-insensitively. The batch service sends its tenants
    in it too (`fleetwarden batch-targets` copies it into each target)."""
    forget_idle_tenants_seconds: float = Field(default=600.0, gt=0, le=7 * 86400)
    """Drop the fairness state of a tenant with nothing queued or running this long, so tenants
    taken from the OpenAI `user` field do not accumulate."""
    max_tenant_labels: int = Field(default=1000, ge=0, le=100_000)
    """Tenants outside the TenantPolicy that get their own metrics label; later ones are counted
    under `tenant="_other"`."""
    resources: ContainerResources = Field(
        default_factory=lambda: ContainerResources(cpu="1", memory="512Mi")
    )
    """CPU and memory for the sidecar."""
    passthrough: list[PassthroughEntry] | None = Field(default=None, max_length=32)
    """Engine routes clients may call through the sidecar unscheduled, as `METHOD /v1/path`
    (`*`: one path segment; a last `**`: one or more), for example `POST /v1/embeddings`. Empty
    (unset) keeps the sidecar's default, `GET /v1/models` and `GET /v1/models/**`; a list
    replaces it (`[]` allows none). Calls to these routes skip the fair scheduler, its limits and
    its capacity gate, so list only what should; a route that could match
    `/v1/chat/completions` or `/v1/completions` is refused."""

    relay: Literal["auto", "native", "python"] = "auto"
    """Who relays streamed responses in the sidecar: `auto` the C relay where the image has it
    (the fleetwarden image does), else Python; `python` the Python relay only (the way back if
    the C relay misbehaves); `native` the C relay, and the sidecar refuses to start without it.
    Clients see the same bytes either way (docs/sidecar.md)."""

    relay_nice: int | None = Field(default=None, ge=0, le=19)
    """Niceness of the C relay's thread, 0-19. Unset keeps the sidecar's default, 19: the relay
    yields the core to request admission, which lowers added first-token latency when the sidecar
    has one core to itself. Set 0 where another busy process shares the sidecar's CPU (a
    niceness-19 relay there gets little of it and streams stall); with 2 or more CPUs it makes no
    difference (docs/sidecar.md)."""

    @field_validator("passthrough")
    @classmethod
    def _routes(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            parse_passthrough(value)  # the sidecar's own rules: what passes here, it starts with
        return value

    @model_validator(mode="after")
    def _not_the_service_port(self) -> SidecarSettings:
        if self.port == SERVICE_PORT:
            raise ValueError(_SIDECAR_PORT_IS_SERVICE_PORT)
        return self


class SecretReference(ApiModel):
    """A Secret in the ModelDeployment's namespace, named as core/v1 LocalObjectReference does."""

    name: DnsSubdomain
    """Name of the Secret."""


class ModelDeploymentSpec(ApiModel):
    """Desired state of a ModelDeployment."""

    model_config = {
        "json_schema_extra": validations(
            ("size(self.throughput) > 0", "throughput needs at least one GPU type"),
            ("self.sidecar.port != self.model.engine.port", _SIDECAR_PORT_IS_ENGINE_PORT),
        )
    }

    model: ModelSpec
    """The model and its engine."""
    throughput: dict[str, FiniteFloat] = Field(
        json_schema_extra={"additionalProperties": {"type": "number", "exclusiveMinimum": 0}}
    )
    """Tokens/s one instance serves, per GPU type (SageServe's theta), e.g. {A100-80GB: 2400}."""
    startup_cost: FiniteFloat | None = Field(default=None, ge=0)
    """Cost of starting one instance (SageServe's sigma); empty derives it from load time x cost."""
    regions: list[RegionPlacement] = Field(
        min_length=1, max_length=64, json_schema_extra=list_map("pool")
    )
    """Pools to serve from, one serving Deployment each."""
    scaling: ScalingSettings = Field(default_factory=ScalingSettings)
    """Planning and scaling."""
    tiers: TierSettings = Field(default_factory=TierSettings)
    """Latency targets per tier."""
    niw: NiwSettings = Field(default_factory=NiwSettings)
    """Non-interactive work."""
    sidecar: SidecarSettings = Field(default_factory=SidecarSettings)
    """The scheduler sidecar."""
    image_pull_secrets: list[SecretReference] | None = Field(
        default=None, max_length=16, json_schema_extra=list_map("name")
    )
    """Secrets (kubernetes.io/dockerconfigjson, in this namespace) the serving pods pull the engine
    and sidecar images with, e.g. [{name: regcred}]. Unset leaves the serving pods' pull secrets
    alone (an operator upgrade rolls no pod for this field); [] removes ones set before."""

    @model_validator(mode="after")
    def _throughput_positive(self) -> ModelDeploymentSpec:
        if not self.throughput:
            raise ValueError("throughput needs at least one GPU type")
        for gpu, value in self.throughput.items():
            if value <= 0:
                raise ValueError(f"throughput[{gpu}] must be > 0")
        pools = [r.pool for r in self.regions]
        if len(set(pools)) != len(pools):
            raise ValueError("each pool may appear once in regions")
        if self.sidecar.port == self.model.engine.port:
            raise ValueError(_SIDECAR_PORT_IS_ENGINE_PORT)
        return self

    @property
    def served_name(self) -> str:
        """The name clients use in the OpenAI `model` field."""
        return self.model.served_name or self.model.name


class RegionStatus(ApiModel):
    """Observed state of one region of a ModelDeployment."""

    pool: str
    """The RegionPool."""
    region: str | None = None
    """The pool's region."""
    gpu_type: str | None = None
    """The pool's GPU type."""
    deployment: str | None = None
    """Name of the serving Deployment."""
    current: int = 0
    """Replicas the operator asks for now."""
    target: int | None = None
    """Replicas the last plan wants at the end of the hour."""
    ready: int = 0
    """Ready serving pods."""
    utilization: float | None = None
    """Mean KV-cache utilisation of the region's instances (0..1)."""
    scaling_reason: str | None = None
    """Why the scaler moved or held this region at the last reconcile: its decision's reason
    (utilisation-high, utilisation-low, cooldown, at-target, at-min, scale-in-stabilising, ...),
    missing-utilisation while it has no fresh reading; empty when autoscaling is off."""
    spot_replicas: int | None = None
    """Replicas of the region's spot Deployment, which follow the NIW backlog; empty without one."""
    last_forecast_peak: float | None = None
    """Tokens/s peak the last forecast expected."""
    last_forecast_time: str | None = None
    """When the last forecast ran (RFC 3339)."""
    last_plan_time: str | None = None
    """When the last plan ran (RFC 3339)."""


class ModelDeploymentStatus(ApiModel):
    """Observed state of a ModelDeployment, written by the operator only."""

    observed_generation: int | None = None
    """The .metadata.generation this status reflects."""
    regions: list[RegionStatus] = Field(
        default_factory=list, max_length=64, json_schema_extra=list_map("pool")
    )
    """Per region."""
    region_count: int = 0
    """Regions served."""
    instances: int = 0
    """Replicas asked for, over all regions."""
    target_instances: int | None = None
    """Replicas the last plan wants, over all regions."""
    ready_instances: int = 0
    """Ready serving pods, over all regions."""
    config_version: str | None = None
    """Version of the fairness config rendered into the ConfigMaps."""
    tenant_policy: str | None = None
    """TenantPolicy whose config is applied; empty means the sidecar's default policy."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=list_map("type")
    )
    """Ready, Progressing, Degraded, Planned, Scaling, ForecastHealthy."""


class ModelDeployment(ApiModel):
    """One model served across several RegionPools."""

    api_version: str = "fleetwarden.dev/v1alpha1"
    kind: str = "ModelDeployment"
    metadata: dict[str, object] = Field(default_factory=dict)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None
