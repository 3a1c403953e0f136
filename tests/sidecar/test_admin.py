"""The admin API: authenticated, validating, atomic config changes; state and health."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from fleetwarden.api.enums import PolicyName
from tests.support.sidecar_stack import fairness_config, running_sidecar, running_stub


async def test_put_config_applies_atomically_and_reports_the_version(relay: str) -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        new = fairness_config(policy=PolicyName.VTC, source="TenantPolicy ns/p")
        async with aiohttp.ClientSession(headers=sc.admin_headers) as http:
            async with http.put(f"{sc.url}/admin/config", data=new.to_document()) as r:
                assert r.status == 200
                assert await r.json() == {"version": new.version, "changed": True}
            async with http.put(f"{sc.url}/admin/config", data=new.to_document()) as r:
                assert (await r.json())["changed"] is False
            async with http.get(f"{sc.url}/admin/state") as r:
                state = await r.json()
            assert state["version"] == new.version
            assert state["policy"] == "vtc"
            assert state["source"] == "TenantPolicy ns/p"
            # the relay this run's sidecar uses (tests/sidecar/conftest.py), no stream in flight
            assert state["relay"] == {"mode": relay, "streams": 0 if relay == "native" else None}
            async with http.get(f"{sc.url}/metrics") as r:
                assert f'version="{new.version}"' in await r.text()


async def test_invalid_config_changes_nothing() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        before = sc.state.dispatcher.scheduler.version
        document = json.loads(fairness_config().to_document())
        document["overload_kv_utilization"] = 7
        document["policy"] = "lottery"
        async with aiohttp.ClientSession(headers=sc.admin_headers) as http:
            for data, status in ((json.dumps(document), 422), ("{not json", 400), ("[1, 2]", 400)):
                async with http.put(f"{sc.url}/admin/config", data=data) as r:
                    assert r.status == status
                    body = await r.json()
                    assert body["error"]["message"]
            assert "overload_kv_utilization" in body["error"]["message"] or status == 400
        assert sc.state.dispatcher.scheduler.version == before


async def test_admin_needs_the_bearer_token() -> None:
    async with running_stub(time_scale=0.1) as stub:
        async with running_sidecar(stub.url) as sc, aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                async with http.get(f"{sc.url}/admin/state", headers=headers) as r:
                    assert r.status == 401
                    assert (await r.json())["error"]["code"] == "invalid_admin_token"
        async with (
            running_sidecar(stub.url, admin_token=None) as sc,
            aiohttp.ClientSession() as http,
            http.put(
                f"{sc.url}/admin/config", data="{}", headers={"Authorization": "Bearer x"}
            ) as r,
        ):
            assert r.status == 403


async def _raw_get(url: str, path: str, header: bytes) -> bytes:
    """One HTTP/1.1 request with a header line as raw bytes (aiohttp's client would refuse to
    send bytes that are not UTF-8)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"GET {path} HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n".encode()
    writer.write(head + header + b"\r\n\r\n")
    await writer.drain()
    response = await reader.read()
    writer.close()
    return response


async def test_a_bearer_token_that_is_not_utf8_is_refused_not_a_server_error() -> None:
    """Such a token used to fail encoding inside the check: a 500 instead of a 401."""
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        for header in (b"Authorization: Bearer sk-\xff", b"Authorization: Bearer \xc3\xa9"):
            response = await _raw_get(sc.url, "/admin/state", header)
            head, _, body = response.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 401 ")
            assert json.loads(body)["error"]["code"] == "invalid_admin_token"


async def test_state_takes_a_limit_and_tenant_names_and_refuses_bad_ones() -> None:
    async with (
        running_stub(time_scale=0.1) as stub,
        running_sidecar(stub.url, fairness_config(policy=PolicyName.VTC)) as sc,
        aiohttp.ClientSession(headers=sc.admin_headers) as http,
    ):
        async with http.get(f"{sc.url}/admin/state?limit=5&tenant=a&tenant=b") as r:
            assert r.status == 200
            state = await r.json()
        assert state["queuedByTenant"] == {}
        assert state["counters"] == {}  # nobody known yet
        assert state["knownTenants"] == 0
        for query in ("limit=-1", "limit=10001", "limit=x", "limit=%C2%B2", "limit=" + "9" * 99):
            async with http.get(f"{sc.url}/admin/state?{query}") as r:
                assert r.status == 400, query
                assert (await r.json())["error"]["param"] == "limit"
        async with http.get(f"{sc.url}/admin/state?tenant={'x' * 129}") as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "tenant"


async def test_health_and_readiness() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{sc.url}/healthz") as r:
                assert r.status == 200
            async with http.get(f"{sc.url}/readyz") as r:
                assert r.status == 200
                assert (await r.json())["configVersion"] == sc.state.dispatcher.scheduler.version
