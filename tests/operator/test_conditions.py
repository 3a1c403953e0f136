"""Conditions follow metav1.Condition: transition time moves only when status does."""

from __future__ import annotations

from fleetwarden.operator.conditions import ConditionUpdate, merge_conditions, transitions


def test_transition_time_kept_while_status_unchanged() -> None:
    first = merge_conditions(
        [], [ConditionUpdate("Ready", False, "PodsNotReady", "0/1")], now="t1", generation=1
    )
    second = merge_conditions(
        first, [ConditionUpdate("Ready", False, "PodsNotReady", "0/2")], now="t2", generation=2
    )
    assert second[0]["lastTransitionTime"] == "t1"
    assert second[0]["message"] == "0/2"
    assert second[0]["observedGeneration"] == 2
    third = merge_conditions(
        second, [ConditionUpdate("Ready", True, "Reconciled", "")], now="t3", generation=2
    )
    assert third[0]["lastTransitionTime"] == "t3"
    assert third[0]["status"] == "True"


def test_conditions_are_keyed_by_type_sorted_and_capped() -> None:
    updates = [ConditionUpdate(f"T{i:02d}", True, "R", "") for i in range(30)]
    merged = merge_conditions([], updates, now="t", generation=None)
    assert len(merged) == 16
    assert [c["type"] for c in merged] == sorted(c["type"] for c in merged)
    assert "observedGeneration" not in merged[0]


def test_transitions_report_status_or_reason_changes_only() -> None:
    current = merge_conditions(
        [], [ConditionUpdate("Degraded", True, "PoolNotFound", "x")], now="t", generation=1
    )
    assert transitions(current, [ConditionUpdate("Degraded", True, "PoolNotFound", "y")]) == []
    assert len(transitions(current, [ConditionUpdate("Degraded", True, "PoolInvalid", "y")])) == 1
    assert len(transitions(current, [ConditionUpdate("Degraded", False, "AsExpected", "")])) == 1
