"""Reconcile one TenantPolicy's status: which ModelDeployments it configures, and its version.

The rendered configs themselves are written by the ModelDeployment reconciler (one ConfigMap per
region), because a ModelDeployment's config depends on its own tiers and gate as well; after a
TenantPolicy changes, the handler re-reconciles the ModelDeployments of its namespace.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fleetwarden.operator import conditions
from fleetwarden.operator.conditions import ConditionUpdate
from fleetwarden.operator.fairness_render import choose_policy
from fleetwarden.operator.fleet import FleetView, ObjectRecord, parse_tenant_policy
from fleetwarden.operator.kube import TENANT_POLICIES
from fleetwarden.operator.reconcilers.context import Context, invalid_spec, write_status

JsonDict = dict[str, Any]


def policy_version(spec: JsonDict) -> str:
    """Content hash of the policy's spec: the same spec has the same version everywhere."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _selection(view: FleetView, record: ObjectRecord) -> tuple[list[str], list[str]]:
    """(ModelDeployments this policy configures, ModelDeployments where an older policy wins).

    The policy's own selector is checked first and the winner resolved (every policy of the
    namespace matched, `choose_policy`) only for the ModelDeployments it selects: resolving it
    for every ModelDeployment of the namespace made one reconcile cost (ModelDeployments x
    policies) selector matches, 0.9 s at 2,000 x 200, and every policy of the namespace ran one.
    The policy judged is the view's copy under `record.key` (the one `policy_refs` reads); a
    policy the view does not hold selects nothing, as before.
    """
    own = view.tenant_policies.get(record.key)
    if own is None:
        return [], []
    parsed = parse_tenant_policy(own)
    applied, lost = [], []
    for md in view.model_deployments_in(record.namespace):
        if parsed.spec is not None:
            if not parsed.spec.selector.matches(dict(md.labels)):
                continue
            refs = view.policy_refs(md.namespace, md.labels)
        else:  # an invalid policy selects by its raw selector: let `policy_refs` judge it
            refs = view.policy_refs(md.namespace, md.labels)
            mine = next((r for r in refs if r.name == record.name), None)
            if mine is None or not mine.labels_selected:
                continue
        choice = choose_policy(refs)
        if choice.winner is not None and choice.winner.name == record.name:
            applied.append(md.name)
        else:
            lost.append(md.name)
    return applied, lost


async def reconcile_tenant_policy(ctx: Context, view: FleetView, key: str) -> None:
    """Write which ModelDeployments TenantPolicy `key` configures, with Ready/Degraded."""
    record = view.tenant_policies.get(key)
    if record is None:
        return
    parsed = parse_tenant_policy(record)
    status: JsonDict = {}
    if parsed.spec is None:
        updates = invalid_spec(parsed.error or "invalid spec")
    else:
        applied, lost = _selection(view, record)
        # Ready serving pods of the configured ModelDeployments, and how many of them confirmed
        # the config version the operator wants (live from the pusher, not from old status).
        pod_counts = [ctx.pusher.counts(f"{record.namespace}/{name}") for name in applied]
        status.update(
            {
                "configVersion": policy_version(record.spec),
                "modelDeployments": applied,
                "podsAcknowledged": sum(counts[0] for counts in pod_counts),
                "podsTotal": sum(counts[1] for counts in pod_counts),
            }
        )
        if lost:
            degraded = ConditionUpdate(
                conditions.DEGRADED,
                True,
                conditions.POLICY_CONFLICT,
                f"an older TenantPolicy already configures {', '.join(lost)}",
            )
        else:
            degraded = ConditionUpdate(conditions.DEGRADED, False, conditions.AS_EXPECTED, "")
        if applied:
            ready = ConditionUpdate(
                conditions.READY,
                True,
                conditions.RECONCILED,
                f"configures {len(applied)} ModelDeployment(s)",
            )
        else:
            ready = ConditionUpdate(
                conditions.READY,
                False,
                conditions.NO_MATCHES,
                "the selector matches no ModelDeployment in this namespace",
            )
        updates = [ready, degraded]
    await write_status(ctx, TENANT_POLICIES, record, status, updates)
