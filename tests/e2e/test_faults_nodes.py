"""Issue 22 item 1 on the local control plane: a pool whose nodes drop out keeps its capacity through a grace.

A pool's two MI300X nodes report allocatable amd.com/gpu 0 for 60 s (the device plugin re-registering), and,
separately, their Node objects are deleted and re-created (a node group replaced). Within the grace period
(default 300 s) the operator deletes no Deployment, PDB, ConfigMap or Service, never scales the pool down,
keeps K (all read from the API server's audit log), and a condition names the missing nodes meanwhile.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.audit import AuditEntry, AuditLog, deployment_writes, recorded_sequence, rollouts, status_writes
from tests.e2e.faults import decided_k, template
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import apply_nodes, condition, pinned_model, test_nodes  # noqa: F401 - fixture
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.long]

OUTAGE_S = 60  # the scenario: how long the nodes stay missing
OWNED = ("deployments", "poddisruptionbudgets", "configmaps", "services")


def ready_pool(kube: Kube, model: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = kube.get("sm", model)
        ready = condition(body, "Ready")
        pools = (body or {}).get("status", {}).get("pools") or []
        return pools[0] if ready and ready["status"] == "True" and len(pools) == 1 else None

    return wait_for(f"{model} Ready with one pool", probe, 180, 1, describe=lambda: kube.get("sm", model))


def nodes_missing(kube: Kube, model: str, names: list[str]) -> dict[str, Any]:
    """Wait for Degraded=NodesMissing naming every one of `names` (and the stamp in status)."""
    def probe() -> dict[str, Any] | None:
        body = kube.get("sm", model)
        degraded = condition(body, "Degraded")
        pools = (body or {}).get("status", {}).get("pools") or []
        if not degraded or degraded["reason"] != "NodesMissing" or not all(n in degraded["message"] for n in names):
            return None
        return degraded if pools and pools[0].get("missing") else None

    return wait_for("a NodesMissing condition naming the nodes", probe, 60, 1,
                    describe=lambda: (kube.get("sm", model) or {}).get("status"))


def hold_outage(operator: OperatorProcess, started: float, seconds: float) -> None:
    """The outage lasts `seconds` from `started` (monotonic), and ends only once the operator has completed a
    reconcile pass after that mark: it has evaluated the whole outage, not just its start."""
    reconciles: dict[str, float] = {}

    def probe() -> bool:
        total = operator.total("specdec_reconcile_total")
        if time.monotonic() - started < seconds:
            return False
        reconciles.setdefault("at_mark", total)
        return total > reconciles["at_mark"]

    wait_for(f"{seconds:.0f} s of outage and a reconcile pass after it", probe, seconds + 60, 1)


def patch_allocatable(cluster: LocalCluster, names: list[str], gpus: str) -> None:
    for name in names:
        cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": {"allocatable": {"amd.com/gpu": gpus}}}))


def assert_capacity_kept(entries: list[AuditEntry], model: str, pool: dict[str, Any],
                         template_before: dict[str, Any]) -> None:
    deleted = [f"{e.resource}/{e.name}" for e in entries if e.by_operator and e.verb == "delete"
               and e.resource in OWNED]
    assert deleted == [], f"the operator deleted {deleted} within the grace period"
    rolled = rollouts(entries, pool["name"], baseline=template_before)
    assert rolled == [], f"the pool's pod template changed: {rolled}"
    scaled = [e.received for e in deployment_writes(entries, pool["name"]) if e.ok
              and (e.response or {}).get("spec", {}).get("replicas") not in (None, pool["replicas"])]
    assert scaled == [], f"the operator changed the pool's replicas at {scaled}"
    ks = recorded_sequence(status_writes(entries, model), lambda status: decided_k(status, pool["name"]))
    assert set(ks) <= {pool["effectiveK"]}, f"K moved: {ks}"


def run_outage(kube: Kube, operator: OperatorProcess, model: str, names: list[str], begin: Callable[[], None],
               end: Callable[[], None]) -> None:
    pool = ready_pool(kube, model)
    assert sorted(pool["nodeNames"]) == sorted(names)
    template_before = template(kube, pool["name"])
    audit = AuditLog(kube.cluster.paths.logs / "audit.log")
    started = time.monotonic()
    begin()
    degraded = nodes_missing(kube, model, names)
    assert "keeping 2 replica(s) at K=3" in degraded["message"], degraded
    events = kube.events_once(model, "NodesMissing")
    assert any(e["reason"] == "NodesMissing" and e["type"] == "Warning" for e in events)
    hold_outage(operator, started, OUTAGE_S)
    still = condition(kube.get("sm", model), "Degraded")
    assert still is not None and still["reason"] == "NodesMissing", still  # held, not removed
    end()
    def whole_again() -> bool:
        body = kube.get("sm", model)
        ready = condition(body, "Ready")
        return bool(body and ready and ready["status"] == "True"
                    and not any(p.get("missing") for p in body["status"]["pools"]))

    wait_for("the pool whole again, no nodes missing", whole_again, 180, 1,
             describe=lambda: (kube.get("sm", model) or {}).get("status"))
    entries = audit.entries(kube.namespace)
    assert_capacity_kept(entries, model, pool, template_before)
    body = kube.get("sm", model)
    assert body["status"]["pools"][0]["effectiveK"] == pool["effectiveK"]
    assert kube.get("deployment", pool["name"])["spec"]["replicas"] == pool["replicas"]


def test_allocatable_gpus_zero_for_a_minute_keeps_the_pool(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    names = [node["metadata"]["name"] for node in test_nodes("alloc", 2)]
    kube.apply(pinned_model("grace-alloc", namespace, replicas=2))
    run_outage(kube, operator, "grace-alloc", names,
               begin=lambda: patch_allocatable(cluster, names, "0"),
               end=lambda: patch_allocatable(cluster, names, "8"))


def test_nodes_deleted_and_recreated_keep_the_pool(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    nodes = test_nodes("gone", 2)
    names = [node["metadata"]["name"] for node in nodes]
    kube.apply(pinned_model("grace-gone", namespace, replicas=2))

    def delete() -> None:
        for name in names:
            cluster.kubectl("delete", "node", name, "--wait=true")

    def recreate() -> None:
        apply_nodes(cluster, nodes)

    run_outage(kube, operator, "grace-gone", names, begin=delete, end=recreate)
