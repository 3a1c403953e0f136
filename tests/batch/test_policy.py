"""The dispatcher's pure decisions: release plans, tiers, backoff and settlement."""

from __future__ import annotations

import json

import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.batch.policy import (
    EngineFailure,
    EngineReply,
    ReleasePlan,
    RetryPolicy,
    TargetKind,
    backoff_s,
    release_plan,
    settle,
    tier_for,
)
from fleetwarden.batch.records import ClaimedItem
from fleetwarden.batch.records import QueueKey as Q
from fleetwarden.scaling.niw_release import ReleaseRule

RULE = ReleaseRule()
POLICY = RetryPolicy(max_attempts=3, base_delay_s=2.0, max_delay_s=30.0, jitter=0.25)


def item(attempts: int = 1) -> ClaimedItem:
    return ClaimedItem("batch_x", 4, "cid", "/v1/chat/completions", {}, "t", 0.0, 100.0,
                       attempts, "tok", Q("m", "r"))  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "utilisation", "free", "plan"),
    [
        (TargetKind.SHARED, 0.70, 8, ReleasePlan(0, 8, 8)),
        (TargetKind.SHARED, 0.55, 8, ReleasePlan(1, 8, 8)),
        (TargetKind.SHARED, 0.10, 8, ReleasePlan(2, 8, 8)),
        (TargetKind.SHARED, 0.10, 1, ReleasePlan(1, 1, 1)),
        (TargetKind.SHARED, None, 8, ReleasePlan(0, 8, 8)),
        (TargetKind.SHARED, 0.10, -2, ReleasePlan(0, 0, 0)),
        (TargetKind.SPOT, 0.99, 5, ReleasePlan(5, 0, 5)),
        (TargetKind.SPOT, None, 0, ReleasePlan(0, 0, 0)),
    ],
)
def test_release_plans(
    kind: TargetKind, utilisation: float | None, free: int, plan: ReleasePlan
) -> None:
    assert release_plan(kind, RULE, utilisation, free) == plan


def test_promotion_to_interactive_at_ten_hours() -> None:
    assert tier_for(RULE, created_at=0.0, now=36_000 - 1) is Tier.NIW
    assert tier_for(RULE, created_at=0.0, now=36_000) is Tier.IW_NORMAL


def test_backoff_doubles_is_capped_jittered_deterministically_and_honours_retry_after() -> None:
    delays = [backoff_s(POLICY, attempt, "k", None) for attempt in range(1, 8)]
    for attempt, delay in enumerate(delays, start=1):
        nominal = min(30.0, 2.0 * 2 ** (attempt - 1))
        assert nominal * 0.75 <= delay <= nominal * 1.25
    assert delays == [backoff_s(POLICY, a, "k", None) for a in range(1, 8)]
    assert backoff_s(POLICY, 1, "k", None) != backoff_s(POLICY, 1, "other", None)
    assert backoff_s(POLICY, 1, "k", 20.0) == 20.0
    assert backoff_s(POLICY, 1, "k", 500.0) == 30.0


def reply(status: int, body: object, retry_after: float | None = None) -> EngineReply:
    return EngineReply(status, json.dumps(body).encode(), "req-1", retry_after)


def test_a_2xx_json_answer_is_an_output_line_with_its_usage() -> None:
    answer = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}}
    settled = settle(item(), reply(200, answer), POLICY, now=10.0)
    assert settled.result is not None
    assert settled.result.ok
    assert (settled.result.input_tokens, settled.result.output_tokens) == (11, 5)
    line = json.loads(settled.result.line)
    assert line["custom_id"] == "cid"
    assert line["response"] == {"status_code": 200, "request_id": "req-1", "body": answer}
    assert line["error"] is None


@pytest.mark.parametrize("outcome", [reply(503, {}), reply(429, {}), EngineFailure("reset")])
def test_retryable_failures_wait_then_become_errors(outcome: EngineReply | EngineFailure) -> None:
    first = settle(item(attempts=1), outcome, POLICY, now=10.0)
    assert first.result is None
    assert first.retry_at is not None
    assert 10.0 + 1.5 <= first.retry_at <= 10.0 + 2.5
    last = settle(item(attempts=3), outcome, POLICY, now=10.0)
    assert last.result is not None
    assert not last.result.ok


def test_an_exhausted_connection_failure_has_an_error_code() -> None:
    last = settle(item(attempts=3), EngineFailure("refused"), POLICY, now=0.0)
    assert last.result is not None
    line = json.loads(last.result.line)
    assert line["response"] is None
    assert line["error"]["code"] == "engine_unavailable"


def test_a_client_error_is_final_at_once_with_the_engines_answer() -> None:
    settled = settle(item(), reply(400, {"error": {"message": "bad"}}), POLICY, now=0.0)
    assert settled.result is not None
    line = json.loads(settled.result.line)
    assert line["response"]["status_code"] == 400
    assert line["response"]["body"] == {"error": {"message": "bad"}}


def test_a_2xx_without_json_is_retried_then_reported() -> None:
    broken = EngineReply(200, b"<html>", "r")
    assert settle(item(), broken, POLICY, now=0.0).retry_at is not None
    last = settle(item(attempts=3), broken, POLICY, now=0.0)
    assert last.result is not None
    assert json.loads(last.result.line)["error"]["code"] == "invalid_engine_response"


def test_a_reply_nested_too_deep_to_parse_is_reported_not_raised() -> None:
    """Raising would leave the item leased and unsettled, to run again on every lease expiry."""
    deep = EngineReply(200, b"[" * 100_000 + b"]" * 100_000, "r")
    assert settle(item(), deep, POLICY, now=0.0).retry_at is not None
    last = settle(item(attempts=3), deep, POLICY, now=0.0)
    assert last.result is not None
    assert json.loads(last.result.line)["error"]["code"] == "invalid_engine_response"


def test_retry_after_from_the_engine_is_honoured() -> None:
    settled = settle(item(), reply(429, {}, retry_after=25.0), POLICY, now=100.0)
    assert settled.retry_at == 125.0
