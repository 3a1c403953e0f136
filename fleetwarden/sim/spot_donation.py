"""SageServe's spot donation, not implemented by the operator: an opt-in simulator option.

In SageServe (section 6.4) an instance removed on scale-in is handed to the pool's spot capacity
and taken back on a later scale-out, ready in about a minute instead of a full model load. The
operator has no such path: its spot capacity is the NIW spot Deployments sized by the batch
backlog (`niw.spot`), and every scale-out loads the model for the pool's `modelLoadSeconds`. So
the simulator models donation only when asked (`SimOptions.spot_donation`, `fleetwarden
simulate --spot-donation`); off, which is the default, its scale-outs cost what the operator's
do.

When it is on, an endpoint donates only where both sides allow spot work: the pool
(`spec.spot.enabled`, at most `spec.spot.maxInstances`) and the ModelDeployment
(`spec.niw.spot.enabled`, at most `spec.niw.spot.maxInstances`). The caps apply per endpoint
(one ModelDeployment on one pool), as the simulator has always counted donations.
"""

from __future__ import annotations

from fleetwarden.sim.fleet_spec import Model, Placement


def donation_cap(model: Model, placement: Placement, *, enabled: bool) -> int:
    """Most instances of `model` on `placement`'s pool that may wait donated at once (0: the
    endpoint never donates, so it never reclaims either)."""
    if not enabled or not placement.spot_enabled:
        return 0
    spot = model.spec.niw.spot
    if not spot.enabled:
        return 0
    pool_cap = placement.spot_max_instances
    return spot.max_instances if pool_cap is None else min(pool_cap, spot.max_instances)
