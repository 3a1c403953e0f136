"""One scaler tick of an endpoint, shared by the request-level and the fluid simulation.

Both fidelities must take the same scaling decisions from the same facts, or comparing them says
nothing: the signal is built the same way, `Scaler.decide` is called the same way, a +1 launches
only when the pool has room (else it is counted as blocked), a -1 removes one instance as
`Endpoint.remove_one` says, and every change is logged in the same event format. The fidelities
differ only in how they measure utilisation and launch an instance, which they pass in.

And both must decide as the operator does (DESIGN section 3, "one brain, two bodies"): a tick
is one metrics poll (`METRICS_POLL_INTERVAL_S`, 15 s) and the cooldown stays inside the scaler;
the reading's observation time goes with it (`observed_s`), so one reading moves a region at
most once; the scaler is built as `operator/autoscaler.py` builds it, `leave_zero_toward_target`
included (a region at 0 instances has no reading, and only the plan can bring it back); and the
period is the plan's (the fleet's shortest `horizonSeconds`, `plan_period`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.scaling import Scaler, ScalingConfig, ScalingSignal, make_scaler
from fleetwarden.scaling.config import METRICS_POLL_INTERVAL_S
from fleetwarden.sim.endpoint import Endpoint, pool_has_room
from fleetwarden.sim.fleet_profiles import derive_profile
from fleetwarden.sim.fleet_spec import Model, Placement, Pool
from fleetwarden.sim.instance import Instance, State
from fleetwarden.sim.spot_donation import donation_cap

if TYPE_CHECKING:
    from fleetwarden.sim.cluster import SimOptions


def scaling_tick(
    endpoint: Endpoint,
    t: float,
    utilisation: float | None,
    observed_load_tps: float | None,
    pool_endpoints: list[Endpoint],
    launch: Callable[[Endpoint, float], Instance],
    events: list[list[Any]],
    observed_s: float | None = None,
) -> float:
    """Decide and apply one step for `endpoint` at `t`; returns the seconds to the next tick
    (the next metrics poll). `pool_endpoints` are every endpoint on the endpoint's pool;
    `observed_s` is when `utilisation` and `observed_load_tps` were read (None: at `t`)."""
    scaler = endpoint.scaler
    assert scaler is not None
    decision = scaler.decide(
        ScalingSignal(
            now_s=t,
            current=endpoint.current(),
            target=endpoint.target,
            utilisation=utilisation,
            observed_load_tps=observed_load_tps,
            forecast_load_tps=endpoint.forecast_tps,
            starting=sum(1 for i in endpoint.instances if i.state is State.LOADING),
        ),
        observed_s=t if observed_s is None else observed_s,
    )
    name = f"{endpoint.key[0]}/{endpoint.key[1]}"
    if decision.step > 0:
        if pool_has_room(endpoint.pool, pool_endpoints, endpoint.placement.gpus_per_instance):
            instance = launch(endpoint, t)
            endpoint.stats.scale_out += 1
            events.append([t, name, 1, decision.reason.value, instance.iid, instance.ready_s])
        else:
            endpoint.stats.blocked_scale_out += 1
    elif decision.step < 0:
        victim = endpoint.remove_one(t)
        if victim is not None:
            endpoint.stats.scale_in += 1
            events.append([t, name, -1, decision.reason.value, victim.iid, None])
    return METRICS_POLL_INTERVAL_S


def endpoint_scaler(
    model: Model, placement: Placement, strategy: ScalingStrategy, period_s: float
) -> Scaler:
    """The scaler of one endpoint, built from the ModelDeployment's settings as the operator
    builds it (`ScalingConfig.from_settings` within the placement's bounds, the plan's period,
    and `leave_zero_toward_target`: no instance, no reading, so only the plan can call for one)."""
    config = ScalingConfig.from_settings(
        model.spec.scaling,
        min_instances=placement.min_instances,
        max_instances=placement.max_instances,
        period_s=period_s,
        leave_zero_toward_target=True,
    )
    return make_scaler(strategy, config)


def build_endpoint(
    model: Model,
    placement: Placement,
    pool: Pool,
    options: SimOptions,
    *,
    dynamic_head: bool,
    charges_matter: bool,
) -> Endpoint:
    """One endpoint as both fidelities build it: the options' profile for it or one derived from
    the ModelDeployment (`fleet_profiles`), its scaler unless scaling is off, and how many
    instances it may donate to spot (0 unless the SageServe option `spot_donation` is on)."""
    profile = (options.profiles or {}).get((model.key, placement.pool)) or derive_profile(
        model,
        placement,
        kv_budget_tokens=options.kv_budget_tokens,
        theta_load=options.theta_load,
    )
    scaler = None
    if options.scaling:
        strategy = options.strategy or model.spec.scaling.strategy
        scaler = endpoint_scaler(model, placement, strategy, options.period_s)
    return Endpoint(
        model,
        placement,
        pool,
        profile,
        scaler,
        dynamic_head=dynamic_head,
        charges_matter=charges_matter,
        donation_cap=donation_cap(model, placement, enabled=options.spot_donation),
    )
