"""A spot engine killed mid-request: its in-flight items go back to the queue without using up
their attempts, and every custom_id ends up in the output exactly once.

Real: the batch service (SQLite store, dispatcher, maintenance loops), aiohttp to the engine, and
the engine itself as a separate process that the test SIGKILLs (what a spot reclaim does to a
pod). Then an in-process stub engine comes back on the same port (the next spot pod behind the
same Service). The shared target's utilisation is fixed at "unknown" so every item runs on spot.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.batch.engine import EngineClient
from fleetwarden.batch.policy import EngineFailure, EngineReply, RetryPolicy, settle
from fleetwarden.batch.records import BatchStatus
from fleetwarden.batch.service import Overrides
from fleetwarden.batch.utilisation import FixedUtilisation
from tests.batch.builders import MODEL, chat_line, jsonl
from tests.batch.harness import client, running_service, service_config, sqlite_store
from tests.batch.process import ROOT, free_port
from tests.batch.stub_engine import StubEngine
from tests.batch.test_policy import item
from tests.support.eventually import eventually

pytestmark = pytest.mark.timeout(120)

ENGINE_PROCESS = """
import asyncio, sys
from tests.batch.stub_engine import StubEngine

async def main() -> None:
    engine = StubEngine()
    engine.latency_s = 3600.0  # every request hangs until the process is killed
    await engine.start(int(sys.argv[1]))
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture
def doomed_engine() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A stub engine in its own process on a fixed port, to be SIGKILLed by the test."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", ENGINE_PROCESS, str(port)], cwd=ROOT, stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == b"ready"
    yield port, process
    if process.poll() is None:
        process.kill()
    process.wait()


async def test_killed_spot_engine_requeues_in_flight_items_without_counting_attempts(
    tmp_path: Path, doomed_engine: tuple[int, subprocess.Popen[bytes]]
) -> None:
    port, process = doomed_engine
    spot_url = f"http://127.0.0.1:{port}"
    # One attempt only: any counted failure would send its item to the error file.
    config = service_config(
        sqlite_store(tmp_path),
        "http://127.0.0.1:9",
        spot_url=spot_url,
        retry={"max_attempts": 1, "base_delay_s": 0.1, "max_delay_s": 1.0},
    )
    shared = f"{MODEL}/eu-west/shared"
    ids = [f"item-{i}" for i in range(20)]
    overrides = Overrides(sources={shared: FixedUtilisation(None)})
    async with running_service(config, overrides) as service:
        api = client(service)
        uploaded = await api.files.create(
            file=("in.jsonl", jsonl([chat_line(i) for i in ids])), purpose="batch"
        )
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert service.dispatcher is not None
        spot = next(t for t in service.dispatcher.targets if t.config.base_url == spot_url)

        # Requests are hanging inside the engine; then the node is reclaimed.
        await eventually(lambda: spot.in_flight == spot.config.max_in_flight)
        process.send_signal(signal.SIGKILL)
        process.wait()
        await eventually(lambda: spot.in_flight == 0)
        await asyncio.sleep(0.5)  # claims meet a refused connection meanwhile: also interruptions

        # The next spot pod comes up behind the same address.
        engine = await StubEngine().start(port)
        try:
            for _ in range(600):
                done = await api.batches.retrieve(batch.id)
                if done.status == BatchStatus.COMPLETED.value:
                    break
                await asyncio.sleep(0.05)
            assert done.status == BatchStatus.COMPLETED.value, done
            assert done.request_counts is not None
            assert (done.request_counts.completed, done.request_counts.failed) == (len(ids), 0)
            assert done.error_file_id is None
            assert done.output_file_id is not None
            output = (await api.files.content(done.output_file_id)).text
        finally:
            await engine.stop()
    written = [json.loads(line)["custom_id"] for line in output.splitlines() if line]
    assert sorted(written) == sorted(ids)  # every custom_id exactly once
    assert set(engine.calls) == set(ids)


def test_only_target_departures_are_interruptions() -> None:
    """A timeout or a plain 503 still counts (a request the engine cannot serve must end in the
    error file); a refused or reset connection and a draining sidecar's 503 do not."""
    policy = RetryPolicy(max_attempts=1, base_delay_s=2.0)
    draining = json.dumps({"error": {"code": "engine_not_ready", "message": "draining"}}).encode()
    for outcome in (
        EngineFailure("ServerDisconnectedError", interrupted=True),
        EngineReply(503, draining, "r"),
    ):
        settled = settle(item(attempts=1), outcome, policy, now=10.0)
        assert (settled.result, settled.retry_at, settled.refund) == (None, 12.0, True)
    for outcome in (EngineFailure("TimeoutError"), EngineReply(503, b"{}", "r")):
        settled = settle(item(attempts=1), outcome, policy, now=10.0)
        assert settled.result is not None
        assert not settled.result.ok


def test_interruptions_past_the_free_ones_count_as_attempts() -> None:
    policy = RetryPolicy(max_attempts=2, base_delay_s=2.0, max_interruptions=2)
    reset = EngineFailure("ServerDisconnectedError", interrupted=True, mid_request=True)
    for count in (1, 2):
        assert settle(item(attempts=2), reset, policy, now=10.0, interruptions=count).refund
    counted = settle(item(attempts=1), reset, policy, now=10.0, interruptions=3)
    assert (counted.result, counted.refund) == (None, False)
    assert counted.retry_at is not None
    assert counted.retry_at > 10.0
    final = settle(item(attempts=2), reset, policy, now=10.0, interruptions=4)
    assert final.result is not None
    assert not final.result.ok
    assert "interrupted 4 times" in final.result.line


async def test_engine_client_marks_a_refused_connection_as_interrupted() -> None:
    """Nothing listens on the port: what a spot Service without pods looks like."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        config = service_config({"kind": "sqlite"}, f"http://127.0.0.1:{port}").targets[0]
        async with aiohttp.ClientSession() as session:
            outcome = await EngineClient(session, 5.0).send(config, item(), Tier.NIW)
    assert isinstance(outcome, EngineFailure)
    assert outcome.interrupted
    assert not outcome.mid_request  # never reached an engine: always a free retry
