"""One scaler tick of an endpoint, shared by the request-level and the fluid simulation.

Both fidelities must take the same scaling decisions from the same facts, or comparing them says
nothing: the signal is built the same way, `Scaler.decide` is called the same way, a +1 launches
only when the pool has room (else it is counted as blocked), a -1 removes one instance as
`Endpoint.remove_one` says, and every change is logged in the same event format. The fidelities
differ only in how they measure utilisation and launch an instance, which they pass in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleetwarden.api.enums import ScalingStrategy
from fleetwarden.scaling import Scaler, ScalingConfig, ScalingSignal, make_scaler
from fleetwarden.sim.endpoint import Endpoint, pool_has_room
from fleetwarden.sim.fleet_profiles import derive_profile
from fleetwarden.sim.fleet_spec import Model, Placement, Pool
from fleetwarden.sim.instance import Instance, State

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
) -> float:
    """Decide and apply one step for `endpoint` at `t`; returns the scaler's cooldown (when the
    next tick is due). `pool_endpoints` are every endpoint on the endpoint's pool."""
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
        )
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
    return scaler.config.cooldown_s


def endpoint_scaler(
    model: Model, placement: Placement, strategy: ScalingStrategy, period_s: float
) -> Scaler:
    """The scaler of one endpoint, built from the ModelDeployment's settings as the operator
    builds it (`ScalingConfig.from_settings` within the placement's bounds)."""
    config = ScalingConfig.from_settings(
        model.spec.scaling,
        min_instances=placement.min_instances,
        max_instances=placement.max_instances,
        period_s=period_s,
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
    the ModelDeployment (`fleet_profiles`), and its scaler unless scaling is off."""
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
    )
