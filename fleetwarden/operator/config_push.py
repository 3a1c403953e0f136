"""Push each ModelDeployment's fairness config to its live sidecars and track acknowledgements.

The ConfigMap is the source of truth a sidecar loads when it starts, but a ConfigMap mounted as a
volume reaches a running pod only after the kubelet's sync delay (a minute or more), and a
rollout would restart engines that take minutes to load. So the operator also PUTs the config to
every ready sidecar's admin endpoint, at once when the config changes and when a pod becomes
ready. A pod counts as acknowledged when it answered with the version the operator wants; the
TenantPolicy status sums these counts. A failed push, and one answered with another version, is
retried with capped backoff while the pod stays ready; nothing else waits on it. A pod that turns
ready again (its sidecar container restarted, loading the mounted ConfigMap, maybe a stale one)
has acknowledged nothing yet, whatever its IP.

Only the pod's own answer counts, and only one shaped like the sidecar's (`sidecar/admin.py`): a
redirect is never followed (a 3xx is a failed push, retried), since following one would count the
redirect target's answer as the pod's acknowledgement; and at most `MAX_ANSWER_BYTES` of an
answer are read, so a huge one cannot grow the operator or end up in a status as a "version".

Which pods are a ModelDeployment's is decided by the reconciler's list (`owned_pod`), not by the
label value alone: a value an earlier operator wrote may be shared by two ModelDeployments whose
names share their first 63 characters, and a pod must never get another model's config or admin
token, nor be counted for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fleetwarden.common.capped_read import read_capped
from fleetwarden.operator import naming

log = logging.getLogger(__name__)

SIDECAR_CONTAINER = "sidecar"
TEMPLATE_HASH_LABEL = "pod-template-hash"
"""Set by the Deployment controller on its pods; their ReplicaSet is `<deployment>-<hash>`."""
PUSH_TIMEOUT_S = 5.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
MAX_ANSWER_BYTES = 64 * 1024
"""Most bytes of a push answer read: the sidecar's is `{"version": ..., "changed": ...}`."""
VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
"""A version a pod may answer with: the sidecar's is 16 hex digits (`FairnessConfig.version`);
anything longer or with other characters is no answer of a sidecar, and is never stored (it
would reach logs and the TenantPolicy status)."""
LOGGED_BODY_CHARS = 200
"""Most characters of a refusing answer quoted in a log line."""


class UnexpectedAnswerError(ValueError):
    """A push answer that is not the sidecar's: too big, not JSON, or without a valid version."""


@dataclass(frozen=True)
class DesiredConfig:
    version: str
    document: str
    admin_token: str = field(repr=False)
    """The sidecars' admin bearer token: kept out of `repr` (and so of logs and tracebacks)."""


@dataclass(frozen=True)
class PodTarget:
    """A serving pod as far as pushing is concerned: whose it is, where, and whether ready."""

    key: str
    model_deployment: str
    """`namespace/name` of the owning ModelDeployment."""
    url: str | None
    ready: bool


