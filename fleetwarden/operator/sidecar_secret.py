"""The per-ModelDeployment Secret of its sidecars: the admin bearer token and the HMAC key of
interaction tokens.

Generated once by the operator (random, 256 bits each) and never rewritten, so restarting the
operator or a sidecar does not invalidate interaction tokens clients hold. Owned by the
ModelDeployment, so it is garbage collected with it. The operator only ever gets and creates
Secrets, by name; it never lists or watches them.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

from fleetwarden.operator import naming
from fleetwarden.operator.builders import ADMIN_TOKEN_KEY, INTERACTION_SECRET_KEY, Owner
from fleetwarden.operator.kube import SECRETS, ConflictError, KubeClient

JsonDict = dict[str, Any]


class SidecarSecretError(RuntimeError):
    """The Secret exists but lacks a key (someone edited it): refuse to guess a token."""


@dataclass(frozen=True)
class SidecarSecret:
    admin_token: str
    interaction_secret: str


def build_sidecar_secret(owner: Owner, values: SidecarSecret) -> JsonDict:
    def encode(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": naming.secret_name(owner.name),
            "namespace": owner.namespace,
            "labels": {naming.MANAGED_BY: naming.MANAGER, naming.PART_OF: "fleetwarden"},
            "ownerReferences": [owner.reference()],
        },
        "data": {
            ADMIN_TOKEN_KEY: encode(values.admin_token),
            INTERACTION_SECRET_KEY: encode(values.interaction_secret),
        },
    }


def _decode(body: JsonDict) -> SidecarSecret:
    data = body.get("data") or {}
    try:
        return SidecarSecret(
            admin_token=base64.b64decode(data[ADMIN_TOKEN_KEY]).decode(),
            interaction_secret=base64.b64decode(data[INTERACTION_SECRET_KEY]).decode(),
        )
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        name = body.get("metadata", {}).get("name")
        raise SidecarSecretError(
            f"Secret {name} lacks a valid {ADMIN_TOKEN_KEY} or {INTERACTION_SECRET_KEY}; "
            "delete it and the operator will generate a new one"
        ) from exc


async def ensure_sidecar_secret(kube: KubeClient, owner: Owner) -> tuple[SidecarSecret, bool]:
    """The Secret's values, creating it first when missing; the flag says whether it was created."""
    name = naming.secret_name(owner.name)
    live = await kube.get(SECRETS, name, owner.namespace)
    if live is not None:
        return _decode(live), False
    values = SidecarSecret(secrets.token_urlsafe(32), secrets.token_urlsafe(32))
    try:
        await kube.create(build_sidecar_secret(owner, values))
    except ConflictError:
        live = await kube.get(SECRETS, name, owner.namespace)
        if live is None:
            raise
        return _decode(live), False
    return values, True
