"""The sidecar's OpenAI routes against the stub engine: shapes, streaming, usage, passthrough.

The engine is the stub (no GPU here); everything else is the production code on real sockets.
"""

from __future__ import annotations

import json

import aiohttp

from tests.support.sidecar_stack import fairness_config, running_sidecar, running_stub

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "one two three four"}]}


def sse_events(text: str) -> list[str]:
    return [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]


async def test_non_streaming_chat_and_completion() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{sc.url}/v1/chat/completions", json={**CHAT, "max_tokens": 4}
            ) as r:
                assert r.status == 200
                body = await r.json()
                assert body["choices"][0]["message"]["content"] == "t0 t1 t2 t3 "
                assert body["usage"]["completion_tokens"] == 4
                assert r.headers["x-fleetwarden-interaction"]
            prompt = {"model": "stub-model", "prompt": "a b c", "max_tokens": 2}
            async with http.post(f"{sc.url}/v1/completions", json=prompt) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["text"] == "t0 t1 "


async def test_stream_relays_every_token_and_strips_usage_the_client_did_not_ask_for() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        async with aiohttp.ClientSession() as http:
            body = {**CHAT, "max_tokens": 5, "stream": True}
            async with http.post(f"{sc.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/event-stream")
                events = sse_events(await r.text())
            # The engine was asked for usage anyway ...
            assert stub.engine.bodies[-1]["stream_options"] == {"include_usage": True}
            # ... but the client sees only role, 5 tokens and [DONE].
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert len(chunks) == 6
            assert all(c["choices"] for c in chunks)
            assert (
                "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
                == "t0 t1 t2 t3 t4 "
            )

            body["stream_options"] = {"include_usage": True}
            async with http.post(f"{sc.url}/v1/chat/completions", json=body) as r:
                events = sse_events(await r.text())
            usage = json.loads(events[-2])
            assert usage["choices"] == []
            assert usage["usage"]["completion_tokens"] == 5


async def test_exact_usage_replaces_the_estimate_in_fairness_counters() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        sc.state.dispatcher.reconfigure(fairness_config(policy="vtc"))
        text = " ".join(["word"] * 40)  # 40 stub tokens + framing; 200 chars = 50 estimated
        body = {
            "model": "stub-model",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 7,
        }
        async with aiohttp.ClientSession() as http:
            for stream in (False, True):
                async with http.post(
                    f"{sc.url}/v1/chat/completions",
                    json={**body, "stream": stream},
                    headers={"x-fleetwarden-tenant": f"t-{stream}"},
                ) as r:
                    await r.read()
        counters = sc.state.dispatcher.scheduler.policy.counters  # type: ignore[attr-defined]
        exact_prompt = 2 + 40 + 4  # the stub's own count
        served = exact_prompt + 2 * 7
        # The second tenant joined an empty queue, so VTC lifted it to the last leaver's counter.
        assert counters == {"t-False": served, "t-True": served + served}


async def test_passthrough_and_engine_errors_keep_their_meaning() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{sc.url}/v1/models") as r:
                assert r.status == 200
                assert (await r.json())["data"][0]["id"] == "stub-model"
            async with http.post(
                f"{sc.url}/v1/chat/completions", json={**CHAT, "model": "nope"}
            ) as r:
                assert r.status == 404  # the engine's own 4xx is relayed as it said it
                assert "does not exist" in (await r.json())["error"]["message"]


async def test_priority_field_is_not_forwarded_unless_configured() -> None:
    async with running_stub(time_scale=0.1) as stub, aiohttp.ClientSession() as http:
        async with running_sidecar(stub.url) as sc:
            async with http.post(
                f"{sc.url}/v1/chat/completions", json={**CHAT, "max_tokens": 1, "priority": -10}
            ) as r:
                assert r.status == 200
            assert "priority" not in stub.engine.bodies[-1]
        async with running_sidecar(stub.url, forward_priority=True) as sc:
            async with http.post(
                f"{sc.url}/v1/chat/completions", json={**CHAT, "max_tokens": 1, "priority": -10}
            ) as r:
                assert r.status == 200
            assert stub.engine.bodies[-1]["priority"] == -10


async def test_metrics_use_the_contract_names() -> None:
    async with running_stub(time_scale=0.1) as stub, running_sidecar(stub.url) as sc:
        async with aiohttp.ClientSession() as http:
            headers = {"x-fleetwarden-tenant": "acme", "x-fleetwarden-app": "chatbot"}
            async with http.post(
                f"{sc.url}/v1/chat/completions",
                json={**CHAT, "max_tokens": 3, "stream": True},
                headers=headers,
            ) as r:
                await r.read()
            async with http.get(f"{sc.url}/metrics") as r:
                text = await r.text()
    assert (
        'fleetwarden_tokens_total{app="chatbot",kind="output",model="stub-model",region="local",tenant="acme",tier="iw-n"} 3.0'
        in text
    )
    assert (
        'fleetwarden_requests_total{app="chatbot",model="stub-model",outcome="served",region="local",tenant="acme",tier="iw-n"} 1.0'
        in text
    )
    for name in (
        "fleetwarden_ttft_seconds_bucket",
        "fleetwarden_fluidity_index_bucket",
        "fleetwarden_queue_depth",
        "fleetwarden_kv_cache_utilization",
        "fleetwarden_config_version{",
    ):
        assert name in text
    assert "_created" not in text
