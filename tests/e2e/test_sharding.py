"""Two operator installs split a fleet by a label selector on SpeculativeModels: no overlap, no gap.

Each shard runs as the chart runs it (peering on, its own peering object) with the kopf peering CRDs
from the chart. Shard `a` takes models labelled specdec.io/shard=a, shard `rest` everything else
(`notin (a)` also matches models without the label). The session's standalone operator, which would
reconcile every model, is paused meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.audit import AuditLog, recorded_sequence, status_writes
from tests.e2e.helm import Helm, Release, unique_name
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

SHARD_LABEL = "specdec.io/shard"
SHARDS = {"a": f"{SHARD_LABEL}=a", "rest": f"{SHARD_LABEL} notin (a)"}


def model(name: str, shard: str | None) -> dict[str, Any]:
    labels = {SHARD_LABEL: shard} if shard else {}
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": name, "tensorParallelSize": 1},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            "speculation": {"initialK": 3, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 1},
        },
    }


@pytest.fixture
def shards(cluster: LocalCluster, crds: None, operator: OperatorProcess,
           namespace: str) -> Iterator[dict[str, OperatorProcess]]:
    release = Release(Helm(cluster), unique_name("shards"), unique_name("e2e-shard-sys"),
                      {"watchNamespaces": [namespace], "replicaCount": 0})
    operator.stop()
    running: dict[str, OperatorProcess] = {}
    try:
        release.install()  # kopf's peering CRDs
        for shard, selector in SHARDS.items():
            running[shard] = OperatorProcess(
                cluster, name=f"operator-{release.name}-{shard}", SPECDEC_STANDALONE="false",
                SPECDEC_NAMESPACES=json.dumps([namespace]), SPECDEC_SHARD=shard, SPECDEC_MODEL_SELECTOR=selector,
                SPECDEC_PEERING_NAME=f"specdec-operator-{shard}",
                # Only so the test can tell whose applies these are; installs share one field manager.
                SPECDEC_FIELD_MANAGER=f"specdec-shard-{shard}",
            ).start()
        yield running
    finally:
        for process in running.values():
            process.stop()
        operator.start()
        release.cleanup()


def shard_of(kube: Kube) -> dict[str, str | None]:
    return {item["metadata"]["name"]: item.get("status", {}).get("shard") for item in kube.items("sm")}


def appliers(kube: Kube, name: str) -> set[str]:
    """Shards whose server-side applies own fields of the model's objects (from their field managers)."""
    managers = set()
    for kind in ("deployments", "configmaps", "services", "poddisruptionbudgets"):
        listed = kube.run("get", kind, "-l", f"specdec.io/model={name}", "--show-managed-fields", "-o", "json")
        for item in json.loads(listed)["items"]:
            managers |= {entry["manager"].removeprefix("specdec-shard-")
                         for entry in item["metadata"].get("managedFields", [])
                         if entry["manager"].startswith("specdec-shard-")}
    return managers


def test_two_shards_split_the_fleet_with_no_overlap_and_no_gap(
    kube: Kube, namespace: str, shards: dict[str, OperatorProcess]
) -> None:
    wanted = {"m-a1": "a", "m-a2": "a", "m-b1": "b", "m-plain1": None, "m-plain2": None}
    kube.apply([model(name, shard) for name, shard in wanted.items()])
    expected = {name: ("a" if shard == "a" else "rest") for name, shard in wanted.items()}
    wait_for("every model's status names its shard", lambda: shard_of(kube) == expected, 90)

    for shard in ("a", "rest"):
        peering = json.loads(kube.run("get", "kopfpeering", f"specdec-operator-{shard}", "-o", "json"))
        assert peering["status"], f"shard {shard} keeps its own peering object alive"

    # No overlap: every model's objects were applied by its own shard and by no other.
    assert {name: appliers(kube, name) for name in wanted} == {name: {shard} for name, shard in expected.items()}

    # Relabel a model from the catch-all shard into shard a: it moves, and stays owned once.
    audit = AuditLog(kube.cluster.paths.logs / "audit.log")
    relabelled = json.loads(kube.run("label", "sm", "m-plain1", f"{SHARD_LABEL}=a", "-o", "json"))
    wait_for("m-plain1 moves to shard a", lambda: shard_of(kube)["m-plain1"] == "a", 60)
    # The old shard let go: its loop for the model ended (its series are gone from its /metrics), and no status
    # it wrote was stored after the relabel, not even by a pass in flight that re-read and retried. A write of
    # shard rest stored just before the relabel is fine (the cursor opens before kubectl sends it), so writes
    # are placed by the resourceVersion the server gave them: integers from etcd, in the order it stored them.
    wait_for("shard rest drops m-plain1", lambda: (samples := shards["rest"].metrics()) is not None
             and not any("model=m-plain1," in series for series in samples), 60)
    relabelled_at = int(relabelled["metadata"]["resourceVersion"])
    stored_after = [entry for entry in status_writes(audit.entries(namespace), "m-plain1")
                    if entry.ok and int((entry.response or {})["metadata"]["resourceVersion"]) > relabelled_at]
    written = recorded_sequence(stored_after, lambda s: s.get("shard"))
    assert written == ["a"], written
    assert shard_of(kube) == {**expected, "m-plain1": "a"}
