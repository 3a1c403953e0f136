"""The built-in workload's tenants come from the fleet's TenantPolicies when they name any, so the
policies' tiers, weights and limits act in a simulation (they named acme, globex, ... while the
workload sent tenant-00..19 with a tier drawn per request); its region note says how each
region's demand was sized."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from textwrap import dedent

import pytest

from fleetwarden.api.enums import ScalingStrategy, Tier
from fleetwarden.cli import main
from fleetwarden.sim.cluster import SimOptions, simulate
from fleetwarden.sim.fleet_spec import Fleet, load_fleet
from fleetwarden.sim.run import instance_sizing
from fleetwarden.sim.workload import SimRequest, zipf_shares
from fleetwarden.sim.workload_builtin import ZIPF_EXPONENT, BuiltinWorkload
from tests.sim.fleet_fixtures import model_yaml, pool_yaml, write_fleet

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PEAK = {"org/m": {"region-a": 4000.0}}


def _policy(tenants: list[str], defaults_tier: str = "iw-n") -> str:
    """A TenantPolicy (no selector: every ModelDeployment of the namespace) naming `tenants`."""
    header = dedent(
        """\
        apiVersion: fleetwarden.dev/v1alpha1
        kind: TenantPolicy
        metadata:
          name: p
          namespace: ns
        spec:
          policy: vtc
          tenants:
        """
    )
    entries = "".join(f"    - {t}\n" for t in tenants)
    return f"{header}{entries}  defaults:\n    tier: {defaults_tier}\n"


VIP_BULK = ["{name: bulk, weight: 1, tier: niw}", "{name: vip, weight: 4, tier: iw-f, rpm: 2}"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return write_fleet(tmp_path_factory.mktemp("f"), pool_yaml(), model_yaml(), _policy(VIP_BULK))


def _requests(fleet: Fleet, **params: object) -> list[SimRequest]:
    spec = BuiltinWorkload(peak_tps=PEAK, start_hour=14.0, **params)  # type: ignore[arg-type]
    return list(spec.build(fleet))


def test_named_tenants_send_with_the_tier_their_policy_gives(fleet: Fleet) -> None:
    requests = _requests(fleet, duration_s=6 * 3600.0)
    interactive = [r for r in requests if r.tier is not Tier.NIW]
    batch = [r for r in requests if r.tier is Tier.NIW]
    # interactive requests carry no tier: the sidecar (and the simulated pod) gives the tenant's
    assert {r.tier for r in interactive} == {None}
    senders = Counter(r.tenant for r in interactive)
    assert "bulk" not in senders  # a niw tenant sends no interactive request
    # ranks: vip (weight 4) first, bulk (weight 1) second, then 18 anonymous tenants on defaults
    shares = zipf_shares(20, ZIPF_EXPONENT)
    assert senders["vip"] / len(interactive) == pytest.approx(shares[0] / (1 - shares[1]), abs=0.01)
    assert set(senders) == {"vip", *(f"tenant-{i:02d}" for i in range(18))}
    # batch items come from every tenant, in rank order
    items = Counter(r.tenant for r in batch)
    assert items["vip"] / len(batch) == pytest.approx(shares[0], abs=0.02)
    assert items["bulk"] / len(batch) == pytest.approx(shares[1], abs=0.02)
    # the TierMix's IW-F share is gone: IW-F is vip's traffic
    spec = BuiltinWorkload(peak_tps=PEAK)
    assert spec.fast_share(fleet.model("m")) == pytest.approx(shares[0] / (1 - shares[1]))


def test_the_policy_acts_in_the_simulation(fleet: Fleet) -> None:
    requests = _requests(fleet, duration_s=600.0)
    results = simulate(
        fleet, requests, SimOptions(duration_s=600.0, strategy=ScalingStrategy.REACTIVE)
    )
    vip = results.tenants["vip"]
    assert vip.requests > 40
    assert vip.throttled_requests > vip.requests / 2  # its rpm of 2 against about 50 a minute
    vip_interactive = sum(r.tenant == "vip" and r.tier is None for r in requests)
    assert results.tiers["iw-f"].requests == vip_interactive  # IW-F only as vip's policy tier
    assert results.tiers["iw-n"].requests > 0  # the anonymous tenants, on the defaults
    assert "bulk" in results.tenants


def test_seeded(fleet: Fleet) -> None:
    first = _requests(fleet, duration_s=3600.0, seed=4)
    assert first == _requests(fleet, duration_s=3600.0, seed=4)
    assert first != _requests(fleet, duration_s=3600.0, seed=5)


def test_no_named_tenant_keeps_the_per_request_tiers(tmp_path: Path, fleet: Fleet) -> None:
    plain = write_fleet(tmp_path, pool_yaml(), model_yaml())
    for requests in (
        _requests(plain, duration_s=3600.0),
        _requests(fleet, duration_s=3600.0, policy_tenants=False),
    ):
        assert {r.tenant for r in requests} <= {f"tenant-{i:02d}" for i in range(20)}
        tiers = Counter(r.tier for r in requests)
        assert None not in tiers
        share = tiers[Tier.IW_FAST] / (tiers[Tier.IW_FAST] + tiers[Tier.IW_NORMAL])
        assert share == pytest.approx(0.42 / 0.72, abs=0.03)
    spec = BuiltinWorkload(peak_tps=PEAK)
    assert spec.fast_share(plain.model("m")) == pytest.approx(0.42 / 0.72)


def test_anonymous_names_skip_the_policys_and_one_is_always_left(tmp_path: Path) -> None:
    tenants = [f"{{name: tenant-{i:02d}, tier: iw-f}}" for i in range(0, 40, 2)]
    fleet = write_fleet(tmp_path, pool_yaml(), model_yaml(), _policy(tenants))
    mix = BuiltinWorkload(peak_tps=PEAK).tenant_mix(fleet.model("m"))
    assert len(mix.names) == len(set(mix.names)) == 21  # 20 named + at least one anonymous
    assert mix.names[-1] == "tenant-01"
    assert mix.policy_tiers is not None
    assert mix.policy_tiers[-1] is Tier.IW_NORMAL  # the defaults'
    assert sum(mix.shares) == pytest.approx(1.0)


def test_a_policy_with_no_interactive_tenant_keeps_the_old_draw(tmp_path: Path) -> None:
    fleet = write_fleet(
        tmp_path, pool_yaml(), model_yaml(), _policy(["{name: evals, tier: niw}"], "niw")
    )
    mix = BuiltinWorkload(peak_tps=PEAK).tenant_mix(fleet.model("m"))
    assert mix.policy_tiers is None
    assert mix.names[0] == "tenant-00"


def test_the_example_fleets_policies_reach_the_workload() -> None:
    fleet = load_fleet(EXAMPLES)
    spec = BuiltinWorkload(duration_s=3600.0, rate_scale=0.01, start_hour=14.0)
    workload = spec.build(fleet)
    tenants = {m: Counter[str]() for m in ("llama-3-70b", "mistral-7b")}
    for r in workload:
        tenants[r.model][r.tenant] += 1
    assert tenants["llama-3-70b"].most_common(1)[0][0] == "acme"
    assert {"acme", "globex", "nightly-evals"} <= set(tenants["llama-3-70b"])
    assert {"team-search", "team-docs"} <= set(tenants["mistral-7b"])
    policy = workload.info.parameters["policyTenants"]
    assert policy["llama-3-70b"]["named"] == ["acme", "globex", "nightly-evals"]
    assert policy["mistral-7b"]["iwFastShare"] == 0.0  # the agents policy gives every tenant iw-n
    assert "acme, globex, nightly-evals, then 17 anonymous" in workload.info.notes[0]


def test_the_region_note_says_how_demand_was_sized() -> None:
    fleet = load_fleet(EXAMPLES)
    default = BuiltinWorkload(duration_s=3600.0).build(fleet).info.notes[0]
    assert "peak interactive demand 60% of its capacity at maxInstances." in default
    assert "in proportion" not in default
    both = instance_sizing(fleet, {"*": 1.0})
    by_instances = BuiltinWorkload(duration_s=3600.0, peak_tps=both, rate_scale=0.5)
    note = by_instances.build(fleet).info.notes[0]
    assert "the tokens/s set for it, not by capacity (llama-3-70b, mistral-7b), times 0.5." in note
    assert "capacity at maxInstances" not in note
    one = instance_sizing(fleet, {"llama-3-70b": 1.0})
    mixed = BuiltinWorkload(duration_s=3600.0, peak_tps=one).build(fleet).info.notes[0]
    assert (
        "the tokens/s set for it, not by capacity (llama-3-70b) and 60% of its capacity at "
        "maxInstances (mistral-7b)." in mixed
    )


def test_the_cli_report_names_the_policy_tenants(tmp_path: Path) -> None:
    args = ["simulate", "--fleet", str(EXAMPLES), "--hours", "0.25", "--quiet", "--jobs", "1"]
    args += ["--peak-instances", "llama-3-70b=1,mistral-7b=0.1", "--strategies", "reactive"]
    args += ["--planner", "last-hour-peak", "--out", str(tmp_path)]
    assert main(args) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    note = summary["workload"]["notes"][0]
    assert "not by capacity (llama-3-70b, mistral-7b)" in note
    assert "in proportion to its capacity" not in note
    tenants = summary["strategies"]["reactive"]["tenants"]
    assert {"acme", "globex", "team-search", "team-docs"} <= set(tenants)
    assert tenants["acme"]["demand_tokens"] > tenants["tenant-00"]["demand_tokens"] > 0
