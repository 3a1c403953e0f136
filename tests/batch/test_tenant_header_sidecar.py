"""A batch item reaches the sidecar under the tenant header the sidecar trusts.

The sidecar reads the tenant only from its ModelDeployment's `spec.sidecar.tenantHeader`, while
the batch service always sent `x-fleetwarden-tenant`: with any other header every NIW item was
counted (and scheduled) as tenant `default`, so the tenant's weights and limits never applied to
its batch work. Here the whole path runs for real: the target from `fleetwarden batch-targets`'s
generator, the sidecar config the operator renders from the same ModelDeployment, the batch
service dispatching through that sidecar to the stub engine, and the sidecar's
`fleetwarden_tokens_total` read back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwarden.api.v1alpha1 import ModelDeploymentSpec, RegionPoolSpec
from fleetwarden.metrics import names
from fleetwarden.operator.batch_targets import render_batch_targets
from fleetwarden.operator.fairness_render import render_fairness_config
from fleetwarden.sidecar.identity import DEFAULT_TENANT
from tests.batch.builders import chat_line, jsonl
from tests.batch.harness import client, create_batch, running_service, service_config, sqlite_store
from tests.operator.fixtures import example
from tests.support.sidecar_stack import running_sidecar, running_stub

KEY = "llm-serving/mistral-7b"
ITEMS = 4


def _spec(tenant_header: str | None) -> tuple[dict[str, RegionPoolSpec], ModelDeploymentSpec]:
    """mistral-7b from examples/, with `spec.sidecar.tenantHeader` set unless None."""
    raw = example("ModelDeployment", "mistral-7b")["spec"]
    if tenant_header is not None:
        raw["sidecar"]["tenantHeader"] = tenant_header
    spec = ModelDeploymentSpec.model_validate(raw)
    pools = {
        p.pool: RegionPoolSpec.model_validate(example("RegionPool", p.pool)["spec"])
        for p in spec.regions
    }
    return pools, spec


def _tokens_by_tenant(page: str) -> dict[tuple[str, str], float]:
    """(tenant, tier) -> tokens counted on a sidecar's /metrics page."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == f"{names.TOKENS}_total":
                key = (sample.labels[names.TENANT], sample.labels[names.TIER])
                found[key] = found.get(key, 0.0) + sample.value
    return found


@pytest.mark.parametrize("tenant_header", ["x-tenant-id", None])
async def test_batch_items_are_counted_under_their_tenant(
    tmp_path: Path, tenant_header: str | None
) -> None:
    pools, spec = _spec(tenant_header)
    rendered = render_batch_targets(pools, {KEY: spec}, prometheus_url="http://prometheus:9090")
    target = next(t for t in rendered.targets if t["kind"] == "shared")
    async with (
        running_stub(model=spec.served_name, time_scale=0.01) as stub,
        running_sidecar(stub.url, render_fairness_config(spec, None)) as sidecar,
    ):
        # The rendered target, pointed at this sidecar instead of the cluster's Service.
        target = {
            **target,
            "base_url": sidecar.url,
            "utilisation": {"kind": "engine_metrics", "url": f"{sidecar.url}/metrics"},
        }
        config = service_config(sqlite_store(tmp_path), sidecar.url, targets=[target])
        async with running_service(config) as service:
            lines = [chat_line(f"r{i}", model=spec.served_name, max_tokens=4) for i in range(ITEMS)]
            batch_id = await create_batch(service, jsonl(lines))
            async with client(service) as api:
                for _ in range(1500):
                    batch = await api.batches.retrieve(batch_id)
                    if batch.status in ("completed", "failed", "expired", "cancelled"):
                        break
                    await asyncio.sleep(0.02)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None
        assert batch.request_counts.completed == ITEMS
        async with aiohttp.ClientSession() as http, http.get(f"{sidecar.url}/metrics") as response:
            page = await response.text()
    tokens = _tokens_by_tenant(page)
    assert tokens.get(("team-a", "niw"), 0.0) > 0, tokens
    assert not any(tenant == DEFAULT_TENANT for tenant, _ in tokens), tokens
