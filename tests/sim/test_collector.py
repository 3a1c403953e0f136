"""A run tunes the cyclic collector for itself and leaves the process as it found it."""

from __future__ import annotations

import gc

from fleetwarden.sim import cluster


def _failing_run() -> None:
    with cluster._collector_tuned():
        assert gc.get_threshold()[0] == cluster.YOUNG_COLLECTION_THRESHOLD
        assert gc.get_freeze_count() > 0  # what existed is left out of collections
        raise RuntimeError("a run that fails")


def test_the_collector_is_tuned_during_a_run_and_restored_after_even_on_error() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    try:
        _failing_run()
    except RuntimeError:
        pass
    else:  # pragma: no cover - the run above always raises
        raise AssertionError("the run should have failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
