"""The sidecar benches' verdict on the added-TTFT p99 target (`bench.sidecar_overhead`).

The verdict is a pure function of the two paths' summaries, so it is tested on summaries: the
numbers of two real runs of `bench/sidecar_native.py` on this VM (session 10), one noisy, one
quiet, plus edge cases. It must never report the target met because the direct path was slower.
"""

from __future__ import annotations

from typing import Any

from bench.sidecar_overhead import added, added_latency_verdict


def summary(ttft: tuple[float, float], ttfb: tuple[float, float]) -> dict[str, Any]:
    """A path's latency summary as the benches build it: (p50, p99) per distribution, in ms."""
    return {
        "ttft_ms": {"mean": ttft[0], "p50": ttft[0], "p99": ttft[1], "n": 4000},
        "ttfb_ms": {"mean": ttfb[0], "p50": ttfb[0], "p99": ttfb[1], "n": 4000},
    }


def verdict(direct: dict[str, Any], via: dict[str, Any]) -> dict[str, Any]:
    return added_latency_verdict(
        direct, added(via, direct, "ttft_ms"), added(via, direct, "ttfb_ms"), 1.0
    )


def test_a_noisy_direct_path_is_inconclusive_not_met() -> None:
    """Direct TTFB p99 96 ms: the sidecar path came out 37 ms faster at p99, which is noise."""
    direct = summary((21.722, 118.385), (0.645, 96.278))
    via = summary((23.776, 81.548), (4.563, 59.693))
    result = verdict(direct, via)
    assert result["met"] is None
    assert "inconclusive" in result["why"]
    assert "96.278" in result["why"]
    assert result["value_ms"] < 0


def test_a_quiet_run_with_a_sidecar_ttfb_tail_is_not_met() -> None:
    """Added TTFT p99 0.23 ms, but the sidecar's TTFB p99 is 4.9 ms against 0.38 direct."""
    direct = summary((20.095, 24.561), (0.032, 0.377))
    via = summary((20.763, 24.794), (0.909, 4.904))
    result = verdict(direct, via)
    assert result["met"] is False
    assert result["value_ms"] == 0.233
    assert result["added_ttfb_p99_ms"] == 4.527
    assert result["direct_ttfb_p99_ms"] == 0.377


def test_a_quiet_run_under_the_target_is_met() -> None:
    direct = summary((20.1, 20.6), (0.03, 0.30))
    via = summary((20.5, 21.3), (0.40, 0.95))
    assert verdict(direct, via)["met"] is True


def test_a_path_without_requests_cannot_be_judged() -> None:
    direct = summary((20.1, 20.6), (0.03, 0.30))
    via: dict[str, Any] = {"ttft_ms": {"n": 0}, "ttfb_ms": {"n": 0}}
    result = verdict(direct, via)
    assert result["met"] is None
    assert "no requests" in result["why"]
