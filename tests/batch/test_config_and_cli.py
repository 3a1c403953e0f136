"""The service config file, the command line, and the utilisation sources."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from pydantic import ValidationError

from fleetwarden.batch.__main__ import main
from fleetwarden.batch.config import BatchServiceConfig
from fleetwarden.batch.policy import TargetKind
from fleetwarden.batch.records import QueueKey
from fleetwarden.batch.utilisation import PrometheusSource, kv_cache_usage
from fleetwarden.cli import batch as batch_cli

EXAMPLE = """
listen: 0.0.0.0:8090
store: {kind: sqlite, path: /var/lib/fleetwarden/batch.sqlite3, synchronous: full}
auth:
  tokens: {sk-eval: eval-team}
  token_sha256: {DIGEST: nightly}
quotas:
  default: {max_queued_items: 50000, max_file_bytes: 104857600}
  tenants: {eval-team: {max_queued_items: 200000}}
release: {one_below: 0.6, two_below: 0.5, promote_after_s: 36000}
retry: {max_attempts: 5, base_delay_s: 1, max_delay_s: 300}
dispatch: {signal_interval_s: 1, request_timeout_s: 600, lease_s: 660}
targets:
  - model: llama-3-70b
    region: westus
    base_url: http://llama-3-70b-westus.serving:8080
    utilisation:
      kind: prometheus
      url: http://prometheus.monitoring:9090
      query: max(fleetwarden_kv_cache_utilization{model="$model",region="$region"})
  - {model: llama-3-70b, region: eastus, base_url: "http://e:8080",
     utilisation: {kind: engine_metrics, url: "http://e:8080/metrics"}}
  - {model: llama-3-70b, region: westus, kind: spot, base_url: "http://spot:8080"}
""".replace("DIGEST", hashlib.sha256(b"sk-nightly").hexdigest())


def base(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(EXAMPLE)
    raw.update(changes)
    return raw


def test_the_example_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "batch.yaml"
    path.write_text(EXAMPLE)
    config = BatchServiceConfig.load(path)
    assert config.regions("llama-3-70b") == ["westus", "eastus"]
    assert config.queues() == [QueueKey("llama-3-70b", "eastus"), QueueKey("llama-3-70b", "westus")]
    assert config.quota("eval-team").max_queued_items == 200_000
    assert config.quota("nightly").max_queued_items == 50_000
    assert set(config.auth.digests().values()) == {"eval-team", "nightly"}
    assert config.targets[2].kind is TargetKind.SPOT
    assert config.release.rule().promote_after_s == 36000
    json_path = tmp_path / "batch.json"
    json_path.write_text(json.dumps(base()))
    assert BatchServiceConfig.load(json_path) == config


@pytest.mark.parametrize(
    "changes",
    [
        {"release": {"one_below": 0.4, "two_below": 0.5}},
        {"dispatch": {"request_timeout_s": 600, "lease_s": 60}},
        {"quotas": {"tenants": {"stranger": {}}}},
        {"targets": [{"model": "m", "region": "r", "base_url": "http://x"}]},  # no signal
        {"targets": [{"model": "a|b", "region": "r", "kind": "spot", "base_url": "http://x"}]},
        {"auth": {"token_sha256": {"not-hex": "t"}}},
        {"auth": {"tokens": {"sk": "bad tenant name"}}},
        {"unknown_section": {}},
        {"retry": {"max_attemps": 3}},
    ],
)
def test_config_mistakes_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BatchServiceConfig.model_validate(base(**changes))


def test_duplicate_targets_are_refused() -> None:
    raw = base()
    raw["targets"].append(raw["targets"][0])
    with pytest.raises(ValidationError, match="appears twice"):
        BatchServiceConfig.model_validate(raw)


def test_the_cli_registers_batch_and_a_bad_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    batch_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["batch", "--config", "c.yaml", "--listen", "127.0.0.1:9"])
    assert (args.config, args.listen, args.func) == (Path("c.yaml"), "127.0.0.1:9", batch_cli.run)
    bad = tmp_path / "bad.yaml"
    bad.write_text("retry: {max_attempts: 0}\n")
    assert main(["--config", str(bad)]) == 2
    assert "max_attempts" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert main(["--config", str(bad).replace("bad", "x"), "--listen", "nope"]) == 2
    unopenable = tmp_path / "unopenable.yaml"
    unopenable.write_text(f"store: {{kind: sqlite, path: {tmp_path / 'no' / 'such.db'}}}\n")
    assert main(["--config", str(unopenable), "--listen", "127.0.0.1:0"]) == 1
    assert "cannot open" in capsys.readouterr().err


def test_kv_cache_usage_prefers_the_new_vllm_name_and_averages_engines() -> None:
    page = "\n".join(
        [
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            'vllm:gpu_cache_usage_perc{engine="0"} 0.9',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0"} 0.2',
            'vllm:kv_cache_usage_perc{engine="1"} 0.4',
        ]
    )
    assert kv_cache_usage(page) == pytest.approx(0.3)
    assert kv_cache_usage("vllm_gpu_cache_usage_perc 0.7\n") == pytest.approx(0.7)
    assert kv_cache_usage("vllm:num_requests_running 1\n") is None
    assert kv_cache_usage("this is { not an exposition") is None


@pytest.fixture
async def prometheus() -> AsyncIterator[tuple[str, list[str]]]:
    """A fake Prometheus HTTP API that records queries and answers one vector."""
    queries: list[str] = []

    async def query(request: web.Request) -> web.Response:
        form = dict(request.query) | dict(await request.post())
        queries.append(str(form["query"]))
        result = [
            {"metric": {"pod": "a"}, "value": [1.0, "0.41"]},
            {"metric": {"pod": "b"}, "value": [1.0, "0.57"]},
        ]
        return web.json_response({"status": "success",
                                  "data": {"resultType": "vector", "result": result}})  # fmt: skip

    app = web.Application()
    app.router.add_route("*", "/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", queries
    await runner.cleanup()


async def test_the_prometheus_source_substitutes_the_queue_and_takes_the_max(
    prometheus: tuple[str, list[str]],
) -> None:
    url, queries = prometheus
    template = 'max by (pod) (fleetwarden_kv_cache_utilization{model="$model",region="$region"})'
    source = PrometheusSource(url, template, "llama", "westus", timeout_s=2)
    assert await source.utilisation() == pytest.approx(0.57)
    assert queries == [
        'max by (pod) (fleetwarden_kv_cache_utilization{model="llama",region="westus"})'
    ]
    down = PrometheusSource("http://127.0.0.1:9", template, "m", "r", timeout_s=0.5)
    assert await down.utilisation() is None
