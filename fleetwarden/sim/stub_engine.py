"""A stand-in for vLLM that runs anywhere: OpenAI-compatible, streaming, continuous batching.

The batching is the engine model of `fleetwarden.sim.engine` run in real time (optionally sped
up by `time_scale`): requests wait in a FIFO, join the batch when the model admits them (idle, or
every k decode steps, within the KV budget and the prefill cap), get their first token after the
prefill time and one token per decode step. It publishes vLLM's metric names with vLLM's meaning
(`vllm:kv_cache_usage_perc` is the fraction of the KV budget held, `vllm:num_requests_waiting`
the FIFO length), so the sidecar's gate is exercised against the numbers it will read in
production. The real-vLLM test suite checks that claim against the real engine.

Every request generates exactly `max_tokens` tokens (as vLLM does with `ignore_eos`), which makes
runs reproducible. The prompt is "tokenized" one token per whitespace-separated word plus a few
framing tokens per chat message: close to, but deliberately not the same as, the sidecar's
character-based estimate, so the reconciliation with `usage` is exercised too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from fleetwarden.fairness.request import Request
from fleetwarden.sim.engine import EngineModel, EngineProfile, ProfileError
from fleetwarden.sim.input_values import InputValueError, finite_number
from fleetwarden.sim.profiles import VTC_A10G

DEFAULT_MAX_TOKENS = 16
FRAMING_TOKENS_PER_MESSAGE = 4


@dataclass(eq=False)
class Call:
    request: Request
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    """Token indices as they are generated; None marks the end."""
    cancelled: bool = False


def count_prompt_tokens(body: dict[str, Any]) -> int:
    """The stub's tokenizer: words, plus chat framing; at least one token."""
    if isinstance(body.get("messages"), list):
        total = 2
        for message in body["messages"]:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            total += len(str(content or "").split()) + FRAMING_TOKENS_PER_MESSAGE
        return total
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        if all(isinstance(p, int) for p in prompt):
            return max(1, len(prompt))
        prompt = " ".join(str(p) for p in prompt)
    return max(1, len(str(prompt).split()) + 1)


