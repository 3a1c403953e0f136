"""`fleetwarden sidecar`: the fair-scheduling proxy in front of one inference engine."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetwarden.fairness.config import FairnessConfig


def run(args: argparse.Namespace) -> int:
    """Load settings and the fairness config, then serve until stopped; exit 2 on bad input."""
    from aiohttp import web

    from fleetwarden.common.passthrough import DEFAULT_PASSTHROUGH
    from fleetwarden.fairness.render import standalone_config
    from fleetwarden.sidecar.app import build_app
    from fleetwarden.sidecar.native_relay import RELAY_NICE
    from fleetwarden.sidecar.secret_watch import FileStamp, stamp_of
    from fleetwarden.sidecar.settings import (
        ADMIN_TOKEN_ENV,
        INTERACTION_SECRET_ENV,
        SettingsError,
        SidecarSettings,
        parse_listen,
        read_secret,
    )

    stamps: dict[Path, FileStamp | None] = {}

    def startup_secret(path: Path | None, env: str) -> str | None:
        if path is not None:  # stamped before the read: the watcher sees every later swap
            stamps[path.absolute()] = stamp_of(path)
        return read_secret(path, env)

    try:
        host, port = parse_listen(args.listen)
        secret = startup_secret(args.interaction_secret_file, INTERACTION_SECRET_ENV)
        settings = SidecarSettings(
            engine_url=args.engine_url,
            host=host,
            port=port,
            config_path=args.config,
            served_model=args.served_model,
            region=args.region,
            admin_token=startup_secret(args.admin_token_file, ADMIN_TOKEN_ENV),
            interaction_secret=(secret or "").encode(),
            admin_token_file=args.admin_token_file,
            interaction_secret_file=args.interaction_secret_file,
            secret_stamps=stamps,
            default_max_tokens=args.default_max_tokens,
            forward_priority=args.forward_priority,
            passthrough=(
                DEFAULT_PASSTHROUGH if args.passthrough is None else tuple(args.passthrough)
            ),
            queue_per_tenant=args.queue_per_tenant,
            queue_total=args.queue_total,
            forget_idle_tenants_after_s=args.forget_idle_tenants_after,
            max_idle_tenants=args.max_idle_tenants,
            max_tenant_labels=args.max_tenant_labels,
            max_app_labels=args.max_app_labels,
            relay=args.relay,
            relay_nice=RELAY_NICE if args.relay_nice is None else args.relay_nice,
        )
        if args.config is not None and args.config.exists():
            config = _read_config(args.config)
        elif args.config is not None:
            raise SettingsError(f"config file {args.config} does not exist")
        else:
            config = standalone_config(args.served_model)
    except (SettingsError, ValueError, OSError) as exc:
        print(f"fleetwarden sidecar: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from fleetwarden.common.open_files import raise_open_files_limit

    before, after = raise_open_files_limit()
    if after != before:
        logging.getLogger(__name__).info(
            "open files soft limit raised from %d to %d", before, after
        )
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is optional (absent on Windows)
        pass
    app = build_app(settings, config)

    async def freeze_startup_heap(app: web.Application) -> None:
        # Everything imported and built by now lives as long as the process: frozen, the cyclic
        # collector no longer walks it, so a later full collection (20-25 ms for the whole heap
        # here, on the event loop, in front of every waiting request) walks only what serving
        # created. A start-up hook, so that only a process that serves freezes its heap (a
        # caller that builds the app in-process, as tests do, keeps its own collector as it is).
        gc.collect()
        gc.freeze()

    app.on_startup.append(freeze_startup_heap)
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        handler_cancellation=True,
        access_log=None,
        print=None,
    )
    return 0


def _read_config(path: Path) -> FairnessConfig:
    """The fairness config file, or a SettingsError naming it: the JSON and pydantic messages say
    where in a document the problem is but not which file, and are several lines long."""
    from fleetwarden.fairness.config import FairnessConfig
    from fleetwarden.sidecar.settings import SettingsError

    try:
        text = path.read_text()
        if not isinstance(json.loads(text), dict):
            raise ValueError("not a JSON object (the document the operator writes)")
        return FairnessConfig.from_document(text)
    except (ValueError, OSError) as exc:  # UnicodeDecodeError and JSON errors are ValueErrors
        raise SettingsError(f"--config {path}: {' '.join(str(exc).split())}") from exc


def register(commands: Any) -> None:
    """Add the `sidecar` subcommand to the top-level parser's subparsers."""
    sc = commands.add_parser("sidecar", help="run the fair-scheduling proxy in front of an engine")
    sc.add_argument("--engine-url", default="http://127.0.0.1:8000")
    sc.add_argument("--listen", default="0.0.0.0:8080", help="HOST:PORT")
    sc.add_argument("--config", type=Path, help="fairness config JSON (the ConfigMap mount)")
    sc.add_argument("--served-model", default="model", help="model label when no config is given")
    sc.add_argument("--region", default="local", help="region label of the metrics")
    sc.add_argument("--admin-token-file", type=Path, help="file with the admin bearer token")
    sc.add_argument(
        "--interaction-secret-file", type=Path, help="file with the interaction-token HMAC key"
    )
    sc.add_argument("--default-max-tokens", type=int, default=1024)
    sc.add_argument("--forward-priority", action="store_true", help="pass vLLM's priority field")
    sc.add_argument(
        "--passthrough",
        action="append",
        metavar="'METHOD /v1/PATH'",
        help="an engine route passed through unscheduled (repeatable; replaces the default"
        " 'GET /v1/models', 'GET /v1/models/**'; '' allows none)",
    )
    sc.add_argument("--queue-per-tenant", type=int, default=1024)
    sc.add_argument("--queue-total", type=int, default=16384)
    sc.add_argument(
        "--forget-idle-tenants-after",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="drop the fairness state of a tenant idle this long (default 600)",
    )
    sc.add_argument(
        "--max-idle-tenants",
        type=int,
        default=100_000,
        help="most idle tenants whose fairness state is kept (default 100000)",
    )
    sc.add_argument(
        "--max-tenant-labels",
        type=int,
        default=1000,
        help="tenants outside the config with their own metrics label; the rest are _other",
    )
    sc.add_argument(
        "--max-app-labels",
        type=int,
        default=100,
        help="applications outside the config with their own metrics label (default 100)",
    )
    sc.add_argument(
        "--relay",
        choices=("auto", "native", "python"),
        default="auto",
        help="who forwards streamed bodies: the C relay (native), Python, or the C relay where "
        "it is built and can run (auto, the default)",
    )
    sc.add_argument(
        "--relay-nice",
        type=int,
        default=None,
        help="niceness of the C relay's thread, 0-19 (default 19: on a shared core it yields to "
        "the event loop, so a new request is not held up by token events)",
    )
    sc.set_defaults(func=run)
