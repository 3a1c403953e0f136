"""Install and uninstall Helm charts from tests with helm-python-sdk (Helm v4 via ctypes).

Helm's calls block the calling thread for the whole install (HTTP calls are
made by Go code in ``libhelm_c``). When the emulator runs in the same event
loop as the test, a blocking call on the loop thread would deadlock: Helm waits
for the emulator, which never gets the loop back. The ``async`` functions
therefore run Helm in a worker thread; the ``*_blocking`` variants are for
callers that already are in a thread of their own.

What Helm v4 does against an API server (and the emulator supports):

* discovery, then ``/openapi/v3`` to learn that the server validates fields
  itself (``fieldValidation``); otherwise it wants ``/openapi/v2`` in protobuf;
* server-side apply (``application/apply-patch+yaml``, ``fieldManager=python``)
  to create and update the chart's objects;
* release records as Secrets ``sh.helm.release.v1.<release>.v<revision>``,
  labelled ``owner=helm,name=<release>``, written with *protobuf* bodies.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import helm_python

StrPath = str | os.PathLike[str]


def install_chart_blocking(
    chart_dir: StrPath,
    release: str,
    namespace: str,
    values: dict[str, Any] | None,
    kubeconfig: StrPath,
    *,
    create_namespace: bool = False,
    timeout: int | None = None,
) -> dict[str, Any]:
    """Install ``chart_dir`` as ``release``; returns Helm's release summary (with ``manifest``)."""
    with helm_python.Config(kubeconfig_path=kubeconfig, namespace=namespace) as config:
        return config.install(
            chart_dir,
            release,
            values or {},
            namespace=namespace,
            create_namespace=create_namespace,
            timeout=timeout,
        )


def upgrade_chart_blocking(
    chart_dir: StrPath,
    release: str,
    namespace: str,
    values: dict[str, Any] | None,
    kubeconfig: StrPath,
) -> dict[str, Any]:
    """Upgrade ``release`` to ``chart_dir`` with ``values``; returns the new revision's summary."""
    with helm_python.Config(kubeconfig_path=kubeconfig, namespace=namespace) as config:
        return config.upgrade(chart_dir, release, values or {}, namespace=namespace)


def uninstall_chart_blocking(release: str, namespace: str, kubeconfig: StrPath) -> dict[str, Any]:
    """Uninstall ``release``; returns ``{"info": ..., "release": {...}}``."""
    with helm_python.Config(kubeconfig_path=kubeconfig, namespace=namespace) as config:
        return config.uninstall(release)


def list_releases_blocking(namespace: str, kubeconfig: StrPath) -> list[dict[str, Any]]:
    with helm_python.Config(kubeconfig_path=kubeconfig, namespace=namespace) as config:
        return config.list(all_states=True)


async def install_chart(
    chart_dir: StrPath,
    release: str,
    namespace: str,
    values: dict[str, Any] | None,
    kubeconfig: StrPath,
    *,
    create_namespace: bool = False,
) -> dict[str, Any]:
    """:func:`install_chart_blocking` in a worker thread, so the event loop keeps serving."""
    return await asyncio.to_thread(
        install_chart_blocking,
        chart_dir,
        release,
        namespace,
        values,
        kubeconfig,
        create_namespace=create_namespace,
    )


async def upgrade_chart(
    chart_dir: StrPath,
    release: str,
    namespace: str,
    values: dict[str, Any] | None,
    kubeconfig: StrPath,
) -> dict[str, Any]:
    return await asyncio.to_thread(
        upgrade_chart_blocking, chart_dir, release, namespace, values, kubeconfig
    )


async def uninstall_chart(release: str, namespace: str, kubeconfig: StrPath) -> dict[str, Any]:
    """:func:`uninstall_chart_blocking` in a worker thread."""
    return await asyncio.to_thread(uninstall_chart_blocking, release, namespace, kubeconfig)


async def list_releases(namespace: str, kubeconfig: StrPath) -> list[dict[str, Any]]:
    return await asyncio.to_thread(list_releases_blocking, namespace, kubeconfig)
