"""The simulator's hourly planner on the production forecaster and ILP (DESIGN section 3).

`ForecastPlanner` plugs the same pure round the operator runs (`forecasting.hourly.plan_round`)
into the simulator's `HourlyPlanner` hook: the simulated Prometheus series of every endpoint go in,
targets per endpoint come out. So a simulation answers "what would the operator have planned",
including the fallbacks (seasonal naive on short history, hold on no data) and the pool capacity
the models share.

The fleet is read from the simulator's `Fleet` (the YAML users apply, validated by the API
models), so the specs the round sees are the ones the operator would see. Each endpoint's
forecast load is its share of its region's planned peak, because the simulator's LT-UA compares
it with the load observed at that endpoint.

Unlike the operator, the planner fits ARIMA fresh only every `refit_every_s` of simulated time
(default one day) per (model, region) and reuses the parameters on the new observations in the
hours between (`forecasting.warm`): a fresh fit costs about a second per (model, region), which
made a week's simulation spend nearly all its time fitting. It refits sooner when the kept
parameters fit the new hours much worse than their own, and re-optimises their order when their
one-step predictions of the last 6 hours were all off one way (a level change such as the first
weekend day); a fit made either way is kept 6 hours, not a day. Its first round is exactly the
operator's; later rounds differ by the parameter drift of at most a day (on a 7-day fluid run,
within 2.9% of fresh fits, 0.4% on average; tests/forecasting/test_warm_refit.py bounds it).
`refit_every_s = 0` fits fresh every hour, as the operator does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetwarden.forecasting.forecast import DEFAULT_CONFIG, ForecastConfig
from fleetwarden.forecasting.hourly import (
    EndpointHistory,
    FleetSpecs,
    RoundInput,
    RoundResult,
    plan_round,
)
from fleetwarden.forecasting.planner import PlannerConfig
from fleetwarden.forecasting.series import DAY_S
from fleetwarden.forecasting.warm import WarmForecaster
from fleetwarden.sim.fleet_spec import Fleet
from fleetwarden.sim.planning import EndpointKey, LoadHistory, PlanEntry


def fleet_specs(fleet: Fleet) -> FleetSpecs:
    """The simulator's fleet as the API specs the round takes."""
    return FleetSpecs(
        pools={name: pool.spec for name, pool in fleet.pools.items()},
        model_deployments={key: model.spec for key, model in fleet.models.items()},
    )


@dataclass
class ForecastPlanner:
    """`HourlyPlanner` that forecasts (ARIMA, with fallbacks) and solves the SageServe ILP."""

    forecast_base: ForecastConfig = DEFAULT_CONFIG
    planner_config: PlannerConfig | None = None
    refit_every_s: float = DAY_S
    """Simulated seconds between fresh ARIMA fits of a (model, region); 0 fits every round."""
    last: RoundResult | None = field(default=None, init=False)
    """The last round's full result, for reports and tests."""
    warm: WarmForecaster = field(init=False, repr=False)
    """The fits cached across rounds (its `fits`/`reuses` counters say how often each ran)."""

    def __post_init__(self) -> None:
        self.warm = WarmForecaster(refit_every_s=self.refit_every_s)

    def plan(
        self,
        now_s: float,
        fleet: Fleet,
        history: Mapping[EndpointKey, LoadHistory],
        current: Mapping[EndpointKey, int],
    ) -> Mapping[EndpointKey, PlanEntry]:
        inputs = RoundInput(
            fleet=fleet_specs(fleet),
            history={
                key: EndpointHistory(load.iw_tps, load.niw_tps) for key, load in history.items()
            },
            current=current,
            now_s=now_s,
        )
        result = plan_round(
            inputs,
            forecast_base=self.forecast_base,
            planner_config=self.planner_config,
            warm=self.warm,
        )
        self.last = result
        return {
            key: PlanEntry(target=e.target, forecast_tps=e.forecast_peak_tps)
            for key, e in result.endpoints.items()
        }
