"""SageServe's NIW release rule (section 6.2): queued non-interactive work runs on spare capacity.

The rule is shared by the batch dispatcher and the simulator, so both release exactly the same
amount of work for the same utilisation signal and promote the same items. It is pure: the caller
passes the signal, the item's age and its completion window; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

REFERENCE_WINDOW_S = 24 * 3600.0
"""The completion window `promote_after_s` is stated for: SageServe's default NIW deadline
(24 h) and the only window OpenAI's Batch API accepts."""


def promotion_age_s(window_s: float, promote_after_s: float, reference_window_s: float) -> float:
    """The one promotion rule (`ReleaseRule.promotion_age_s` explains it): the rule, the batch
    stores' claim (`batch.store.base.Promotion`) and the simulator all call this, so an item is
    claimed as promoted exactly when it is sent at interactive priority."""
    if math.isfinite(window_s) and window_s < reference_window_s:
        return promote_after_s * max(0.0, window_s) / reference_window_s
    return promote_after_s


class ReleaseRuleError(ValueError):
    """The release thresholds are not ordered or out of range."""


@dataclass(frozen=True, slots=True)
class ReleaseRule:
    """Thresholds of the release rule.

    Below `one_below` utilisation one queued item is released per signal, below `two_below` two
    (SageServe: 0.60 and 0.50). Items are promoted to interactive priority when their deadline
    approaches, so a permanently busy region still finishes batch work in time; see
    `promotion_age_s` for when exactly.
    """

    one_below: float = 0.60
    two_below: float = 0.50
    promote_after_s: float = 10 * 3600.0
    """Promotion age of an item with a `reference_window_s` (or longer) completion window."""
    reference_window_s: float = REFERENCE_WINDOW_S

    def __post_init__(self) -> None:
        if not 0.0 <= self.two_below <= self.one_below <= 1.0:
            raise ReleaseRuleError(
                f"need 0 <= two_below ({self.two_below}) <= one_below ({self.one_below}) <= 1"
            )
        if self.promote_after_s <= 0:
            raise ReleaseRuleError(f"promote_after_s must be > 0, got {self.promote_after_s}")
        if not 0 < self.reference_window_s < math.inf:
            raise ReleaseRuleError(
                f"reference_window_s must be > 0 and finite, got {self.reference_window_s}"
            )

    def release_count(self, utilisation: float | None) -> int:
        """How many queued NIW items to release on this signal (0, 1 or 2).

        A missing, non-finite or negative signal releases nothing (as the scaler's
        `ScalingSignal.usable_utilisation` treats it: NaN and infinities come from empty PromQL
        averages and broken exporters, and no real fraction is negative). With no evidence of
        spare capacity the safe choice is to hold work back: it is durable and is promoted when
        its deadline approaches.
        """
        if utilisation is None or not math.isfinite(utilisation) or utilisation < 0:
            return 0
        if utilisation < self.two_below:
            return 2
        if utilisation < self.one_below:
            return 1
        return 0

    def promotion_age_s(self, window_s: float = math.inf) -> float:
        """Age at which an item with a `window_s` completion window is promoted:
        `min(promote_after_s, promote_after_s * window_s / reference_window_s)`.

        SageServe promotes NIW work "when the SLA deadline is approaching", and states it for its
        default 24 h deadline as "older than 10 h". Read as a fraction of the window
        (10/24 used, 14/24 left at interactive priority), that keeps every 24 h item exactly
        where it was and gives a short window the same share of its time at interactive
        priority: a 2 h batch is promoted after 50 min with 70 min to go, instead of never
        (at 10 h of age it would already have expired). Windows longer than the reference keep
        the age bound, so an item never waits longer than it does today before promotion; it
        also keeps "every item older than `promote_after_s` is promoted" true for every window
        (the stores' fallback for batches they have not indexed). A window that is not a
        positive finite number (no deadline) gets the age bound.
        """
        return promotion_age_s(window_s, self.promote_after_s, self.reference_window_s)

    def promoted(self, age_s: float, window_s: float = math.inf) -> bool:
        """Whether an item queued for `age_s` seconds, with a `window_s` completion window
        (deadline minus creation; infinite when it has none), now runs at interactive priority."""
        return age_s >= self.promotion_age_s(window_s)


DEFAULT_RELEASE_RULE = ReleaseRule()
