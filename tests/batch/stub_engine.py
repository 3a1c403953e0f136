"""A minimal OpenAI-compatible engine on 127.0.0.1 for the batch tests and benchmark.

It answers /v1/chat/completions and /v1/completions at once (or after `latency_s`), serves
/metrics with a `vllm:kv_cache_usage_perc` gauge the test sets, counts calls per batch item
(from the `x-fleetwarden-batch-item` header) and records the tier each call came with. Failures
are scripted per custom_id: `fail_first[cid] = n` answers 503 n times, `fail_always[cid] = 400`
answers that status forever.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any
from urllib.parse import quote, unquote

from aiohttp import web

from fleetwarden.batch.policy import ITEM_HEADER, TIER_HEADER


class StubEngine:
    """The stub and everything it observed."""

    def __init__(self, model: str = "llama-3-8b", kv_usage: float | None = 0.0) -> None:
        self.model = model
        self.kv_usage = kv_usage
        """Gauge value served on /metrics; None serves a page without the gauge."""
        self.latency_s = 0.0
        self.calls: Counter[str] = Counter()
        """Calls per custom_id."""
        self.tiers: dict[str, list[str]] = {}
        self.fail_first: dict[str, int] = {}
        self.fail_always: dict[str, int] = {}
        self.contents: dict[str, str] = {}
        """Reply content per custom_id instead of `echo <custom_id>` (any str: the reply is JSON
        with non-ASCII escaped, so a lone surrogate arrives as its `\\udXXX` escape)."""
        self.reset_always: set[str] = set()
        """custom_ids whose every request drops the connection (a request that kills its engine)."""
        self.received_at: list[float] = []
        """time.perf_counter() of every call, for latency measurements."""
        self.arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    async def start(self, port: int = 0) -> StubEngine:
        """Serve on 127.0.0.1:`port` (0 picks one; a fixed port brings a killed engine back)."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _complete(self, request: web.Request) -> web.Response:
        self.received_at.append(time.perf_counter())
        self.arrived.set()
        item = request.headers.get(ITEM_HEADER, "")
        custom_id = unquote(item.partition("/")[2])
        self.calls[custom_id] += 1
        self.tiers.setdefault(custom_id, []).append(request.headers.get(TIER_HEADER, ""))
        body: dict[str, Any] = await request.json()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if custom_id in self.reset_always and request.transport is not None:
            request.transport.close()  # the client sees the connection drop, as if we crashed
            raise asyncio.CancelledError
        if custom_id in self.fail_always:
            status = self.fail_always[custom_id]
            error = {"error": {"message": "scripted failure", "type": "invalid_request_error"}}
            return web.json_response(error, status=status)
        if self.fail_first.get(custom_id, 0) > 0:
            self.fail_first[custom_id] -= 1
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        prompt_tokens = len(str(body.get("messages") or body.get("prompt") or "")) // 4 + 1
        answer = {
            "id": f"cmpl-{custom_id}-{self.calls[custom_id]}",
            "object": "chat.completion",
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": self.contents.get(custom_id, f"echo {custom_id}"),
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 7,
                "total_tokens": prompt_tokens + 7,
            },
        }
        return web.json_response(answer, headers={"x-request-id": f"req-{quote(custom_id)}"})

    async def _metrics(self, request: web.Request) -> web.Response:
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="{self.model}"}} 0.0',
        ]
        if self.kv_usage is not None:
            lines += [
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="{self.model}"}} {self.kv_usage}',
            ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
