"""Config push reaches sidecars whose pods have IPv6 addresses (IPv6-only and dual-stack
clusters give pods an IPv6 `podIP`): the address goes in brackets, or there is no URL at all."""

from __future__ import annotations

import ipaddress

import pytest
from yarl import URL

from fleetwarden.api.enums import PolicyName
from fleetwarden.operator import config_push
from fleetwarden.operator.config_push import ConfigPusher, DesiredConfig
from tests.operator.test_config_push import NS, eventually, pod
from tests.support.sidecar_stack import (
    ADMIN_TOKEN,
    fairness_config,
    free_port,
    running_sidecar,
    running_stub,
)

pytestmark = pytest.mark.timeout(60)


def _chat(_namespace: str, _label: str) -> str:
    return f"{NS}/chat"


@pytest.mark.parametrize(
    ("ip", "url"),
    [
        ("fd00:10:244::1a", "http://[fd00:10:244::1a]:8080"),
        ("2001:db8:0:0::7", "http://[2001:db8::7]:8080"),  # written the one canonical way
        ("10.244.1.7", "http://10.244.1.7:8080"),
    ],
)
def test_pod_urls_are_valid_for_both_address_families(ip: str, url: str) -> None:
    target = config_push.pod_target(pod("p1", ip, 8080, ready=True), _chat)
    assert target is not None
    assert target.url == url
    assert target.ready
    parsed = URL(target.url)  # what aiohttp makes of it: the pod's address and the port
    assert parsed.host is not None
    assert ipaddress.ip_address(parsed.host) == ipaddress.ip_address(ip)
    assert parsed.port == 8080


@pytest.mark.parametrize("ip", ["not-an-ip", "fd00::1:8080:zz", ""])
def test_a_pod_ip_that_is_no_address_gives_no_target_url(ip: str) -> None:
    """Never pushed to (a URL built from it would fail forever), but still known and counted as
    not ready, like a pod without an IP."""
    target = config_push.pod_target(pod("p1", ip, 8080, ready=True), _chat)
    assert target is not None
    assert target.url is None
    assert not target.ready


async def test_config_reaches_a_sidecar_on_an_ipv6_pod_ip() -> None:
    port = free_port()
    pusher = ConfigPusher()
    config = fairness_config(policy=PolicyName.VTC)
    async with (
        running_stub(time_scale=0.1) as stub,
        running_sidecar(stub.url, host="::1", port=port) as sidecar,
    ):
        pusher.set_desired(
            f"{NS}/chat", DesiredConfig(config.version, config.to_document(), ADMIN_TOKEN)
        )
        pusher.observe_pod(pod("p1", "::1", port, ready=True))
        await eventually(lambda: pusher.counts(f"{NS}/chat") == (1, 1))
        assert sidecar.state.dispatcher.scheduler.version == config.version
    await pusher.close()
