"""Run a Kopf operator's handlers inside a test (or any asyncio program) against the emulator.

Why not ``kopf.operator()`` / ``kopf.run()``: on exit, ``kopf.run_tasks()``
cancels *every* asyncio task created after the operator started ("hung tasks",
``aiotasks.all_tasks(ignored=...)``), which includes the test's own tasks and
pytest-asyncio's, so tests die with ``CancelledError`` in unrelated places.
This runner uses ``kopf.spawn_tasks()`` and stops exactly the tasks Kopf gave
back, the way ``run_tasks()`` does for its root tasks, and nothing else.

Other Kopf behaviours this runner neutralises:

* ``spawn_tasks()`` installs SIGINT/SIGTERM handlers on the loop (main thread
  only); they are restored on exit, so Ctrl+C works again afterwards.
* Kopf's "ultimate termination" task SIGKILLs the thread if the operator is
  cancelled *without* the stop-flag set; the runner always sets the flag first.
* ``spawn_tasks()`` sets context variables (credentials vault, settings);
  it runs in its own task so that they do not leak into the caller's context.
* A private ``kopf.OperatorRegistry()`` has no login handlers, so the runner
  hands Kopf a pre-populated credentials vault pointing at the emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading
from collections.abc import AsyncIterator, Collection
from typing import Any

import kopf
from kopf._cogs.structs.credentials import Vault
from kopf._cogs.structs.references import Resource

from tests.support.kube_emulator import KubeEmulator, WatchInfo


@dataclasses.dataclass
class KopfHandle:
    """What the runner yields: the running tasks, for inspection, and the flags."""

    tasks: Collection[asyncio.Task[Any]]
    stop_flag: asyncio.Event
    ready_flag: asyncio.Event
    preexisting: Collection[asyncio.Task[Any]] = ()


def _selectors(registry: kopf.OperatorRegistry) -> list[Any]:
    """All resource selectors of a registry (private API: used only to wait for readiness)."""
    found: list[Any] = []
    for name in ("_changing", "_watching", "_spawning", "_indexing"):
        sub = getattr(registry, name, None)
        if sub is not None and hasattr(sub, "get_all_selectors"):
            found.extend(sub.get_all_selectors())
    return found


def _watch_matches(selector: Any, watch: WatchInfo, emulator: KubeEmulator) -> bool:
    rt = emulator.state.lookup(watch.group, watch.version, watch.plural)
    if rt is None:
        return False
    resource = Resource(
        group=rt.group,
        version=rt.version,
        plural=rt.plural,
        kind=rt.kind,
        singular=rt.singular,
        shortcuts=frozenset(rt.short_names),
        categories=frozenset(rt.categories),
        subresources=frozenset(rt.subresources),
        namespaced=rt.namespaced,
    )
    return bool(selector.check(resource))


@contextlib.asynccontextmanager
async def run_kopf(
    emulator: KubeEmulator,
    *,
    registry: kopf.OperatorRegistry,
    settings: kopf.OperatorSettings | None = None,
    clusterwide: bool = False,
    namespaces: Collection[str] = (),
    peering_name: str | None = None,
    standalone: bool = True,
    memo: object | None = None,
    startup_timeout: float = 10.0,
    stop_timeout: float = 10.0,
) -> AsyncIterator[KopfHandle]:
    """Run the handlers of ``registry`` against ``emulator`` until the block exits.

    Entering waits until Kopf's startup handlers have finished *and* the
    emulator has an open watch for every resource the registry handles (in
    every literal namespace when namespaced), so objects created inside the
    block are guaranteed to be seen. Peering is off (``standalone=True``)
    unless ``peering_name`` is given with ``standalone=False``.
    """
    if not clusterwide and not namespaces:
        raise ValueError(
            "Pass clusterwide=True or namespaces=[...] (Kopf's implicit default is deprecated)."
        )
    settings = settings if settings is not None else kopf.OperatorSettings()
    vault = Vault(
        {
            "emulator": kopf.ConnectionInfo(
                server=emulator.url, insecure=True, default_namespace="default"
            )
        }
    )
    stop_flag = asyncio.Event()
    ready_flag = asyncio.Event()
    loop = asyncio.get_running_loop()
    in_main_thread = threading.current_thread() is threading.main_thread()
    saved_handlers = (
        {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        if in_main_thread
        else {}
    )

    async def spawn() -> Collection[asyncio.Task[Any]]:
        # A separate task: Kopf's context variables stay in this task's context copy,
        # which all Kopf's tasks inherit, instead of leaking into the caller's context.
        tasks: Collection[asyncio.Task[Any]] = await kopf.spawn_tasks(
            registry=registry,
            settings=settings,
            clusterwide=clusterwide,
            namespaces=namespaces,
            peering_name=peering_name,
            standalone=standalone if peering_name else True,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            vault=vault,
            memo=memo,
        )
        return tasks

    existing = asyncio.all_tasks()
    tasks = await asyncio.create_task(spawn(), name="kopf-runner: spawn")
    handle = KopfHandle(
        tasks=tasks, stop_flag=stop_flag, ready_flag=ready_flag, preexisting=existing
    )
    try:
        await _wait_ready(
            handle,
            emulator,
            registry,
            namespaces,
            peering_name,
            standalone,
            clusterwide,
            startup_timeout,
        )
        yield handle
    finally:
        await _stop(handle, stop_timeout)
        if in_main_thread:
            for sig, previous in saved_handlers.items():
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)
                if previous is not None:  # None: installed outside Python, nothing to restore
                    signal.signal(sig, previous)


async def _wait_ready(
    handle: KopfHandle,
    emulator: KubeEmulator,
    registry: kopf.OperatorRegistry,
    namespaces: Collection[str],
    peering_name: str | None,
    standalone: bool,
    clusterwide: bool,
    timeout: float,  # noqa: ASYNC109  # a deadline for several waits, not one awaitable
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    def failed() -> None:
        for task in handle.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(
                    f"Kopf task {task.get_name()!r} failed at startup"
                ) from task.exception()

    ready_waiter = asyncio.ensure_future(handle.ready_flag.wait())
    try:
        while not ready_waiter.done():
            failed()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError("Kopf did not finish its startup activities in time")
            await asyncio.wait(
                [ready_waiter, *handle.tasks],
                timeout=min(remaining, 0.1),
                return_when=asyncio.FIRST_COMPLETED,
            )
    finally:
        ready_waiter.cancel()

    selectors = _selectors(registry)
    literal_namespaces = [ns for ns in namespaces if not any(c in ns for c in "*?[!")]
    scopes: list[str | None] = [None] if clusterwide else list(literal_namespaces)

    def watched() -> bool:
        failed()
        watches = emulator.active_watches
        for selector in selectors:
            for scope in scopes:
                if not any(
                    _watch_matches(selector, w, emulator)
                    and (w.namespace is None or w.namespace == scope)
                    for w in watches
                ):
                    return False
        if peering_name and not standalone:
            plural = "clusterkopfpeerings" if clusterwide else "kopfpeerings"
            if not any(w.plural == plural for w in watches):
                return False
        return True

    await emulator.wait_for(watched, timeout=max(0.1, deadline - loop.time()))


def _is_kopf_task(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and f"{os.sep}kopf{os.sep}" in code.co_filename


async def _stop(handle: KopfHandle, timeout: float) -> None:  # noqa: ASYNC109
    """Stop like ``kopf.run_tasks()`` does for root tasks, but never touch other tasks."""
    handle.stop_flag.set()  # first: otherwise Kopf schedules a SIGKILL on cancellation
    tasks = list(handle.tasks)
    if not tasks:
        return
    # The stop-flag checker exits on its own; the rest are cancelled as run_tasks() does.
    done, pending = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in done:
        if not task.cancelled():
            with contextlib.suppress(asyncio.CancelledError):
                task.exception()  # retrieve, so asyncio does not warn about unretrieved errors
    # Sub-tasks that outlive the root tasks briefly (e.g. daemon runners finishing their exit):
    # only Kopf's own coroutines created after the start, never the caller's tasks.
    stragglers = [
        task
        for task in asyncio.all_tasks() - set(handle.preexisting)
        if not task.done() and _is_kopf_task(task)
    ]
    if stragglers:
        _, still = await asyncio.wait(stragglers, timeout=timeout)
        for task in still:
            task.cancel()
        if still:
            await asyncio.wait(still, timeout=timeout)
    if pending:
        names = ", ".join(task.get_name() for task in pending)
        raise TimeoutError(f"Kopf tasks did not stop within {timeout}s: {names}")
