"""SageServe's NIW release rule (section 6.2): queued non-interactive work runs on spare capacity.

The rule is shared by the batch dispatcher and the simulator, so both release exactly the same
amount of work for the same utilisation signal. It is pure: the caller passes the signal and the
item's age; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass


class ReleaseRuleError(ValueError):
    """The release thresholds are not ordered or out of range."""


@dataclass(frozen=True, slots=True)
class ReleaseRule:
    """Thresholds of the release rule.

    Below `one_below` utilisation one queued item is released per signal, below `two_below` two
    (SageServe: 0.60 and 0.50). Items queued longer than `promote_after_s` (10 hours) are promoted
    to interactive priority so a permanently busy region still finishes batch work in time.
    """

    one_below: float = 0.60
    two_below: float = 0.50
    promote_after_s: float = 10 * 3600.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.two_below <= self.one_below <= 1.0:
            raise ReleaseRuleError(
                f"need 0 <= two_below ({self.two_below}) <= one_below ({self.one_below}) <= 1"
            )
        if self.promote_after_s <= 0:
            raise ReleaseRuleError(f"promote_after_s must be > 0, got {self.promote_after_s}")

    def release_count(self, utilisation: float | None) -> int:
        """How many queued NIW items to release on this signal (0, 1 or 2).

        A missing or non-finite signal releases nothing: with no evidence of spare capacity the
        safe choice is to hold work back (it is durable and will be promoted if it waits too long).
        """
        if utilisation is None or utilisation != utilisation:  # None or NaN
            return 0
        if utilisation < self.two_below:
            return 2
        if utilisation < self.one_below:
            return 1
        return 0

    def promoted(self, age_s: float) -> bool:
        """Whether an item queued for `age_s` seconds now runs at interactive priority."""
        return age_s >= self.promote_after_s


DEFAULT_RELEASE_RULE = ReleaseRule()
