"""A Kubernetes API server emulator for tests, built on kmock's ``KubernetesEmulator``.

Why not plain kmock: it cannot run Kopf end to end. It never sets
``resourceVersion`` (Kopf's finalizer JSON-patch ``test``s it and gets a 500),
ignores ``resourceVersion``/``timeoutSeconds`` on watches, label and field
selectors, ``generateName``, and the status subresource, answers POST with 200,
and does not make ``v1/namespaces`` discoverable (so Kopf never starts watching).

What is reused from kmock: its aiohttp server on a random 127.0.0.1 port, its
request objects and log (so kmock's DSL works for assertions, e.g.
``len(emu['patch'])``), its reaction DSL for fault injection (``emu['get
/api/v1/namespaces/default/configmaps/x'] << 500`` takes precedence over the
emulation), its error accounting (``strict=True`` fails the ``async with`` if
the emulator itself crashed), and ``emu.objects`` (kmock's versioned object
views with history, mirrored from every write).

What is replaced: request routing and the whole state machine. Where things live:
:mod:`~tests.support.kube_store` (write semantics, GC), :mod:`~tests.support.kube_watch`
(watch streams), :mod:`~tests.support.kube_collections` (selectors, lists, scale),
:mod:`~tests.support.kube_discovery` (discovery, OpenAPI), :mod:`~tests.support.kube_patch`,
:mod:`~tests.support.kube_schema` (CRD pruning/validation), :mod:`~tests.support.kube_protobuf`
(the protobuf bodies Helm sends), :mod:`~tests.support.kube_errors` (``Status`` bodies).

Usage (works in pytest and in any asyncio program)::

    async with KubeEmulator() as emu:
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        await emu.apply_crd(crd)
        ...
        mark = emu.mark()
        ...  # run the operator
        assert emu.writes_since(mark) == []

Namespaces: ``default``, ``kube-system``, ``kube-public`` and ``kube-node-lease``
exist. Creating an object in a missing namespace fails with 404 like the real
server, unless ``auto_create_namespaces=True``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
import pathlib
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import aiohttp
import aiohttp.web
import kmock
import yaml

from tests.support import kube_collections, kube_discovery, kube_protobuf
from tests.support import kube_errors as errors
from tests.support.kube_errors import ApiError
from tests.support.kube_resources import ResourceType, builtin_resources
from tests.support.kube_routing import Route, parse_route
from tests.support.kube_selectors import parse_label_selector
from tests.support.kube_store import ClusterState, DeleteOptions, WatchEvent
from tests.support.kube_watch import Notifier, WatchInfo, WatchOptions, serve_watch

__all__ = ["KubeEmulator", "RecordedRequest", "Route", "WatchInfo", "parse_route"]

logger = logging.getLogger(__name__)
_List = list  # the class defines a list() method, which shadows the builtin in annotations

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request as seen by the emulator, for assertions such as "no writes since X"."""

    method: str
    path: str
    query: Mapping[str, str]
    content_type: str
    body: Any

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS


def _json_response(body: Any, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json"
    )


