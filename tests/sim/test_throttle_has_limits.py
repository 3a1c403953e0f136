"""`has_limits` decides whether a simulated pod gets a limiter at all: it must see every limit.

It tested `rpm or tpm`, so a limit of 0 (refused by validation, but a config can still be built
without it, as `model_copy(update=...)` does) counted as no limit, and the cluster skipped a
limiter that refuses every request. Set means not None, as everywhere else limits are read.
"""

from __future__ import annotations

import pytest

from fleetwarden.fairness.config import ApplicationConfig, FairnessConfig
from fleetwarden.fairness.render import standalone_config
from fleetwarden.fairness.request import Request
from fleetwarden.sim.throttle import PodThrottle, has_limits


class IdlePod:
    def utilisation(self, t: float) -> float:
        return 0.0

    def backlogged(self) -> bool:
        return False


def with_limit(where: str, field: str, value: int) -> FairnessConfig:
    """The standalone config with one limit set, unvalidated (model_copy does not validate)."""
    base = standalone_config("m")
    if where == "defaults":
        return base.model_copy(update={"defaults": base.defaults.model_copy(update={field: value})})
    if where == "tenants":
        tenant = base.defaults.model_copy(update={field: value})
        return base.model_copy(update={"tenants": {"alice": tenant}})
    app = ApplicationConfig().model_copy(update={field: value})
    return base.model_copy(update={"applications": {"bot": app}})


def test_no_limit_is_no_limiter() -> None:
    assert not has_limits(standalone_config("m"))


@pytest.mark.parametrize("where", ["defaults", "tenants", "applications"])
@pytest.mark.parametrize("field", ["rpm", "tpm"])
@pytest.mark.parametrize("value", [0, 1])
def test_every_set_limit_counts_even_zero(where: str, field: str, value: int) -> None:
    config = with_limit(where, field, value)
    assert has_limits(config)


@pytest.mark.parametrize("where", ["defaults", "tenants", "applications"])
def test_a_zero_limit_that_refuses_is_seen(where: str) -> None:
    """The limiter has something to enforce exactly when `has_limits` says so."""
    config = with_limit(where, "rpm", 0)
    request = Request(
        seq=0, tenant="alice", arrival_s=0.0, input_tokens=10, max_output_tokens=10, app="bot"
    )
    assert PodThrottle(config).refuse(request, 0.0, IdlePod())
    assert has_limits(config)