def _ready(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def _sidecar_port(spec: Mapping[str, Any]) -> int | None:
    for container in spec.get("containers") or []:
        if container.get("name") != SIDECAR_CONTAINER:
            continue
        for port in container.get("ports") or []:
            if port.get("name") == "http" and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def sidecar_url(ip: object, port: int | None) -> str | None:
    """The base URL of a sidecar at pod IP `ip`, or None when the pod has no usable IP or port.

    An IPv6 address goes in brackets (RFC 3986): `http://fd00::1:8080` is no URL at all. A value
    that is no IP address gives None, like a pod without one, so it is never pushed to: the API
    server writes only addresses here, so anything else is a hand-made or corrupt object.
    """
    if not isinstance(ip, str) or not ip or not port:
        return None
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        log.warning("pod IP %r is not an IP address; not pushing to it", ip)
        return None
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{host}:{port}"


def pod_target(
    body: Mapping[str, Any], model_deployment_of: Callable[[str, str], str | None]
) -> PodTarget | None:
    """The push target of a pod body, or None when it is not a serving pod of a known owner."""
    metadata = body.get("metadata") or {}
    namespace, name = metadata.get("namespace") or "", metadata.get("name") or ""
    label = (metadata.get("labels") or {}).get(naming.MODEL_DEPLOYMENT_LABEL)
    if not label or not name:
        return None
    owner = model_deployment_of(namespace, label)
    if owner is None:
        return None
    status = body.get("status") or {}
    url = sidecar_url(status.get("podIP"), _sidecar_port(body.get("spec") or {}))
    ready = _ready(status) and url is not None and metadata.get("deletionTimestamp") is None
    return PodTarget(f"{namespace}/{name}", owner, url, ready)


def owned_pod(body: Mapping[str, Any], deployments: Collection[str], label: str) -> bool:
    """Whether a listed pod belongs to one of `deployments` (all of one ModelDeployment's).

    A pod a ReplicaSet controls is theirs when that ReplicaSet is `<deployment>-<pod-template-
    hash>`, the name the Deployment controller gives it; so a pod of another ModelDeployment that
    carries the same label value (one written before unique values) is not. A pod nothing
    controls counts only when its model-deployment label is `label`, the current, unique value.
    """
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    refs = metadata.get("ownerReferences") or []
    controller = next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)
    if controller is None:
        return bool(labels.get(naming.MODEL_DEPLOYMENT_LABEL) == label)
    template_hash = labels.get(TEMPLATE_HASH_LABEL)
    if controller.get("kind") != "ReplicaSet" or not template_hash:
        return False
    return any(controller.get("name") == f"{name}-{template_hash}" for name in deployments)


