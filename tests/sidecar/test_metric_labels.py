"""Client-chosen tenants cannot grow the sidecar without bound: metric labels beyond a budget are
counted as `_other` (nothing lost), and idle tenants' fairness state is forgotten."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

import fleetwarden.sidecar.app as sidecar_app
from fleetwarden.api.enums import PolicyName
from fleetwarden.cli import build_parser
from fleetwarden.fairness.config import TenantConfig
from fleetwarden.fairness.vtc import VirtualTokenCounter
from fleetwarden.sidecar.metric_labels import OTHER, LabelBudget
from fleetwarden.sidecar.metrics import SidecarMetrics
from fleetwarden.sidecar.settings import SidecarSettings
from tests.support.sidecar_stack import fairness_config, running_sidecar, running_stub


def test_the_budget_admits_known_names_always_and_the_first_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = LabelBudget("tenant", 2, "--max-tenant-labels")
    budget.configure(["gold"])
    with caplog.at_level(logging.WARNING, logger="fleetwarden.sidecar.metric_labels"):
        labels = [budget.label(v) for v in ("a", "b", "c", "a", "gold", "", "d", "b")]
    assert labels == ["a", "b", OTHER, "a", "gold", "", OTHER, "b"]
    assert len([r for r in caplog.records if "--max-tenant-labels" in r.message]) == 1
    budget.configure(["gold", "c"])  # named by a new config: its own label from now on
    assert budget.label("c") == "c"
    with pytest.raises(ValueError, match=">= 0"):
        LabelBudget("tenant", -1, "--max-tenant-labels")


def _samples(metrics: SidecarMetrics) -> dict[tuple[str, str], float]:
    """(tenant, kind) -> value of fleetwarden_tokens_total, read back through the parser."""
    text = b"".join(metrics.exposition_slices()).decode()
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fleetwarden_tokens_total":
                key = (sample.labels["tenant"], sample.labels["kind"])
                found[key] = found.get(key, 0.0) + sample.value
    return found


def test_many_tenants_make_a_bounded_number_of_series_and_lose_no_token() -> None:
    metrics = SidecarMetrics("m", "r", max_tenant_labels=100, max_app_labels=3)
    metrics.name_known(["vip"], ["chat"])
    for i in range(5_000):
        metrics.count_tokens(f"user-{i}", f"app-{i % 10}", "iw-n", "output", 2)
    metrics.count_tokens("vip", "chat", "iw-n", "output", 7)
    samples = _samples(metrics)
    tenants = {tenant for tenant, _ in samples}
    assert len(tenants) == 100 + 2  # the first 100, vip, and _other
    assert samples[("vip", "output")] == 7
    assert samples[(OTHER, "output")] == 2 * (5_000 - 100)
    assert sum(samples.values()) == 2 * 5_000 + 7
    assert len(metrics.tokens) <= (100 + 1) * 4 + 1  # series: tenant x (3 apps + _other), vip


def test_tenant_and_application_combinations_are_bounded_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Within both budgets, 10 tenants x 20 applications would be 200 pairs (24 series each):
    the pair cap (4 per tenant label) folds the rest, keeping a config-named tenant's name."""
    metrics = SidecarMetrics("m", "r", max_tenant_labels=10, max_app_labels=100)
    metrics.name_known(["vip"], [])
    with caplog.at_level(logging.WARNING, logger="fleetwarden.sidecar.metric_labels"):
        for tenant in [f"t{i}" for i in range(10)] + ["vip"]:
            for app in range(20):
                metrics.count_tokens(tenant, f"app-{app}", "iw-n", "input", 1)
    pairs = {(t, a) for t, a, _, _ in metrics.tokens._values}
    assert len(pairs) <= 4 * 10 + 2  # the cap, and the folded pairs (_other, _other), (vip, _other)
    assert ("vip", OTHER) in pairs
    assert (OTHER, OTHER) in pairs
    assert sum(metrics.tokens._values.values()) == 11 * 20  # nothing lost
    assert len([r for r in caplog.records if "label pairs" in r.message]) == 1


async def test_the_sidecar_bounds_labels_and_forgets_idle_tenants() -> None:
    """Through the real sidecar: six `user` values, a budget of two labels, tenants forgotten
    50 ms after their last request; the config's tenant keeps its label."""
    config = fairness_config(
        policy=PolicyName.VTC,
        tenants={"vip": TenantConfig(weight=1, tier="iw-n", priority_factor=1)},
    )
    async with (
        running_stub(time_scale=0.01) as stub,
        running_sidecar(
            stub.url, config, max_tenant_labels=2, forget_idle_tenants_after_s=0.05
        ) as sc,
        aiohttp.ClientSession() as http,
    ):
        for user in ("u0", "u1", "u2", "u3", "u4", "vip"):
            body = {
                "model": "stub-model",
                "messages": [{"role": "user", "content": "one two"}],
                "max_tokens": 3,
                "user": user,
            }
            async with http.post(f"{sc.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
        async with http.get(f"{sc.url}/metrics") as r:
            text = await r.text()
        await asyncio.sleep(0.1)
        body["user"] = "u5"  # an arrival after 50 idle ms forgets the others
        async with http.post(f"{sc.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200
            await r.read()
        async with http.get(f"{sc.url}/admin/state", headers=sc.admin_headers) as r:
            state = await r.json()
    served = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fleetwarden_requests_total":
                served[sample.labels["tenant"]] = sample.value
    assert served == {"u0": 1.0, "u1": 1.0, OTHER: 3.0, "vip": 1.0}
    assert state["forgottenTenants"] == 6
    policy = sc.state.dispatcher.scheduler.policy
    assert isinstance(policy, VirtualTokenCounter)
    assert set(policy.counters) == {"u5"}


def _run_cli(monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[int, list[SidecarSettings]]:
    """`fleetwarden sidecar FLAGS` up to building the app (nothing is served)."""
    seen: list[SidecarSettings] = []
    real_build_app = sidecar_app.build_app

    def recording_build_app(settings: SidecarSettings, config: Any) -> web.Application:
        seen.append(settings)
        return real_build_app(settings, config)

    monkeypatch.setattr(sidecar_app, "build_app", recording_build_app)
    monkeypatch.setattr(web, "run_app", lambda app, **kwargs: None)
    monkeypatch.setattr("logging.basicConfig", lambda **kwargs: None)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # keep the test's event loop policy
    args = build_parser().parse_args(["sidecar", *flags])
    return args.func(args), seen


def test_the_cli_passes_the_bounds_and_refuses_impossible_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, [settings] = _run_cli(
        monkeypatch,
        "--forget-idle-tenants-after=30",
        "--max-idle-tenants=5",
        "--max-tenant-labels=7",
        "--max-app-labels=0",
    )
    assert code == 0
    assert settings.forget_idle_tenants_after_s == 30.0
    assert (settings.max_idle_tenants, settings.max_tenant_labels) == (5, 7)
    assert settings.max_app_labels == 0
    code, built = _run_cli(monkeypatch, "--max-tenant-labels=-1")
    assert (code, built) == (2, [])
    assert "max_tenant_labels must be >= 0" in capsys.readouterr().err
    for value in ("0", "nan"):  # NaN once passed `<= 0` and crashed later with a traceback
        code, built = _run_cli(monkeypatch, f"--forget-idle-tenants-after={value}")
        assert (code, built) == (2, [])
        assert "forget_idle_tenants_after_s must be > 0" in capsys.readouterr().err