class KubeEmulator(kmock.KubernetesEmulator):
    """An in-memory Kubernetes API server over plain HTTP on 127.0.0.1 (random port).

    Enter it with ``async with`` in the event loop that will talk to it: the
    server runs as part of that loop (blocking clients such as Helm must run
    in a thread, see :mod:`tests.support.helm_install`).
    """

    def __init__(
        self,
        *,
        namespaces: Iterable[str] = ("default", "kube-system", "kube-public", "kube-node-lease"),
        auto_create_namespaces: bool = False,
        bookmark_interval: float = 5.0,
        max_watch_timeout: float | None = None,
        history_limit: int = 100_000,
        gc_delay: float = 0.05,
        strict: bool = True,
    ) -> None:
        """Configure the emulated cluster.

        Args:
            namespaces: namespaces that exist from the start.
            auto_create_namespaces: create missing namespaces on first use instead of 404.
            bookmark_interval: seconds between BOOKMARK events on watches that allow them
                (the real server sends one about every minute; tests want them sooner).
            max_watch_timeout: close watches without ``timeoutSeconds`` after this long
                (``None``: keep them open until the client or the emulator goes away).
            history_limit: how many changes are kept for resuming watches; older
                resourceVersions answer 410 Gone, like after etcd compaction.
            gc_delay: seconds before the garbage collector deletes new objects whose
                owners never existed (cascades of real deletions are immediate).
            strict: fail the ``async with`` block if the emulator itself crashed on a
                request (an emulator bug must not pass silently as a 500).
        """
        super().__init__(strict=strict)
        self.bookmark_interval = bookmark_interval
        self.max_watch_timeout = max_watch_timeout
        self.gc_delay = gc_delay
        self.internal_errors: list[BaseException] = []
        self._log: list[RecordedRequest] = []
        self._notifier = Notifier()
        self._server: kmock.Server | None = None
        self._gc_handle: asyncio.TimerHandle | None = None
        self.state = ClusterState(
            resources=builtin_resources(),
            auto_create_namespaces=auto_create_namespaces,
            history_limit=history_limit,
            on_commit=self._on_commit,
        )
        ns_rt = self.state.lookup("", "v1", "namespaces")
        assert ns_rt is not None
        for namespace in namespaces:
            self.state.create(ns_rt, None, {"metadata": {"name": namespace}})

    def __attrs_post_init__(self) -> None:
        """Deliberately empty: kmock's fallback reactions are replaced by :meth:`_dispatch`."""

    # -- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> KubeEmulator:
        await super().__aenter__()
        self._server = kmock.Server(self)
        await self._server.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._notifier.close()
        if self._gc_handle is not None:
            self._gc_handle.cancel()
        try:
            if self._server is not None:
                await self._server.__aexit__(exc_type, exc_value, traceback)
                self._server = None
        finally:
            await super().__aexit__(exc_type, exc_value, traceback)

    @property
    def url(self) -> str:  # type: ignore[override]  # kmock's is a yarl.URL; a str suits kubeconfigs
        """``http://127.0.0.1:<port>`` (no trailing slash)."""
        if self._server is None:
            raise RuntimeError(
                "The emulator is not running: use `async with KubeEmulator() as emu:`."
            )
        return str(self._server.url).rstrip("/")

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        """A kubeconfig dict for this emulator: plain http, no credentials."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
                }
            ],
            "current-context": "emulator",
            "preferences": {},
        }

    def write_kubeconfig(
        self, path: str | pathlib.Path, namespace: str = "default"
    ) -> pathlib.Path:
        """Write :meth:`kubeconfig` as YAML to ``path`` and return the path."""
        target = pathlib.Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        return target

    # -- test-side helpers ------------------------------------------------------

    def _resource(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.state.lookup(group, version, plural)
        if rt is None:
            raise KeyError(f"{group}/{version}/{plural} is not served by the emulator")
        return rt

    def get(  # type: ignore[override]  # kmock's get(url) HTTP shortcut: use emu.request("GET", url)
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str | None = None,
    ) -> dict[str, Any] | None:
        """The current object (a deep copy), or ``None`` if it does not exist.

        This replaces kmock's ``get(url)`` HTTP shortcut; ``emu.request("GET", url)`` still works.
        """
        rt = self._resource(group, version, plural)
        obj = self.state.objects.get(self.state.key(rt, namespace, name))
        return copy.deepcopy(self.state.render(rt, obj)) if obj is not None else None

    def list(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> _List[dict[str, Any]]:
        """Current objects of a kind (all namespaces if ``namespace`` is None), in key order."""
        rt = self._resource(group, version, plural)
        check = parse_label_selector(label_selector)
        return [
            copy.deepcopy(self.state.render(rt, obj))
            for obj in self.state.select(rt, namespace, check)
        ]

    def create(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create an object directly (no HTTP request is logged), with full server semantics."""
        rt = self._resource_for(obj)
        ns = (
            namespace
            or (obj.get("metadata") or {}).get("namespace")
            or ("default" if rt.namespaced else None)
        )
        created = copy.deepcopy(self.state.create(rt, ns, obj))
        with contextlib.suppress(RuntimeError):  # no running loop: nothing can watch anyway
            self._schedule_gc()
        return created

    def delete_object(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str | None = None,
        propagation: str = "Background",
    ) -> dict[str, Any]:
        """Delete an object directly, honouring finalizers and cascading to owned objects."""
        rt = self._resource(group, version, plural)
        return copy.deepcopy(
            self.state.delete(rt, namespace, name, DeleteOptions(propagation=propagation))
        )

    async def apply_crd(self, crd: dict[str, Any]) -> dict[str, Any]:
        """Create (or replace) a CustomResourceDefinition; its kinds become servable at once."""
        rt = self._resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        name = crd["metadata"]["name"]
        if self.state.key(rt, None, name) in self.state.objects:
            body = copy.deepcopy(crd)
            body.get("metadata", {}).pop("resourceVersion", None)
            result = self.state.replace(rt, None, name, body)
        else:
            result = self.state.create(rt, None, crd)
        await asyncio.sleep(0)  # let watchers see it before the caller continues
        return copy.deepcopy(result)

    def _resource_for(self, obj: Mapping[str, Any]) -> ResourceType:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        for rt in self.state.resources.values():
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        raise KeyError(f"no resource serves apiVersion={api_version!r} kind={kind!r}")

    @property
    def resource_version(self) -> int:
        """The cluster-wide resourceVersion counter (every write increments it)."""
        return self.state.rv

    @property
    def resource_types(self) -> _List[ResourceType]:
        return list(self.state.resources.values())

    @property
    def requests(self) -> _List[RecordedRequest]:
        """Every request served so far, in arrival order."""
        return list(self._log)

    def mark(self) -> int:
        """A position in the request log, for :meth:`writes_since`."""
        return len(self._log)

    def writes_since(self, mark: int = 0) -> _List[tuple[str, str]]:
        """``(method, path)`` of write requests (POST/PUT/PATCH/DELETE) after ``mark``."""
        return [(r.method, r.path) for r in self._log[mark:] if r.is_write]

    @property
    def active_watches(self) -> _List[WatchInfo]:
        return list(self._notifier.watches.values())

    def notify(self) -> None:
        """Wake watches and ``wait_for`` pollers; every commit does this already.

        Only needed after mutating ``emu.state`` objects by hand, bypassing its methods.
        """
        self._notifier.notify()

    _notify = notify  # the name some early callers used

    def compact(self) -> None:
        """Simulate etcd compaction: watches resuming from older versions get 410 Gone."""
        self.state.compact()
        self._notifier.notify()

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 5.0) -> Any:  # noqa: ASYNC109
        """Wait until ``predicate()`` is truthy, re-checking after every change (no sleeping)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._notifier.changed
            result = predicate()
            if result:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout}s: {predicate!r}")
            with contextlib.suppress(TimeoutError):
                # Re-check at least every 50 ms: predicates may depend on more than the store.
                await asyncio.wait_for(changed.wait(), timeout=min(remaining, 0.05))

    # -- change notification & kmock mirroring ----------------------------------

    def _on_commit(self, event: WatchEvent, rt: ResourceType) -> None:
        preferred = self.state.by_storage(event.storage_key) or rt
        meta = event.obj["metadata"]
        key = (
            kmock.resource(preferred.group, preferred.version, preferred.plural),
            meta.get("namespace"),
            meta["name"],
        )
        snapshot = copy.deepcopy(self.state.render(preferred, event.obj))
        if event.type == "DELETED":
            if key in self._objects:
                self._objects[key].delete()
        elif key not in self._objects:
            self._objects[key] = snapshot
        elif event.type == "ADDED":
            self._objects[key].create(snapshot)
        else:
            self._objects[key].history.append(snapshot)
        self._notifier.notify()

    def _schedule_gc(self) -> None:
        if self.state._dangling_checks and self._gc_handle is None and not self._notifier.closing:

            def run() -> None:
                self._gc_handle = None
                self.state.collect_dangling()

            self._gc_handle = asyncio.get_running_loop().call_later(self.gc_delay, run)

    # -- HTTP entry point ---------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw_request.read()
        route = parse_route(raw_request.path)
        query = dict(raw_request.query)
        content_type = raw_request.headers.get("Content-Type", "")
        data: Any = None
        protobuf_error: str | None = None
        if body and content_type.startswith("application/vnd.kubernetes.protobuf"):
            try:
                data = kube_protobuf.decode(body)
            except ValueError as exc:  # ProtobufError, or UnicodeDecodeError on garbage
                protobuf_error = str(exc)
        elif body:
            try:
                data = json.loads(body)
            except ValueError:
                data = None
        self._log.append(
            RecordedRequest(raw_request.method, raw_request.path, query, content_type, data)
        )
        is_watch = (
            raw_request.method == "GET"
            and route is not None
            and route.level == "resource"
            and (route.watch_prefix or query.get("watch") in ("true", "1"))
        )
        request = kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=query,
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=body.decode("utf-8", "replace"),
            data=data,
            action=self._kmock_action(raw_request.method, route, is_watch),
            resource=(
                kmock.resource(route.group, route.version, route.plural)
                if route is not None and route.level == "resource"
                else None
            ),
            namespace=route.namespace if route else None,
            name=route.name if route else None,
            subresource=route.subresource if route else None,
        )
        self._requests.append(request)
        try:
            if self._payloads:  # user-defined reactions (fault injection) win over emulation
                with contextlib.suppress(NotImplementedError):
                    response: aiohttp.web.StreamResponse = await kmock.RawHandler._handle(
                        self, request
                    )
                    return response
            if protobuf_error is not None:
                raise errors.unsupported_media_type(
                    content_type, ["application/json", "application/yaml"]
                )
            return await self._dispatch(raw_request, route, query, body, data, is_watch)
        except ApiError as exc:
            return _json_response(exc.status(), exc.code)
        except Exception as exc:  # an emulator bug: answer 500, fail the test later
            logger.exception(
                "The emulator failed on %s %s", raw_request.method, raw_request.path_qs
            )
            self.internal_errors.append(exc)
            if self._errors:
                self._errors[-1].append(exc)
            return _json_response(errors.internal(repr(exc)).status(), 500)
        finally:
            if raw_request.method in WRITE_METHODS:
                self._schedule_gc()

    @staticmethod
    def _kmock_action(method: str, route: Route | None, is_watch: bool) -> kmock.action | None:
        if route is None or route.level != "resource":
            return None
        if is_watch:
            return kmock.action.WATCH
        if method == "GET":
            return kmock.action.FETCH if route.name else kmock.action.LIST
        return {
            "POST": kmock.action.CREATE,
            "PATCH": kmock.action.UPDATE,
            "PUT": kmock.action.UPDATE,
            "DELETE": kmock.action.DELETE,
        }.get(method)

    async def _dispatch(
        self,
        raw_request: aiohttp.web.BaseRequest,
        route: Route | None,
        query: dict[str, str],
        body: bytes,
        data: Any,
        is_watch: bool,
    ) -> aiohttp.web.StreamResponse:
        if route is None:
            document = kube_discovery.non_resource(self.state, raw_request.path)
            if isinstance(document, str):
                return aiohttp.web.Response(text=document)
            return _json_response(document)
        if route.level != "resource":
            if raw_request.method != "GET":
                raise errors.method_not_allowed(raw_request.method)
            return _json_response(kube_discovery.discovery(self.state, route, raw_request.host))
        return await self._serve_resource(raw_request, route, query, body, data, is_watch)

    # -- resources -------------------------------------------------------------

    async def _serve_resource(
        self,
        raw_request: aiohttp.web.BaseRequest,
        route: Route,
        query: dict[str, str],
        body: bytes,
        data: Any,
        is_watch: bool,
    ) -> aiohttp.web.StreamResponse:
        rt = self.state.lookup(route.group, route.version, route.plural)
        if rt is None:
            raise errors.resource_not_found()
        if route.namespace is not None and not rt.namespaced:
            raise errors.resource_not_found()
        method = raw_request.method
        name, sub = route.name, route.subresource
        dry_run = "dryRun" in query
        if sub is not None and sub not in rt.subresources:
            raise errors.resource_not_found()
        if rt.namespaced and route.namespace is None and not (method == "GET" and name is None):
            # Cluster-wide URLs of namespaced kinds only serve lists and watches.
            raise (
                errors.resource_not_found()
                if name is not None
                else errors.method_not_allowed(method)
            )
        if is_watch:
            watch_options = WatchOptions(self.bookmark_interval, self.max_watch_timeout)
            return await serve_watch(
                raw_request, self.state, self._notifier, rt, route, query, watch_options
            )
        if sub == "scale" and name is not None:
            if method == "GET":
                return _json_response(
                    kube_collections.scale_of(self.state.get(rt, route.namespace, name))
                )
            if method not in ("PUT", "PATCH"):
                raise errors.method_not_allowed(method)
            content_type = raw_request.headers.get("Content-Type", "")
            return _json_response(
                kube_collections.write_scale(
                    self.state, rt, route.namespace, name, method, body, content_type
                )
            )
        if method == "GET":
            if name is None:
                return _json_response(
                    kube_collections.list_objects(self.state, rt, route.namespace, query)
                )
            return _json_response(self.state.render(rt, self.state.get(rt, route.namespace, name)))
        if method == "POST":
            if name is not None:
                raise errors.method_not_allowed(method)
            return _json_response(
                self.state.create(rt, route.namespace, data, dry_run=dry_run), 201
            )
        if method == "PUT" and name is not None:
            return _json_response(
                self.state.replace(
                    rt, route.namespace, name, data, subresource=sub, dry_run=dry_run
                )
            )
        if method == "PATCH" and name is not None:
            obj, code = self.state.patch(
                rt,
                route.namespace,
                name,
                body,
                raw_request.headers.get("Content-Type", ""),
                subresource=sub,
                field_manager=query.get("fieldManager"),
                dry_run=dry_run,
            )
            return _json_response(obj, code)
        if method == "DELETE" and sub is None:
            options = DeleteOptions.parse(data, query)
            if name is not None:
                return _json_response(self.state.delete(rt, route.namespace, name, options))
            return _json_response(
                kube_collections.delete_collection(self.state, rt, route.namespace, query, options)
            )
        raise errors.method_not_allowed(method)
