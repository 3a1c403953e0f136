"""A valid config the scheduler fails to install is a clear 500, and the running config stays.

Validation refuses what it knows to be bad (422), but a bug or an unexpected combination can still
make installing a valid document raise. Before the fix that was the generic "internal error" 500
while the sidecar reported the new version and enforced parts of the old config; now the answer
says the config was not applied and the running one (named by version) is unchanged, and it is.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from fleetwarden.api.enums import PolicyName
from fleetwarden.fairness import scheduler as scheduler_module
from tests.support.sidecar_stack import fairness_config, running_sidecar, running_stub


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("limiter exploded")


async def test_a_failed_install_is_a_500_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    new = fairness_config(policy=PolicyName.VTC, source="TenantPolicy ns/p")
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        dispatcher = sc.state.dispatcher
        before, policy = dispatcher.scheduler.version, dispatcher.scheduler.policy
        async with aiohttp.ClientSession(headers=sc.admin_headers) as http:
            with monkeypatch.context() as patch:
                patch.setattr(scheduler_module.RateLimiter, "from_config", refuse)
                async with http.put(f"{sc.url}/admin/config", data=new.to_document()) as r:
                    assert r.status == 500
                    error = (await r.json())["error"]
            assert error["code"] == "config_not_applied"
            assert error["type"] == "server_error"
            assert "RuntimeError: limiter exploded" in error["message"]
            assert f"running config (version {before}) is unchanged" in error["message"]
            assert dispatcher.scheduler.version == before
            assert dispatcher.scheduler.policy is policy
            async with http.get(f"{sc.url}/admin/state") as r:
                state = await r.json()
            assert (state["version"], state["policy"]) == (before, "fcfs")
            async with http.get(f"{sc.url}/metrics") as r:
                metrics = await r.text()
            assert f'version="{before}"' in metrics
            assert f'version="{new.version}"' not in metrics
            # The cause gone, the same push is applied (the failure did not claim its version).
            async with http.put(f"{sc.url}/admin/config", data=new.to_document()) as r:
                assert r.status == 200
                assert await r.json() == {"version": new.version, "changed": True}
