"""Run the real sidecar and the stub engine on 127.0.0.1 inside a test's event loop.

Both are the production aiohttp applications (`build_app`, `StubEngine.app`) served by aiohttp's
own runner on free ports, so requests cross real sockets and real HTTP parsing. Only the GPU is
replaced: the stub engine's continuous batching is the simulator's engine model in real time.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from aiohttp import web

from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.render import standalone_config
from fleetwarden.sidecar.app import STATE, SidecarState, build_app
from fleetwarden.sidecar.settings import SidecarSettings
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.profiles import VTC_A10G
from fleetwarden.sim.stub_engine import StubEngine
from tests.support.relay_mode import relay_under_test

ADMIN_TOKEN = "test-admin-token-0123456789"
SECRET = b"test-interaction-secret-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Served:
    url: str
    runner: web.AppRunner


@contextlib.asynccontextmanager
async def serve(
    app: web.Application, host: str = "127.0.0.1", port: int | None = None
) -> AsyncIterator[Served]:
    """Serve `app` on `host` (any 127.x.y.z works on Linux: several "pods" can share a port)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    port = port or free_port()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        yield Served(f"http://{host}:{port}", runner)
    finally:
        await runner.cleanup()


@dataclass
class StubHandle:
    url: str
    engine: StubEngine


@contextlib.asynccontextmanager
async def running_stub(
    profile: EngineProfile = VTC_A10G, *, time_scale: float = 1.0, model: str = "stub-model"
) -> AsyncIterator[StubHandle]:
    engine = StubEngine(profile, model=model, time_scale=time_scale)
    async with serve(engine.app()) as served:
        yield StubHandle(served.url, engine)


@dataclass
class SidecarHandle:
    url: str
    state: SidecarState

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def fairness_config(served_model: str = "stub-model", **changes: object) -> FairnessConfig:
    """The standalone config with `changes` applied (pydantic copy, validated)."""
    base = standalone_config(served_model)
    return FairnessConfig.model_validate({**base.model_dump(), **changes})


@contextlib.asynccontextmanager
async def running_sidecar(
    engine_url: str,
    config: FairnessConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    **settings: object,
) -> AsyncIterator[SidecarHandle]:
    base = SidecarSettings(
        engine_url=engine_url,
        admin_token=ADMIN_TOKEN,
        interaction_secret=SECRET,
        telemetry_interval_s=0.05,
        relay=relay_under_test(),
    )
    app = build_app(replace(base, **settings), config or fairness_config())  # type: ignore[arg-type]
    async with serve(app, host, port) as served:
        yield SidecarHandle(served.url, app[STATE])
