"""`make operator-demo`: the operator reconciling examples/ in a local Kubernetes API emulator.

`make demo` is the fleet simulator (docs/simulator.md). Everything here runs on this machine:
the Helm chart is rendered by real Helm (helm-python-sdk), a Kubernetes API emulator serves on
127.0.0.1, and the real operator (its Kopf handlers, reconcilers and API client) does the work.
Only the cluster is emulated: no pods start, so the demo plays the controller-manager for one
Deployment to show readiness reaching status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetwarden.operator.kube import DEPLOYMENTS  # noqa: E402
from tests.support.fleet_operator import RunningOperator, example_objects, running_operator  # noqa: E402
from tests.support.helm_render import render_chart  # noqa: E402
from tests.support.kube_emulator import KubeEmulator  # noqa: E402

NS = "llm-serving"


def heading(text: str) -> None:
    print(f"\n== {text}")


def table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return {"status": "-", "reason": "-", "message": ""}


def show_children(op: RunningOperator) -> None:
    heading("What the operator created (per ModelDeployment region)")
    rows = []
    for d in op.list("Deployment", NS):
        pod = d["spec"]["template"]["spec"]
        engine = pod["containers"][0]
        labels = d["metadata"]["labels"]
        rows.append(
            [
                d["metadata"]["name"],
                labels["fleetwarden.dev/region"],
                labels["fleetwarden.dev/gpu-type"],
                str(d["spec"]["replicas"]),
                engine["resources"]["limits"]["nvidia.com/gpu"],
                ",".join(f"{k}={v}" for k, v in pod["nodeSelector"].items() if "region" in k),
                d["metadata"]["ownerReferences"][0]["name"],
            ]
        )
    table(rows, ["DEPLOYMENT", "REGION", "GPU", "REPLICAS", "GPUS/POD", "NODES", "OWNER"])
    services = [s["metadata"]["name"] for s in op.list("Service", NS)]
    print(f"  + {len(services)} Services (port http -> sidecar, port metrics for Prometheus)")
    rows = []
    for cm in op.list("ConfigMap", NS, "app.kubernetes.io/managed-by=fleetwarden"):
        config = json.loads(cm["data"]["fairness.json"])
        rows.append([cm["metadata"]["name"], config["version"], config["policy"], config["source"]])
    table(rows, ["CONFIGMAP", "VERSION", "POLICY", "FROM"])


def show_status(op: RunningOperator) -> None:
    heading("kubectl get md,rp,tp (status written by the operator)")
    rows = []
    for md in op.list("ModelDeployment", NS):
        status = md.get("status") or {}
        ready = condition(md, "Ready")
        rows.append(
            [
                md["metadata"]["name"],
                str(status.get("regionCount")),
                str(status.get("instances")),
                str(status.get("readyInstances")),
                ready["status"],
                ready["reason"],
            ]
        )
    table(rows, ["MODELDEPLOYMENT", "REGIONS", "INSTANCES", "READYPODS", "READY", "REASON"])
    rows = []
    for rp in op.list("RegionPool"):
        status = rp.get("status") or {}
        rows.append(
            [
                rp["metadata"]["name"],
                rp["spec"]["region"],
                rp["spec"]["gpuType"],
                str(rp["spec"]["capacity"].get("gpus")),
                str(status.get("allocatedGpus")),
                str(status.get("freeGpus")),
            ]
        )
    table(rows, ["REGIONPOOL", "REGION", "GPU", "GPUS", "ALLOCATED", "FREE"])
    rows = []
    for tp in op.list("TenantPolicy", NS):
        status = tp.get("status") or {}
        rows.append(
            [
                tp["metadata"]["name"],
                tp["spec"]["policy"],
                str(status.get("configVersion")),
                ",".join(status.get("modelDeployments", [])),
            ]
        )
    table(rows, ["TENANTPOLICY", "POLICY", "VERSION", "CONFIGURES"])


async def demo() -> None:
    heading("Helm chart rendered with real Helm (helm-python-sdk)")
    objects = render_chart()
    kinds = Counter(o["kind"] for o in objects)
    print("  " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))

    async with KubeEmulator() as emulator, running_operator(emulator) as op:
        heading(f"Kubernetes API emulator on {emulator.url}; operator running (real Kopf handlers)")
        fleet = [o for o in example_objects() if o["kind"] != "Namespace"]
        print("  kubectl apply -f examples/: " + ", ".join(
            f"{n} {k}" for k, n in sorted(Counter(o["kind"] for o in fleet).items())
        ))  # fmt: skip
        await op.apply(fleet)
        await op.settle()
        show_children(op)

        heading("Readiness: the demo plays the controller-manager for mistral-7b's pods")
        for d in op.list("Deployment", NS, "fleetwarden.dev/model-deployment=mistral-7b"):
            replicas = d["spec"]["replicas"]
            status = {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas}
            status["readyReplicas"] = replicas
            await op.kube.merge_patch(
                DEPLOYMENTS, d["metadata"]["name"], {"status": status}, NS, "status"
            )
        await op.settle()
        show_status(op)

        heading("Self-healing: someone scales llama-3-70b-us-east-a100 to 9 replicas by hand")
        deployment = op.get("Deployment", "llama-3-70b-us-east-a100", NS)
        assert deployment is not None
        await op.patch(deployment, {"spec": {"replicas": 9}})
        await op.settle()
        deployment = op.get("Deployment", "llama-3-70b-us-east-a100", NS)
        assert deployment is not None
        print(f"  replicas now {deployment['spec']['replicas']} (the operator's decision)")
        for event in op.events_for("llama-3-70b", NS):
            if (
                event["reason"] == "Updated"
                and "Deployment llama-3-70b-us-east-a100" in event["message"]
            ):
                print(f"  Event {event['type']} {event['reason']}: {event['message']}")

        heading("A bad resource: a ModelDeployment naming a pool that does not exist")
        bad = next(o for o in fleet if o["metadata"]["name"] == "mistral-7b")
        bad = {**bad, "metadata": {"name": "orphan", "namespace": NS}}
        bad["spec"] = {**bad["spec"], "regions": [{"pool": "ap-south-a100", "maxInstances": 2}]}
        await op.apply([bad])
        await op.settle()
        degraded = condition(op.get("ModelDeployment", "orphan", NS), "Degraded")
        print(f"  Degraded={degraded['status']} reason={degraded['reason']}: {degraded['message']}")

        heading("Events posted")
        reasons = Counter((e["type"], e["reason"]) for e in emulator.list("", "v1", "events", NS))
        print("  " + ", ".join(f"{n} x {t}/{r}" for (t, r), n in sorted(reasons.items())))
    print("\nDone. The same operator runs on a cluster: see README.md, 'Install on a cluster'.")


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(demo())


if __name__ == "__main__":
    main()
