"""A tier header claims at most iw-n (or the tenant's configured tier, if higher), and a deadline
header is never earlier than the tier's target: iw-f is the configuration's to give, while iw-n
stays open because the batch service promotes a niw tenant's late items with it."""

from __future__ import annotations

import pytest

from fleetwarden.api.enums import Tier
from fleetwarden.sidecar.identity import scheduling_deadline_ms, scheduling_tier


@pytest.mark.parametrize(
    ("requested", "configured", "expected"),
    [
        (None, Tier.IW_NORMAL, Tier.IW_NORMAL),
        (Tier.IW_FAST, Tier.IW_NORMAL, Tier.IW_NORMAL),  # raising: ignored
        (Tier.IW_FAST, Tier.NIW, Tier.NIW),
        (Tier.IW_NORMAL, Tier.NIW, Tier.IW_NORMAL),  # the batch service's promotion: kept
        (Tier.NIW, Tier.NIW, Tier.NIW),
        (Tier.NIW, Tier.IW_NORMAL, Tier.NIW),  # lowering (the batch service): kept
        (Tier.IW_NORMAL, Tier.IW_FAST, Tier.IW_NORMAL),
        (Tier.IW_FAST, Tier.IW_FAST, Tier.IW_FAST),
    ],
)
def test_a_tier_header_only_lowers(
    requested: Tier | None, configured: Tier, expected: Tier
) -> None:
    assert scheduling_tier(requested, configured) is expected


def test_a_deadline_header_is_never_earlier_than_the_tier_target() -> None:
    assert scheduling_deadline_ms(1.0, 2.0) == 2000.0
    assert scheduling_deadline_ms(5000.0, 2.0) == 5000.0
    assert scheduling_deadline_ms(None, 2.0) == 2000.0
    assert scheduling_deadline_ms(1.0, None) is None  # no target (niw): no deadline
