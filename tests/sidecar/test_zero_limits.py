"""A sidecar never runs a rate limit of 0: no tenant gets a 429 with Retry-After forever.

The real sidecar in front of the stub engine. Before the fix, a config pushed with `rpm: 0` was
applied and every request of the tenant answered 429 `Retry-After: 60` (OpenAI SDKs retry those
forever); a negative limit answered the push 500 and left the scheduler half-reconfigured (the new
version reported, the old limits enforced). Both are now refused as the CRD refuses them, and the
running config keeps serving.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleetwarden.api.enums import PolicyName
from fleetwarden.cli import main
from tests.support.sidecar_stack import fairness_config, running_sidecar, running_stub

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
HEADERS = {"x-fleetwarden-tenant": "alice", "x-fleetwarden-app": "bot"}


def document_with(where: str, field: str, value: int, *, oit: bool = False) -> str:
    """A valid config document naming tenant alice and application bot, with one limit set."""
    base = fairness_config(policy=PolicyName.VTC, interaction_throttling=oit)
    body: dict[str, Any] = json.loads(base.to_document())
    body["tenants"] = {"alice": dict(body["defaults"])}
    body["applications"] = {"bot": {"rpm": None, "tpm": None, "stages": {}}}
    target = {
        "defaults": body["defaults"],
        "tenants": body["tenants"]["alice"],
        "applications": body["applications"]["bot"],
    }[where]
    target[field] = value
    return json.dumps(body)


@pytest.mark.parametrize(
    ("where", "field", "value", "oit"),
    [
        ("tenants", "rpm", 0, False),
        ("tenants", "tpm", 0, False),
        ("applications", "rpm", 0, False),
        ("applications", "tpm", 0, True),
        ("defaults", "rpm", 0, True),
        ("defaults", "tpm", -1, False),
        ("tenants", "rpm", -3, True),
    ],
)
async def test_a_pushed_limit_under_one_is_refused_and_changes_nothing(
    where: str, field: str, value: int, oit: bool
) -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        scheduler = sc.state.dispatcher
        before = scheduler.scheduler.version
        async with aiohttp.ClientSession() as http:
            async with http.put(
                f"{sc.url}/admin/config",
                data=document_with(where, field, value, oit=oit),
                headers=sc.admin_headers,
            ) as r:
                assert r.status == 422
                error = (await r.json())["error"]
            assert error["code"] == "invalid_config"
            assert f"{where}." in error["message"]
            assert f".{field}: Input should be greater than or equal to 1" in error["message"]
            assert scheduler.scheduler.version == before
            for _ in range(3):  # the old config serves on: no 429 loop
                async with http.post(
                    f"{sc.url}/v1/chat/completions", json=CHAT, headers=HEADERS
                ) as r:
                    assert r.status == 200, await r.text()
    assert stub.engine.requests_total == 3


async def test_a_limit_of_one_still_throttles_with_retry_after() -> None:
    """The smallest limit allowed is an ordinary limit: 429 with a finite Retry-After."""
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        async with aiohttp.ClientSession() as http:
            async with http.put(
                f"{sc.url}/admin/config",
                data=document_with("tenants", "rpm", 1),
                headers=sc.admin_headers,
            ) as r:
                assert r.status == 200
            statuses = []
            for _ in range(2):
                async with http.post(
                    f"{sc.url}/v1/chat/completions", json=CHAT, headers=HEADERS
                ) as r:
                    statuses.append(r.status)
                    retry_after = r.headers.get("Retry-After")
            assert statuses == [200, 429]
            assert retry_after is not None
            assert 55 <= int(retry_after) <= 60


@pytest.mark.parametrize("value", [0, -1])
def test_a_config_file_with_a_limit_under_one_is_named_and_exits_2(
    value: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: list[object] = []
    # Were the file accepted, the sidecar would serve until stopped: record instead of serving.
    monkeypatch.setattr("aiohttp.web.run_app", lambda app, **kwargs: served.append(app))
    monkeypatch.setattr("uvloop.install", lambda: None, raising=False)
    config = tmp_path / "fairness.json"
    config.write_text(document_with("defaults", "rpm", value))
    assert main(["sidecar", "--config", str(config)]) == 2
    assert served == []
    err = capsys.readouterr().err
    assert err.startswith(f"fleetwarden sidecar: --config {config}: ")
    assert err.count("\n") == 1
    assert "defaults.rpm Input should be greater than or equal to 1" in err