@dataclass
class ConfigPusher:
    """Desired config per ModelDeployment, known pods, and what each pod acknowledged."""

    on_change: Callable[[str], None] = lambda model_deployment: None
    """Called with a ModelDeployment key whenever its acknowledged/total counts change."""
    timeout_s: float = PUSH_TIMEOUT_S
    desired: dict[str, DesiredConfig] = field(default_factory=dict)
    pods: dict[str, PodTarget] = field(default_factory=dict)
    """Pod key -> target. Changed only by `_observe` and `pod_gone`, which keep `_keys_of` in
    step with it (read it freely, never write it)."""
    acknowledged: dict[str, str] = field(default_factory=dict)
    """Pod key -> the version it last confirmed (counted only if it is the desired one)."""
    _generation: dict[str, int] = field(default_factory=dict)
    """Pod key -> how many times it turned ready: a push answered by an earlier sidecar process
    (it was in flight across a restart) acknowledges nothing for the current one."""
    _wake: dict[str, asyncio.Event] = field(default_factory=dict)
    """Pod key -> set to end a retry's backoff early (a new desired config, a restart)."""
    _disagreed: dict[str, str] = field(default_factory=dict)
    """Pod key -> the other version it last answered with, so the warning is logged once."""
    _keys_of: dict[str, dict[str, None]] = field(default_factory=dict)
    """ModelDeployment key -> the keys of its pods in `pods` (an ordered set; no empty ones).
    Every reconcile asks for one ModelDeployment's pods (`counts`, `sync_pods`), so scanning all
    of the fleet's pods each time would make a fleet-wide TenantPolicy reconcile quadratic."""
    _labels: dict[tuple[str, str], str] = field(default_factory=dict)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    # -- inputs ---------------------------------------------------------------------------------

    def set_desired(self, model_deployment: str, desired: DesiredConfig) -> None:
        """The config `model_deployment`'s sidecars must run; pushes to pods that lack it."""
        namespace, _, name = model_deployment.rpartition("/")
        self._labels[(namespace, naming.label_value(name))] = model_deployment
        if self.desired.get(model_deployment) == desired:
            return
        self.desired[model_deployment] = desired
        for key in self.pod_keys(model_deployment):
            self._wake_up(key)
            self._schedule(key)
        self.on_change(model_deployment)

    def forget_model_deployment(self, model_deployment: str) -> None:
        self.desired.pop(model_deployment, None)
        for key in self.pod_keys(model_deployment):
            self.pod_gone(key)
        # `set_desired` is the only writer of `_labels`, and maps this one key to it (unless a
        # ModelDeployment sharing the label value took the key since: then it is not ours).
        namespace, _, name = model_deployment.rpartition("/")
        label_key = (namespace, naming.label_value(name))
        if self._labels.get(label_key) == model_deployment:
            del self._labels[label_key]

    def model_deployment_of(self, namespace: str, label: str) -> str | None:
        return self._labels.get((namespace, label))

    def observe_pod(self, body: Mapping[str, Any]) -> None:
        """A serving pod was created or changed: remember it and push if it became ready."""
        self._observe(pod_target(body, self.model_deployment_of))

    def _observe(self, target: PodTarget | None) -> None:
        if target is None:
            return
        before = self.pods.get(target.key)
        self.pods[target.key] = target
        if before is not None and before.model_deployment != target.model_deployment:
            self._unindex(before)
        self._keys_of.setdefault(target.model_deployment, {})[target.key] = None
        if before is not None and (before.url != target.url or (target.ready and not before.ready)):
            # A new IP is a new sidecar process, and so may be a pod that turns ready again: a
            # restarted sidecar container loaded the mounted ConfigMap, which may be stale.
            self.acknowledged.pop(target.key, None)
            self._generation[target.key] = self._generation.get(target.key, 0) + 1
            self._disagreed.pop(target.key, None)
            self._wake_up(target.key)
        if target.ready:
            self._schedule(target.key)
        if before is None or before.ready != target.ready:
            self.on_change(target.model_deployment)

    def sync_pods(self, model_deployment: str, bodies: Sequence[Mapping[str, Any]]) -> None:
        """The complete list of one ModelDeployment's pods (checked by `owned_pod`): observe
        each as that ModelDeployment's, whatever its label value, and forget the missing."""
        seen = set()
        for body in bodies:
            metadata = body.get("metadata") or {}
            seen.add(f"{metadata.get('namespace')}/{metadata.get('name')}")
            self._observe(pod_target(body, lambda _namespace, _label: model_deployment))
        for key in self.pod_keys(model_deployment):
            if key not in seen:
                self.pod_gone(key)

    def pod_gone(self, key: str) -> None:
        target = self.pods.pop(key, None)
        if target is not None:
            self._unindex(target)
        self.acknowledged.pop(key, None)
        self._generation.pop(key, None)
        self._wake.pop(key, None)
        self._disagreed.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
        if target is not None:
            self.on_change(target.model_deployment)

    def _unindex(self, target: PodTarget) -> None:
        keys = self._keys_of.get(target.model_deployment)
        if keys is not None:
            keys.pop(target.key, None)
            if not keys:
                del self._keys_of[target.model_deployment]

    # -- outputs --------------------------------------------------------------------------------

    def pod_keys(self, model_deployment: str) -> list[str]:
        """The keys of `model_deployment`'s known pods (a copy: the caller may forget them)."""
        return list(self._keys_of.get(model_deployment, ()))

    def counts(self, model_deployment: str) -> tuple[int, int]:
        """(ready pods running the desired version, ready pods) of one ModelDeployment."""
        desired = self.desired.get(model_deployment)
        keys = self._keys_of.get(model_deployment, ())
        ready = [p for key in keys if (p := self.pods[key]).ready]
        acked = sum(
            1
            for p in ready
            if desired is not None and self.acknowledged.get(p.key) == desired.version
        )
        return acked, len(ready)

    # -- pushing --------------------------------------------------------------------------------

    def _pending(self, key: str) -> tuple[PodTarget, DesiredConfig] | None:
        pod = self.pods.get(key)
        if pod is None or not pod.ready or pod.url is None:
            return None
        desired = self.desired.get(pod.model_deployment)
        if desired is None or self.acknowledged.get(key) == desired.version:
            return None
        return pod, desired

    def _schedule(self, key: str) -> None:
        if self._pending(key) is None:
            return
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.get_running_loop().create_task(
                self._push_until_acknowledged(key), name=f"push-config:{key}"
            )

    def _wake_up(self, key: str) -> None:
        """End the backoff of `key`'s retry, if it waits: what it waited for may have changed."""
        event = self._wake.get(key)
        if event is not None:
            event.set()

    async def _push_until_acknowledged(self, key: str) -> None:
        backoff = FIRST_BACKOFF_S
        wake = self._wake.setdefault(key, asyncio.Event())
        while (pending := self._pending(key)) is not None:
            pod, desired = pending
            generation = self._generation.get(key, 0)
            wake.clear()
            version = await self._push_once(pod, desired)
            if version is not None and self._generation.get(key, 0) == generation:
                if self.acknowledged.get(key) != version:
                    self.acknowledged[key] = version
                    self.on_change(pod.model_deployment)
                if version == desired.version:
                    self._disagreed.pop(key, None)
                    backoff = FIRST_BACKOFF_S
                    continue
                # The pod took the PUT but runs another version (a sidecar that hashes configs
                # differently, a concurrent writer): pushing again at once would loop forever.
                self._note_disagreement(pod, desired, version)
            elif version is not None:
                continue  # answered by the sidecar before a restart: push to the new one now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    def _note_disagreement(self, pod: PodTarget, desired: DesiredConfig, version: str) -> None:
        """Warn, once per pod and answered version, that a pod runs a version it was not sent."""
        if self._disagreed.get(pod.key) == version:
            return
        self._disagreed[pod.key] = version
        log.warning(
            "config push to %s answered with version %s, not %s; retrying with backoff",
            pod.key,
            version,
            desired.version,
        )

    def disagreeing(self, model_deployment: str) -> dict[str, str]:
        """Ready pods of `model_deployment` that answered a push with another version (pod key
        -> that version): they are retried with backoff and not counted as acknowledged."""
        return {
            key: version
            for key, version in self._disagreed.items()
            if (pod := self.pods.get(key)) is not None
            and pod.model_deployment == model_deployment
            and pod.ready
        }

    async def _push_once(self, pod: PodTarget, desired: DesiredConfig) -> str | None:
        """PUT the config to `pod`'s sidecar; the version it answered with, None on failure."""
        if self._session is None or self._session.closed:
            # Undecoded bodies: a compressed answer is no sidecar's, and must not be inflated.
            self._session = aiohttp.ClientSession(auto_decompress=False)
        headers = {
            "Authorization": f"Bearer {desired.admin_token}",
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
        }
        try:
            async with self._session.put(
                f"{pod.url}/admin/config",
                data=desired.document,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                allow_redirects=False,
            ) as response:
                if 300 <= response.status < 400:
                    log.warning(
                        "config push to %s answered with a redirect (HTTP %s to %s); a sidecar "
                        "never redirects, so it is not followed; will retry",
                        pod.key,
                        response.status,
                        _excerpt(response.headers.get("Location", "")),
                    )
                    return None
                raw = await read_capped(response.content, response.content_length, MAX_ANSWER_BYTES)
                if response.status != 200:
                    text = raw.decode("utf-8", "replace") if raw is not None else "(too large)"
                    log.warning(
                        "config push to %s refused: HTTP %s %s",
                        pod.key,
                        response.status,
                        _excerpt(text),
                    )
                    return None
                return _answered_version(response.content_type, raw)
        except UnexpectedAnswerError as exc:
            log.warning("config push to %s: %s; will retry", pod.key, exc)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.info("config push to %s failed (%s); will retry", pod.key, exc.__class__.__name__)
        return None

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._wake.clear()
        if self._session is not None:
            await self._session.close()


def _answered_version(content_type: str, raw: bytes | None) -> str:
    """The version in a 200 answer shaped like the sidecar's; UnexpectedAnswerError otherwise."""
    if raw is None:
        raise UnexpectedAnswerError(f"the answer is larger than {MAX_ANSWER_BYTES} bytes")
    if content_type != "application/json":
        raise UnexpectedAnswerError(f"the answer is {_excerpt(content_type)}, not JSON")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # RecursionError: deeply nested arrays or objects
        raise UnexpectedAnswerError("the answer is not valid JSON") from None
    if not isinstance(body, dict):
        raise UnexpectedAnswerError("the answer is not a JSON object")
    version = body.get("version")
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise UnexpectedAnswerError(f"the answer's version {_excerpt(version)} is not valid")
    if not isinstance(body.get("changed", False), bool):
        raise UnexpectedAnswerError("the answer's 'changed' is not a boolean")
    return version


def _excerpt(value: object) -> str:
    """`value` quoted for a log line: control characters escaped, at most a few hundred chars."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > LOGGED_BODY_CHARS:
        return repr(text[:LOGGED_BODY_CHARS]) + f"... ({len(text)} characters)"
    return repr(text)