class StubEngine:
    """The batching loop plus counters; `app()` serves it over HTTP."""

    def __init__(
        self,
        profile: EngineProfile = VTC_A10G,
        *,
        model: str = "stub-model",
        time_scale: float = 1.0,
    ) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):  # NaN fails `<= 0` too
            raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
        self.profile = profile
        self.model_name = model
        self.time_scale = time_scale
        self.engine = EngineModel(profile)
        self.waiting: deque[Call] = deque()
        self._calls: dict[int, Call] = {}
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.bodies: deque[dict[str, Any]] = deque(maxlen=256)
        """The last request bodies received (tests check what the sidecar forwards)."""
        self.admission_order: list[int] = []
        """`seq` of requests in the order they entered the batch (tests of dispatch order)."""
        self._task: asyncio.Task[None] | None = None

    # -- batching ----------------------------------------------------------------------------------

    def submit(self, prompt_tokens: int, max_tokens: int) -> Call:
        seq = next(self._seq)
        request = Request(seq, "engine", 0.0, prompt_tokens, max_tokens)
        call = Call(request)
        self._calls[seq] = call
        self.waiting.append(call)
        self.requests_total += 1
        self._wake.set()
        return call

    def cancel(self, call: Call) -> None:
        call.cancelled = True
        with contextlib.suppress(ValueError):
            self.waiting.remove(call)
        self.engine.running = [r for r in self.engine.running if r.request is not call.request]
        self._calls.pop(call.request.seq, None)

    def _admit(self) -> list[Call]:
        batch: list[Call] = []
        prompt = 0
        while self.waiting:
            head = self.waiting[0]
            over_cap = (
                batch and prompt + head.request.input_tokens > self.profile.prefill_cap_tokens
            )
            if over_cap or not self.engine.fits([c.request for c in batch] + [head.request]):
                break
            batch.append(self.waiting.popleft())
            prompt += head.request.input_tokens
        if not batch and self.engine.idle and self.waiting:
            batch.append(self.waiting.popleft())  # larger than the whole budget: run it alone
        return batch

    def _emit(self, requests: list[Request]) -> None:
        for request in requests:
            call = self._calls.get(request.seq)
            request.output_tokens += 1
            self.generation_tokens_total += 1
            if call is not None:
                call.tokens.put_nowait(request.output_tokens - 1)
        for done in self.engine.finished():
            call = self._calls.pop(done.request.seq, None)
            if call is not None:
                call.tokens.put_nowait(None)

    async def _run(self) -> None:
        while True:
            if self.engine.idle and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
            if self.engine.may_admit() and (batch := self._admit()):
                requests = [c.request for c in batch]
                self.admission_order.extend(r.seq for r in requests)
                self.prompt_tokens_total += sum(r.input_tokens for r in requests)
                duration = self.engine.prefill(
                    requests, 0.0, [r.max_output_tokens for r in requests]
                )
                await asyncio.sleep(duration * self.time_scale)
                self._emit(requests)
            if not self.engine.idle:
                await asyncio.sleep(self.engine.decode_seconds() * self.time_scale)
                self._emit([r.request for r in self.engine.running])
                self.engine.after_decode_step()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="stub-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- metrics -----------------------------------------------------------------------------------

    def kv_usage(self) -> float:
        return min(1.0, self.engine.held_tokens() / self.profile.kv_budget_tokens)

    def metrics_text(self) -> str:
        label = f'{{model_name="{self.model_name}"}}'
        lines = [
            ("vllm:num_requests_running", "gauge", len(self.engine.running)),
            ("vllm:num_requests_waiting", "gauge", len(self.waiting)),
            ("vllm:kv_cache_usage_perc", "gauge", self.kv_usage()),
            ("vllm:prompt_tokens_total", "counter", self.prompt_tokens_total),
            ("vllm:generation_tokens_total", "counter", self.generation_tokens_total),
            ("vllm:num_preemptions_total", "counter", 0),
        ]
        out: list[str] = []
        for name, kind, value in lines:
            family = name.removesuffix("_total") if kind == "counter" else name
            out += [f"# TYPE {family} {kind}", f"{name}{label} {value}"]
        return "\n".join(out) + "\n"

    # -- HTTP --------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)

        async def lifecycle(app: web.Application) -> AsyncIterator[None]:
            self.start()
            yield
            await self.stop()

        app.cleanup_ctx.append(lifecycle)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "fleetwarden"}
        return web.json_response({"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, http: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = await http.json()
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            return web.json_response(
                {"error": {"message": "invalid JSON body", "type": "BadRequestError", "code": 400}},
                status=400,
            )
        self.bodies.append(body)
        if body.get("model") != self.model_name:
            message = f"The model `{body.get('model')}` does not exist."
            return web.json_response(
                {"error": {"message": message, "type": "NotFoundError", "code": 404}}, status=404
            )
        max_tokens = int(
            body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
        )
        prompt_tokens = count_prompt_tokens(body)
        call = self.submit(prompt_tokens, max_tokens)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-stub-{call.request.seq}"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        try:
            if body.get("stream"):
                options = body.get("stream_options") or {}
                return await self._stream(
                    http, call, ident, chat, usage, options.get("include_usage") is True
                )
            while await call.tokens.get() is not None:
                pass
            text = "".join(f"t{i} " for i in range(max_tokens))
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return web.json_response(
                {
                    "id": ident,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": self.model_name,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        finally:
            self.cancel(call)

    async def _stream(
        self,
        http: web.Request,
        call: Call,
        ident: str,
        chat: bool,
        usage: dict[str, int],
        include_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(http)
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            chunk = {"id": ident, "object": kind, "created": created, "model": self.model_name}
            chunk["choices"] = choices
            chunk.update(extra)
            return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

        if chat:
            role = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
            }
            await response.write(event([role]))
        last = call.request.max_output_tokens - 1
        while (index := await call.tokens.get()) is not None:
            finish = "length" if index == last else None
            piece = f"t{index} "
            choice = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": piece, "finish_reason": finish}
            )
            await response.write(event([choice]))
        if include_usage:
            await response.write(event([], usage=usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


PROG = "fleetwarden.sim.stub_engine"
"""The prefix of the stub's one-line errors (as `fleetwarden replay: ...` for the CLI)."""


def main(argv: list[str] | None = None) -> int:
    """`python -m fleetwarden.sim.stub_engine --port 8000 [--profile FILE] [--time-scale X]`.

    Bad input (an unreadable or invalid profile, a time scale that is not a finite number > 0)
    is one line on stderr naming the file or option and exit code 2, as the `fleetwarden`
    subcommands do, not a traceback: the profile goes through `EngineProfile.load`, the same
    check `fleetwarden replay --engine` uses."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--profile", type=Path, help="engine profile YAML (default: vtc-a10g)")
    parser.add_argument("--model", default="stub-model")
    parser.add_argument("--time-scale", type=float, default=1.0, help="<1 runs faster than real")
    args = parser.parse_args(argv)
    try:
        profile = EngineProfile.load(args.profile) if args.profile else VTC_A10G
        time_scale = finite_number(args.time_scale, above=True)
    except ProfileError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except InputValueError as exc:
        print(f"{PROG}: --time-scale {exc}", file=sys.stderr)
        return 2
    stub = StubEngine(profile, model=args.model, time_scale=time_scale)
    web.run_app(stub.app(), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
