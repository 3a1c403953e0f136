"""One endpoint of the simulated fleet: a ModelDeployment's instances in one RegionPool, with its
scaler, its plan and its instance accounting.

Lifecycle, as the operator and Kubernetes would have it:

- +1 launches an instance that holds its GPUs at once and serves only after the pool's
  `modelLoadSeconds` (SageServe: about 10 minutes), as the operator's new pods do; only with the
  opt-in SageServe spot donation (`fleetwarden.sim.spot_donation`, not implemented by the
  operator) is an instance of this model donated earlier reclaimed instead, after
  `spot_reclaim_s` (1 minute);
- each instance runs its own policy (`build_policy` of the rendered TenantPolicy), with its own
  per-tenant output-length average when the policy asks for one, fed by its completions as the
  sidecar feeds it;
- -1 cancels the newest instance still loading if there is one (as a ReplicaSet removes unready
  pods first), else drains the least-loaded ready instance: it takes no new requests and stops
  once its running and queued requests are done; with spot donation on (and spot allowed by both
  the pool and the ModelDeployment's `niw.spot`) it is then donated, up to `donation_cap`.

A launch needs room in the pool: every instance (loading, ready or draining) of every model on
the pool counts against `capacity.gpus` and `capacity.instances`. Donated instances run on the
pool's spot nodes and do not.
"""

from __future__ import annotations

from fleetwarden.api.enums import LengthPrediction
from fleetwarden.fairness.factory import build_policy
from fleetwarden.fairness.prediction import MovingAverage
from fleetwarden.scaling import Scaler
from fleetwarden.sim.engine import EngineProfile
from fleetwarden.sim.fleet_spec import Model, Placement, Pool
from fleetwarden.sim.instance import Host, Instance, State
from fleetwarden.sim.planning import EndpointKey
from fleetwarden.sim.results import EndpointStats

HOUR_S = 3600.0


class Endpoint:
    """Instances of one model in one pool (see the module docstring)."""

    def __init__(
        self,
        model: Model,
        placement: Placement,
        pool: Pool,
        profile: EngineProfile,
        scaler: Scaler | None,
        *,
        dynamic_head: bool,
        charges_matter: bool,
        donation_cap: int = 0,
    ) -> None:
        self.key: EndpointKey = (model.key, placement.pool)
        self.model = model
        self.placement = placement
        self.pool = pool
        self.profile = profile
        self.scaler = scaler
        self.dynamic_head = dynamic_head
        self.charges_matter = charges_matter
        self.instances: list[Instance] = []
        """Every instance not yet stopped, in launch order."""
        self.serving: list[Instance] = []
        """The ready instances (the ones requests are routed to), in launch order."""
        self.target = placement.min_instances
        self.forecast_tps: float | None = None
        self.donation_cap = donation_cap
        """Most instances donated to spot at once (`spot_donation.donation_cap`; 0: never)."""
        self.donated = 0
        self._donated_since = 0.0
        self.stats = EndpointStats(model.key, placement.pool, placement.region, placement.gpu_type)

    # -- views -----------------------------------------------------------------------------------

    def ready(self) -> list[Instance]:
        return self.serving

    def started(self, instance: Instance, now: float) -> None:
        """A loading instance is ready: it serves from `now`."""
        instance.start(now)
        self.serving.append(instance)

    def current(self) -> int:
        """Instances the operator asks for: loading and ready (draining ones are leaving)."""
        return sum(1 for i in self.instances if i.state in (State.LOADING, State.READY))

    def utilisation(self, now: float) -> float | None:
        """Mean KV-cache usage of the ready instances (None without any)."""
        ready = self.ready()
        if not ready:
            return None
        return sum(i.utilisation(now) for i in ready) / len(ready)

    # -- lifecycle -------------------------------------------------------------------------------

    def launch(
        self, iid: int, host: Host, now: float, *, warm: bool = False, spot_reclaim_s: float = 60.0
    ) -> Instance:
        """A new instance; `warm` ones serve at once (the fleet's state at time 0)."""
        reclaimed = not warm and self.donated > 0
        if reclaimed:
            self._account_donated(now)
            self.donated -= 1
            self.stats.reclaims += 1
        load_s = 0.0 if warm else (spot_reclaim_s if reclaimed else self.placement.model_load_s)
        config = self.model.fairness
        predictor = (
            MovingAverage() if config.length_prediction is LengthPrediction.MOVING_AVERAGE else None
        )
        instance = Instance(
            iid,
            self.key,
            self.profile,
            build_policy(config, predictor=predictor),
            host,
            launched_s=now,
            ready_s=now + load_s,
            gpus=self.placement.gpus_per_instance,
            dynamic_head=self.dynamic_head,
            charges_matter=self.charges_matter,
            reclaimed=reclaimed,
            predictor=predictor,
        )
        self.instances.append(instance)
        if warm:
            self.serving.append(instance)
        else:
            self.stats.launches += 1
        return instance

    def remove_one(self, now: float) -> Instance | None:
        """Scale in by one (module docstring); returns the instance affected."""
        loading = [i for i in self.instances if i.state is State.LOADING]
        if loading:
            victim = loading[-1]
            victim.cancel(now)
            self.stopped(victim, now)
            return victim
        ready = self.ready()
        if not ready:
            return None
        victim = min(ready, key=lambda i: (i.load_tokens(), i.iid))
        self.serving.remove(victim)
        victim.drain(now)
        return victim

    def stopped(self, instance: Instance, now: float) -> None:
        """Account for a stopped instance and, with spot donation, donate it if allowed."""
        if instance in self.instances:
            self.instances.remove(instance)
        if instance in self.serving:
            self.serving.remove(instance)
        self._account(instance, now)
        served = instance.ready_s < now
        if served and self.donated < self.donation_cap:
            self._account_donated(now)
            self.donated += 1

    def _account(self, instance: Instance, end: float) -> None:
        hours = max(0.0, end - instance.launched_s) / HOUR_S
        loading_h = max(0.0, min(instance.ready_s, end) - instance.launched_s) / HOUR_S
        gpus = instance.gpus
        stats = self.stats
        stats.instance_hours += hours
        stats.gpu_hours += hours * gpus
        stats.cost += hours * gpus * self.placement.cost_per_gpu_hour
        stats.cold_start_gpu_hours += loading_h * gpus

    def _account_donated(self, now: float) -> None:
        self.stats.donated_instance_hours += self.donated * (now - self._donated_since) / HOUR_S
        self._donated_since = now

    def close(self, end: float) -> None:
        """The run ends: account for every instance still alive and for donations."""
        for instance in self.instances:
            self._account(instance, end)
        self._account_donated(end)

    def pool_usage(self) -> tuple[int, int]:
        """(instances, GPUs) this endpoint holds on its pool."""
        count = len(self.instances)
        return count, count * self.placement.gpus_per_instance


def pool_has_room(pool: Pool, endpoints: list[Endpoint], gpus: int) -> bool:
    """Whether one more instance of `gpus` GPUs fits the pool's capacity."""
    instances = sum(e.pool_usage()[0] for e in endpoints)
    used = sum(e.pool_usage()[1] for e in endpoints)
    capacity = pool.spec.capacity
    if capacity.instances is not None and instances + 1 > capacity.instances:
        return False
    return capacity.gpus is None or used + gpus <= capacity.gpus
