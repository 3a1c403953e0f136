"""Identifiers in the OpenAI formats (`file-...`, `batch_...`), random so they are unguessable
across tenants, and lease tokens."""

from __future__ import annotations

import secrets


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def new_lease_token() -> str:
    """A claim's token: a settle must present it, so a stale dispatch cannot commit."""
    return secrets.token_hex(8)
