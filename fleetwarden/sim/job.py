"""The simulator's record of one request, which is also its entry in the running batch.

A `Job` is made when the request arrives and is the very object the engine runs once the request
is admitted (`FleetEngine.start`): the engine fills in its admission step, order and finish step
instead of building a second object per request, and whoever the engine hands a finished entry
back to gets the job itself, with no tag to follow.
"""

from __future__ import annotations

import math

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.request import Request
from fleetwarden.sim.fleet_engine import FleetRunning


class Job(FleetRunning):
    """One request's journey through the fleet (the simulator's record of it).

    The running-entry fields (`admit_step`, `order`, `finish_step`, `target_output_tokens`,
    `first_token_s`) mean nothing until the engine starts the job. A plain slotted class with a
    positional constructor rather than a dataclass: one is built per request, and a dataclass
    cannot put fields without defaults after the running entry's defaulted ones.
    """

    __slots__ = (
        "arrival_s",
        "dispatch_index",
        "dispatch_s",
        "home",
        "instance",
        "model",
        "niw_deadline_s",
        "pool",
        "spilled",
        "tenant",
        "tier",
        "tokens",
    )

    # `first_token_s` (from the running entry) is NaN, never None, until the engine starts the
    # job, then the end of its prefill. Not re-declared as `float` here: mypyc (setup.py) needs
    # an attribute's type to be the same in every class, so readers narrow it where they read.
    model: str
    home: str
    """Region the request came from."""
    tenant: str
    tier: Tier
    """Tier for the results (a promoted NIW item still counts as NIW)."""
    tokens: int
    """Prompt plus output tokens: the work it brings."""
    arrival_s: float
    niw_deadline_s: float | None
    """Absolute completion deadline of a NIW item."""
    pool: str
    instance: int
    spilled: bool
    dispatch_s: float
    dispatch_index: int
    """Admission order on its instance (the order the policy dispatched it)."""

    def __init__(
        self,
        request: Request,
        model: str,
        home: str,
        tenant: str,
        tier: Tier,
        tokens: int,
        arrival_s: float,
        niw_deadline_s: float | None = None,
    ) -> None:
        # Every slot is set here (not through `FleetRunning.__init__`: one call less per request).
        self.request = request
        self.target_output_tokens = request.max_output_tokens
        self.first_token_s = math.nan
        self.admit_step = 0
        self.order = 0
        self.finish_step = 0
        self.model = model
        self.home = home
        self.tenant = tenant
        self.tier = tier
        self.tokens = tokens
        self.arrival_s = arrival_s
        self.niw_deadline_s = niw_deadline_s
        self.pool = ""
        self.instance = -1
        self.spilled = False
        self.dispatch_s = math.nan
        self.dispatch_index = -1

    @property
    def tag(self) -> Job:
        """A job is its own record (readers of `FleetRunning.tag` get the job)."""
        return self
