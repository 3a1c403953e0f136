"""A ModelDeployment the API accepts gives a Service and a pod the API server and kubelet accept:
no two Service ports with one number and protocol, no two containers on one port."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetwarden.operator import builders
from tests.operator.fixtures import region_target


def _ports(target: builders.RegionTarget) -> tuple[list[Any], list[Any]]:
    service = builders.build_service(target)["spec"]["ports"]
    pod = builders.build_deployment(target)["spec"]["template"]["spec"]
    container_ports = [p["containerPort"] for c in pod["containers"] for p in c["ports"]]
    return [(p["port"], p["protocol"]) for p in service], container_ports


@pytest.mark.parametrize("port", [81, 7999, 8080, 65535])
def test_accepted_sidecar_ports_give_distinct_ports(port: int) -> None:
    service_ports, container_ports = _ports(region_target(sidecar={"port": port}))
    assert len(set(service_ports)) == len(service_ports)
    assert len(set(container_ports)) == len(container_ports)


@pytest.mark.parametrize(
    "changes",
    [
        {"sidecar": {"port": builders.SERVICE_PORT}},
        {"sidecar": {"port": 8000}},  # the engine's default port
    ],
)
def test_clashing_sidecar_ports_never_reach_the_builders(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        region_target(**changes)
