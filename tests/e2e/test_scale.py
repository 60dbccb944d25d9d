"""The scale subresource: kubectl scale (as an HPA or KEDA would) resizes pools and rolls nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from localcluster.errors import ClusterError
from tests.e2e.audit import AuditLog, rollouts
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

NAME = "elastic"


def model(**placement: Any) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": NAME},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                 "drafters": [{"method": "ngram"}],
                 "placement": {"gfxTargets": ["gfx942", "gfx90a"], **placement}},
    }


def settled(kube: Kube, replicas: int) -> dict[str, Any]:
    """The model Ready with `replicas` placed, and that many runtime pods Running and ready."""
    def probe() -> dict[str, Any] | None:
        status = kube.get("sm", NAME).get("status", {})
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
        pods = [p for p in kube.items("pods", f"specdec.io/model={NAME}") if p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]
        if status.get("replicas") == replicas and ready.get("status") == "True" and len(pods) == replicas:
            return {"status": status, "pods": pods}
        return None

    def describe() -> dict[str, Any]:
        status = kube.get("sm", NAME).get("status", {})
        return {"replicas": status.get("replicas"), "pools": status.get("pools"),
                "conditions": [(c["type"], c["status"], c.get("reason"), c.get("message"))
                               for c in status.get("conditions", [])],
                "pods": [(p["metadata"]["name"], p["status"].get("phase"), bool(p["metadata"].get("deletionTimestamp")))
                         for p in kube.items("pods", f"specdec.io/model={NAME}")]}

    # An upper bound, not a target: two pools' pods start beside four other lanes in CI (once over 120 s there).
    return wait_for(f"{NAME} Ready with {replicas} replicas", probe, 240, describe=describe)


def pool_replicas(status: dict[str, Any]) -> dict[str, int]:
    return {pool["gfxTarget"]: pool["replicas"] for pool in status["pools"]}


def test_kubectl_scale_resizes_pools_without_a_rollout(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    kube.apply(model(totalReplicas=1, maxReplicasPerPool=2))
    before = settled(kube, 1)
    assert pool_replicas(before["status"]) == {"gfx942": 1}
    first_pod = before["pods"][0]["metadata"]["uid"]
    baseline = kube.get("deployment", f"{NAME}-gfx942")
    audit = AuditLog(cluster.paths.logs / "audit.log")

    # What an HPA reads: the scale subresource, with the count and the pods' selector.
    scale = json.loads(kube.run("get", "--raw", f"/apis/specdec.io/v1alpha1/namespaces/{namespace}/"
                                f"speculativemodels/{NAME}/scale"))
    assert scale["spec"]["replicas"] == 1 and scale["status"]["replicas"] == 1
    assert scale["status"]["selector"] == f"app.kubernetes.io/managed-by=specdec-operator,specdec.io/model={NAME}"

    kube.run("scale", f"sm/{NAME}", "--replicas=3")
    after = settled(kube, 3)
    # maxReplicasPerPool 2: the preferred pool takes two, the next gfx target the third.
    assert pool_replicas(after["status"]) == {"gfx942": 2, "gfx90a": 1}
    assert first_pod in {p["metadata"]["uid"] for p in after["pods"]}, "the serving pod was replaced"
    assert kube.get("sm", NAME)["spec"]["placement"]["totalReplicas"] == 3, "the operator reverted the scaler"
    columns = kube.run("get", "sm", NAME, "-o", "custom-columns=REPLICAS:.status.replicas", "--no-headers")
    assert columns.strip() == "3"
    assert "Replicas" in kube.run("get", "sm", NAME).splitlines()[0].title()

    kube.run("scale", f"sm/{NAME}", "--replicas=1")
    settled(kube, 1)
    entries = audit.entries(namespace)
    # The pool that existed before kept its pod template throughout: only its replica count moved.
    assert rollouts(entries, f"{NAME}-gfx942", baseline=baseline["spec"]["template"]) == []
    deleted_pods = [e for e in entries if e.is_write_of("pods") and e.verb == "delete" and e.by_operator]
    assert deleted_pods == [], "the operator deleted serving pods itself"


def test_a_fixed_replicas_per_pool_model_refuses_a_scale_naming_the_fields(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply(model(replicasPerPool=1))
    settled(kube, 2)
    with pytest.raises(ClusterError, match="set replicasPerPool or totalReplicas, not both"):
        kube.run("scale", f"sm/{NAME}", "--replicas=3")
    assert kube.get("sm", NAME)["spec"]["placement"] == {"gfxTargets": ["gfx942", "gfx90a"], "replicasPerPool": 1}
