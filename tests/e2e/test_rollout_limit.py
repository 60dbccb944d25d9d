"""The fleet's limit on rollouts in flight (issue 32, item 3) on the local cluster: with
SPECDEC_MAX_CONCURRENT_ROLLOUTS=1, three models whose spec changes at once roll out one after another. The API
server's audit log proves it: each pool's template change (the operator's write) starts only after the previous
pool's Deployment reported every replica updated (the Deployment controller's status write), and each pool rolls
out exactly once. A model that waits says so (Progressing=False, RolloutQueued)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from specdec_operator.reconcile.rollout_limit import LIMIT_SOURCE
from tests.e2e.audit import AuditEntry, AuditLog, rollouts
from tests.e2e.faults import settle, tuned_model
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import condition
from tests.e2e.operator_process import FleetDriverProcess, OperatorFactory
from tests.e2e.test_freeze import revision

pytestmark = pytest.mark.e2e

MODELS = ("limit-a", "limit-b", "limit-c")


def steady_model(name: str) -> dict[str, Any]:
    """A model whose K stays where it starts: only the spec change below rolls it."""
    body = tuned_model(name)
    body["spec"]["speculation"]["autotune"]["enabled"] = False
    return body


def rolled_out_at(entries: list[AuditEntry], deployment: str, since: str) -> str | None:
    """When the Deployment controller first reported every replica of the current template after `since`."""
    for entry in entries:
        if entry.received < since or not entry.ok or not entry.is_write_of("deployments", deployment, "status"):
            continue
        body = entry.response or {}
        meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
        replicas = int(spec.get("replicas", 0))
        if (int(status.get("observedGeneration", 0)) >= int(meta.get("generation", 0))
                and int(status.get("updatedReplicas", 0)) == replicas == int(status.get("replicas", 0))):
            return entry.received
    return None


def test_three_models_changed_at_once_roll_out_one_at_a_time_under_a_limit_of_one(
    kube: Kube, scoped_operator: OperatorFactory, fleet_driver: FleetDriverProcess, cluster: LocalCluster,
    namespace: str,
) -> None:
    scoped_operator(SPECDEC_MAX_CONCURRENT_ROLLOUTS="1")
    bodies = {name: steady_model(name) for name in MODELS}
    for body in bodies.values():
        kube.apply(body)  # new pools are not rollouts: all three are placed at once
    pools = {name: settle(kube, name) for name in MODELS}
    before = {name: revision(kube, pool) for name, pool in pools.items()}
    audit = AuditLog(cluster.paths.logs / "audit.log")
    baseline = {name: kube.get("deployment", pool) for name, pool in pools.items()}
    for body in bodies.values():
        body["spec"]["model"]["maxModelLen"] = 4096  # a change of every pool's pod template, all at once
    kube.apply(list(bodies.values()))

    queued = wait_for("a model waiting with Progressing=False RolloutQueued", lambda: next(
        (found for name in MODELS if (found := condition(kube.get("sm", name), "Progressing"))
         and found["reason"] == "RolloutQueued"), None), 120, 0.5,
        describe=lambda: {name: condition(kube.get("sm", name), "Progressing") for name in MODELS})
    print(f"queued: {queued['message']}")
    assert LIMIT_SOURCE in queued["message"] and "1 of 1 in flight" in queued["message"]

    def all_rolled() -> bool:
        return all(revision(kube, pool) != before[name] and not _reason(kube, name, "RolloutQueued")
                   for name, pool in pools.items())

    wait_for("every model rolled out", all_rolled, 300, 1,
             describe=lambda: {name: condition(kube.get("sm", name), "Progressing") for name in MODELS})
    entries = audit.entries(namespace)
    spans = []
    for name, pool in pools.items():
        changes = rollouts(entries, pool, baseline=baseline[name]["spec"]["template"])
        assert len(changes) == 1, (name, changes)  # exactly once
        ended = wait_for(f"{pool}'s rollout to end in the audit log",
                         lambda pool=pool, start=changes[0].received: rolled_out_at(
                             audit.entries(namespace), pool, start), 120, 1)
        spans.append((changes[0].received, ended, name))
    spans.sort()
    print("rollouts (start, end, model):", spans)
    for (_, ended, first), (started, _, second) in itertools.pairwise(spans):
        assert started >= ended, f"{second} started its rollout at {started}, before {first}'s ended at {ended}"


def _reason(kube: Kube, name: str, reason: str) -> bool:
    found = condition(kube.get("sm", name), "Progressing")
    return bool(found and found["reason"] == reason)
