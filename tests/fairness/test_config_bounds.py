"""A hand-written sidecar config is bounded exactly as the CRD fields it is rendered from.

Before, `FairnessConfig` accepted a DRR quantum of 0 (refused only when a sidecar installed the
config), a negative `max_inflight_tokens` (the gate then held the engine to one request at a
time) and an infinite tenant weight (a weighted-VTC tenant charged nothing), none of which the
TenantPolicy or ModelDeployment CRD allows. Now each is refused at validation, naming the field:
422 from `PUT /admin/config`, exit 2 from `--config`. Nothing the operator can render is refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetwarden.api.enums import PolicyName
from fleetwarden.api.v1alpha1.modeldeployment import (
    CapacityGateSettings,
    SidecarSettings,
    TierSettings,
    TierTargets,
)
from fleetwarden.api.v1alpha1.tenantpolicy import (
    DpaSettings,
    DrrSettings,
    TenantDefaults,
    TenantPolicySpec,
    TenantSettings,
    TokenWeights,
)
from fleetwarden.cli import main
from fleetwarden.fairness.config import FairnessConfig
from fleetwarden.fairness.render import render_config, standalone_config
from tests.support.sidecar_stack import running_sidecar, running_stub

INF = math.inf
REFUSED: list[tuple[tuple[str, ...], object]] = [
    (("drr", "quantum", "iw-n"), 0),
    (("drr", "quantum", "niw"), -3),
    (("gate", "max_inflight_tokens"), 0),
    (("gate", "max_inflight_tokens"), -1),
    (("defaults", "weight"), INF),
    (("tenants", "alice", "weight"), INF),
    (("tenants", "alice", "weight"), 2e6),
    (("defaults", "priority_factor"), INF),
    (("token_weights", "output"), INF),
    (("dpa", "urgent_within_s"), INF),
    (("tiers", "iw-f", "ttft_s"), INF),
    (("tiers", "iw-n", "tbt_s"), 61.0),
    (("gate", "telemetry_max_age_s"), 601.0),
]


def document_with(path: tuple[str, ...], value: object) -> str:
    """The standalone config with a tenant alice, and one field (by path) set to `value`."""
    body: dict[str, Any] = json.loads(standalone_config("m").to_document())
    body["tenants"] = {"alice": dict(body["defaults"])}
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(body)  # inf is written as Infinity, which json.loads reads back


@pytest.mark.parametrize(("path", "value"), REFUSED)
def test_a_value_the_crd_refuses_is_refused_naming_its_field(
    path: tuple[str, ...], value: object
) -> None:
    with pytest.raises(ValidationError) as caught:
        FairnessConfig.from_document(document_with(path, value))
    (error,) = caught.value.errors()
    assert tuple(str(part) for part in error["loc"]) == path


def test_the_crd_limits_themselves_render_and_are_accepted() -> None:
    """Each bound is inclusive where the CRD's is: the extreme values the operator can render."""
    spec = TenantPolicySpec(
        policy=PolicyName.DRR,
        token_weights=TokenWeights(input=1e300, system=0, output=0),
        tenants=[TenantSettings(name="alice", weight=1e6, priority_factor=1e3)],
        defaults=TenantDefaults(weight=1e-9, priority_factor=1e-9),
        drr=DrrSettings(quantum={"iw-f": 1, "iw-n": 1, "niw": 1}),
        dpa=DpaSettings(severely_expired_seconds=1e300, urgent_within_seconds=0),
    )
    tiers = TierSettings(
        iw_f=TierTargets(ttft_seconds=3600, tbt_seconds=60),
        iw_n=TierTargets(ttft_seconds=1e-9, tbt_seconds=1e-9),
    )
    sidecar = SidecarSettings(
        capacity_gate=CapacityGateSettings(max_inflight_tokens=1, telemetry_max_age_seconds=600)
    )
    config = render_config(
        served_model="m", spec=spec, tiers=tiers, sidecar=sidecar, source="TenantPolicy ns/p"
    )
    assert FairnessConfig.from_document(config.to_document()) == config


@settings(max_examples=60, deadline=None)
@given(
    weight=st.floats(min_value=0, max_value=1e6, exclude_min=True),
    priority=st.floats(min_value=0, max_value=1e3, exclude_min=True),
    quantum=st.integers(min_value=1, max_value=2**40),
    token_weight=st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    dpa=st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    ttft=st.floats(min_value=0, max_value=3600, exclude_min=True),
    tbt=st.floats(min_value=0, max_value=60, exclude_min=True),
    budget=st.none() | st.integers(min_value=1, max_value=2**40),
    age=st.floats(min_value=0, max_value=600, exclude_min=True),
)
def test_nothing_the_operator_can_render_is_refused(
    weight: float,
    priority: float,
    quantum: int,
    token_weight: float,
    dpa: float,
    ttft: float,
    tbt: float,
    budget: int | None,
    age: float,
) -> None:
    spec = TenantPolicySpec(
        policy=PolicyName.WSC,
        token_weights=TokenWeights(input=token_weight, system=token_weight, output=token_weight),
        tenants=[TenantSettings(name="alice", weight=weight, priority_factor=priority)],
        defaults=TenantDefaults(weight=weight, priority_factor=priority),
        drr=DrrSettings(quantum={"iw-f": quantum, "niw": quantum}),
        dpa=DpaSettings(severely_expired_seconds=dpa, urgent_within_seconds=dpa),
    )
    tiers = TierSettings(
        iw_f=TierTargets(ttft_seconds=ttft, tbt_seconds=tbt),
        iw_n=TierTargets(ttft_seconds=ttft, tbt_seconds=tbt),
    )
    sidecar = SidecarSettings(
        capacity_gate=CapacityGateSettings(
            max_inflight_tokens=budget, telemetry_max_age_seconds=age
        )
    )
    config = render_config(
        served_model="m", spec=spec, tiers=tiers, sidecar=sidecar, source="TenantPolicy ns/p"
    )
    assert FairnessConfig.from_document(config.to_document()) == config


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("drr", "quantum", "iw-n"), 0, "drr.quantum.iw-n"),
        (("gate", "max_inflight_tokens"), -1, "gate.max_inflight_tokens"),
        (("defaults", "weight"), INF, "defaults.weight"),
    ],
)
def test_a_config_file_with_one_is_named_and_exits_2(
    path: tuple[str, ...],
    value: object,
    field: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: list[object] = []
    # Were the file accepted, the sidecar would serve until stopped: record instead of serving.
    monkeypatch.setattr("aiohttp.web.run_app", lambda app, **kwargs: served.append(app))
    monkeypatch.setattr("uvloop.install", lambda: None, raising=False)
    config = tmp_path / "fairness.json"
    config.write_text(document_with(path, value))
    assert main(["sidecar", "--config", str(config)]) == 2
    assert served == []
    err = capsys.readouterr().err
    assert err.startswith(f"fleetwarden sidecar: --config {config}: ")
    assert f"{field} " in err


async def test_a_pushed_config_with_one_is_refused_422_and_changes_nothing() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        scheduler = sc.state.dispatcher.scheduler
        before = scheduler.version
        async with aiohttp.ClientSession() as http:
            for path, value in ((("drr", "quantum", "niw"), 0), (("defaults", "weight"), INF)):
                async with http.put(
                    f"{sc.url}/admin/config",
                    data=document_with(path, value),
                    headers=sc.admin_headers,
                ) as r:
                    assert r.status == 422
                    error = (await r.json())["error"]
                assert error["code"] == "invalid_config"
                assert ".".join(path) in error["message"]
                assert scheduler.version == before
