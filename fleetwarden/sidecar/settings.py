"""How one sidecar is run: where the engine is, where to listen, secrets, bounds and timeouts.

Every bound has a default a production pod can live with, and secrets are read from files (the
chart mounts a Secret) so they never appear in the pod spec or the process list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleetwarden.common.passthrough import (
    DEFAULT_PASSTHROUGH,
    PassthroughError,
    parse_passthrough,
)
from fleetwarden.sidecar.identity import MIN_INTERACTION_SECRET_BYTES
from fleetwarden.sidecar.native_relay import RELAY_MODES, RELAY_NICE, why_not_native
from fleetwarden.sidecar.secret_watch import FileStamp

INTERACTION_SECRET_ENV = "FLEETWARDEN_INTERACTION_SECRET"
ADMIN_TOKEN_ENV = "FLEETWARDEN_ADMIN_TOKEN"


class SettingsError(ValueError):
    """A sidecar setting is missing or impossible."""


@dataclass(frozen=True)
class SidecarSettings:
    engine_url: str = "http://127.0.0.1:8000"
    host: str = "0.0.0.0"
    port: int = 8080
    config_path: Path | None = None
    """The fairness config (the ConfigMap mount); pushed configs replace it in memory."""
    served_model: str = "model"
    """Model label of metrics when no config names it."""
    region: str = "local"
    admin_token: str | None = None
    """Bearer token of the admin API; None disables the admin routes (403)."""
    interaction_secret: bytes = b""
    """HMAC key of interaction tokens; empty: a random per-process key (tokens die on restart)."""
    admin_token_file: Path | None = None
    """Where `admin_token` was read from; re-read when the mounted Secret changes."""
    interaction_secret_file: Path | None = None
    """Where `interaction_secret` was read from; re-read (and the key rotated) on change."""
    secret_stamps: Mapping[Path, FileStamp | None] = field(default_factory=dict)
    """Per secret file (absolute path), its `secret_watch.stamp_of` taken just before the
    start-up read: the watcher's baseline, so a swap right after start-up is not missed."""
    secret_poll_s: float = 10.0
    """How often the secret files are checked for a change (the kubelet syncs within ~1 min)."""
    interaction_ttl_s: float = 900.0
    default_max_tokens: int = 1024
    """Output budget assumed for requests that do not set max_tokens (for the capacity gate)."""
    forward_priority: bool = False
    """Forward vLLM's `priority` field; off by default so clients cannot jump the fair queue."""
    max_body_bytes: int = 8 * 1024 * 1024
    passthrough: tuple[str, ...] = DEFAULT_PASSTHROUGH
    """Engine routes other than the scheduled ones clients may call, unscheduled, as
    `METHOD /v1/path` entries (`PassthroughRoute`); any other /v1 route is answered 404."""
    queue_per_tenant: int = 1024
    queue_total: int = 16384
    max_queue_wait_s: float = 600.0
    """A request still queued after this long is answered 429 instead of waiting forever."""
    forget_idle_tenants_after_s: float = 600.0
    """A tenant with nothing queued or running this long is forgotten by the scheduler
    (`fairness.idle`): tenants taken from the `user` field must not accumulate."""
    max_idle_tenants: int = 100_000
    """Most idle tenants the scheduler keeps state for; the longest idle go first beyond it."""
    max_tenant_labels: int = 1000
    """Tenants not named in the config that get their own metrics label; later ones share
    `_other` (`sidecar.metric_labels`), so a client cannot grow the series without bound."""
    max_app_labels: int = 100
    """The same for applications not named in the config."""
    engine_connect_timeout_s: float = 5.0
    engine_response_timeout_s: float = 600.0
    """Most time from dispatch to the engine's response headers (non-streaming: the whole body)."""
    engine_idle_timeout_s: float = 120.0
    """Most time between two chunks of a streamed response."""
    telemetry_interval_s: float = 0.25
    telemetry_timeout_s: float = 2.0
    relay: str = "auto"
    """Who forwards streamed bodies: `native` the C relay (`native_relay`), `python` the Python
    one, `auto` the C relay where it is built and can run, else Python. Same answers either way."""
    relay_nice: int = RELAY_NICE
    """The C relay thread's niceness (0-19). At 19 it yields a shared core to the event loop,
    whose admission work a new request waits for, and takes what the loop leaves; with a core
    of its own (a sidecar with 2+ CPUs) it makes no difference (docs/sidecar.md)."""

    def __post_init__(self) -> None:
        if not self.engine_url.startswith(("http://", "https://")):
            raise SettingsError(f"engine URL must be http(s)://..., got {self.engine_url!r}")
        if not 0 < self.port < 65536:
            raise SettingsError(f"port out of range: {self.port}")
        positive = {
            "default_max_tokens": self.default_max_tokens,
            "max_body_bytes": self.max_body_bytes,
            "queue_per_tenant": self.queue_per_tenant,
            "queue_total": self.queue_total,
            "max_queue_wait_s": self.max_queue_wait_s,
            "engine_connect_timeout_s": self.engine_connect_timeout_s,
            "engine_response_timeout_s": self.engine_response_timeout_s,
            "engine_idle_timeout_s": self.engine_idle_timeout_s,
            "telemetry_interval_s": self.telemetry_interval_s,
            "interaction_ttl_s": self.interaction_ttl_s,
            "secret_poll_s": self.secret_poll_s,
            "forget_idle_tenants_after_s": self.forget_idle_tenants_after_s,
        }
        for name, value in positive.items():
            if not value > 0:  # not `value <= 0`: NaN must fail too
                raise SettingsError(f"{name} must be > 0, got {value}")
        for name, count in {
            "max_idle_tenants": self.max_idle_tenants,
            "max_tenant_labels": self.max_tenant_labels,
            "max_app_labels": self.max_app_labels,
        }.items():
            if count < 0:
                raise SettingsError(f"{name} must be >= 0, got {count}")
        if self.relay not in RELAY_MODES:
            raise SettingsError(
                f"relay must be one of {', '.join(RELAY_MODES)}, not {self.relay!r}"
            )
        if not 0 <= self.relay_nice <= 19:
            raise SettingsError(f"relay_nice must be between 0 and 19, got {self.relay_nice}")
        if self.relay == "native" and (reason := why_not_native(self.engine_url)) is not None:
            raise SettingsError(f"relay native: {reason}")
        if isinstance(self.passthrough, str):  # a lone entry would be iterated as characters
            raise SettingsError("passthrough must be a sequence of 'METHOD /v1/path' entries")
        try:
            parse_passthrough(self.passthrough)
        except PassthroughError as exc:
            raise SettingsError(str(exc)) from None
        if self.interaction_secret and len(self.interaction_secret) < MIN_INTERACTION_SECRET_BYTES:
            raise SettingsError(
                f"the interaction secret must be at least {MIN_INTERACTION_SECRET_BYTES} bytes"
            )


def read_secret(path: Path | None, env: str) -> str | None:
    """A secret from a mounted file (preferred) or an environment variable; None when unset."""
    if path is not None:
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise SettingsError(f"cannot read secret file {path}: {exc.strerror}") from exc
        return text or None
    return os.environ.get(env) or None


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) into its parts."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SettingsError(f"--listen must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)
