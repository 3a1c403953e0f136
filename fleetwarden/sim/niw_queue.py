"""The simulated NIW queue manager, as `fleetwarden batch` runs it (SageServe section 6.2).

NIW items wait centrally, one queue per (model, region), earliest deadline first. Every
`signal_interval_s` while a queue holds items, the region's endpoints report their utilisation
and `ReleaseRule` says how many items go: items past the rule's promotion age for their
completion window (`ReleaseRule.promotion_age_s`) first, at
interactive-normal priority (so a permanently busy region still meets deadlines), then 0, 1 or 2
by deadline at NIW priority; never more than `max_in_flight` at once. This is the batch
dispatcher's `release_plan` for a shared target, which the simulator may not import (shells
never import each other), restated here; both call the same `ReleaseRule`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from fleetwarden.scaling.niw_release import ReleaseRule
from fleetwarden.sim.instance import Job


@dataclass
class NiwQueue:
    """One (model, region) queue of NIW jobs."""

    rule: ReleaseRule
    max_in_flight: int = 32
    in_flight: int = 0
    signalling: bool = False
    """Whether a signal is scheduled (signals run only while items wait)."""
    _heap: list[tuple[float, int, Job]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, job: Job) -> None:
        deadline = job.niw_deadline_s if job.niw_deadline_s is not None else float("inf")
        heapq.heappush(self._heap, (deadline, job.request.seq, job))

    def release(self, now: float, utilisation: float | None) -> list[tuple[Job, bool]]:
        """Jobs released by one signal, each with whether it is promoted."""
        free = self.max_in_flight - self.in_flight
        released: list[tuple[Job, bool]] = []
        heap = self._heap
        # Promoted items first: with one deadline per model, the earliest deadline is the oldest.
        # The window is the deadline's distance from arrival (the heap's key), as for a batch.
        while (
            heap
            and free > 0
            and self.rule.promoted(now - heap[0][2].arrival_s, heap[0][0] - heap[0][2].arrival_s)
        ):
            released.append((heapq.heappop(heap)[2], True))
            free -= 1
        for _ in range(min(free, self.rule.release_count(utilisation))):
            if not heap:
                break
            released.append((heapq.heappop(heap)[2], False))
        self.in_flight += len(released)
        return released

    def jobs(self) -> list[Job]:
        return [entry[2] for entry in self._heap]
