"""Watch caches: what the kopf indices hold, what gather() reads back, and which model events wake a loop."""

from __future__ import annotations

from typing import Any

import kopf

from specdec_operator import GROUP, KIND, PLURAL
from specdec_operator.gpu.inventory import PodGpus, node_gpus
from specdec_operator.handlers.services.cache import WatchCache
from specdec_operator.handlers.services.watches import (
    OWNED_SELECTOR,
    filter_watches,
    index_configmap,
    index_deployment,
    index_runtime_pod,
)
from specdec_runtime import contract

MODEL_UID = "uid-model-a"


def child(name: str, owner_uid: str = MODEL_UID, owner_kind: str = KIND) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name, "namespace": "ns", "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY},
            "ownerReferences": [{"kind": owner_kind, "name": "a", "uid": owner_uid}],
            "managedFields": [{"manager": "specdec-operator", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"replicas": 2},
    }


def pod(name: str, model: str, replica_set: str | None = None, template_hash: str = "5d8f7c9b4") -> dict[str, Any]:
    """A runtime pod; made by `<replica_set>` (a ReplicaSet `<Deployment>-<hash>`) when given."""
    labels = {contract.LABEL_MODEL: model, contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
              "pod-template-hash": template_hash}
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels}
    if replica_set is not None:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replica_set,
                                    "uid": f"uid-{replica_set}", "controller": True}]
    return {"metadata": meta, "status": {"podIP": "127.0.0.9"}}


class FakeIndex(dict[Any, list[dict[str, Any]]]):
    """What kopf hands handlers: key -> the values every indexed object returned for that key."""

    def add(self, entry: dict[Any, dict[str, Any]] | None) -> None:
        for key, value in (entry or {}).items():
            self.setdefault(key, []).append(value)


def indices() -> dict[str, FakeIndex]:
    return {name: FakeIndex() for name in
            ("owned_deployments", "owned_configmaps", "owned_services", "owned_pdbs", "runtime_pods")}


def test_children_are_indexed_by_owning_model_without_managed_fields() -> None:
    kwargs = indices()
    kwargs["owned_deployments"].add(index_deployment(kopf.Body(child("a-pool"))))
    kwargs["owned_configmaps"].add(index_configmap(kopf.Body(child("a-config"))))
    kwargs["owned_deployments"].add(index_deployment(kopf.Body(child("b-pool", owner_uid="uid-model-b"))))
    assert index_deployment(kopf.Body(child("x", owner_kind="ReplicaSet"))) is None
    cache = WatchCache()
    cache.bind(kwargs)
    found = cache.children("ns", MODEL_UID)
    assert sorted(found) == [("ConfigMap", "a-config"), ("Deployment", "a-pool")]
    deployment = found[("Deployment", "a-pool")]
    assert deployment["kind"] == "Deployment" and deployment["apiVersion"] == "apps/v1"
    assert "managedFields" not in deployment["metadata"]
    assert deployment["spec"] == {"replicas": 2}
    assert cache.children("other-ns", MODEL_UID) == {}


def test_runtime_pods_are_the_model_labelled_pods_its_own_deployments_made() -> None:
    """Issue 34 item 10: labels alone are anyone's to set; a look-alike pod is never the model's."""
    kwargs = indices()
    kwargs["owned_deployments"].add(index_deployment(kopf.Body(child("a-pool"))))
    kwargs["owned_deployments"].add(index_deployment(kopf.Body(child("b-pool", owner_uid="uid-model-b"))))
    for body in (pod("p1", "a", "a-pool-5d8f7c9b4"), pod("p2", "a", "a-pool-5d8f7c9b4"),
                 pod("p3", "b", "b-pool-5d8f7c9b4"),
                 pod("bare", "a"),  # our labels, no owner
                 pod("other-rs", "a", "someone-5d8f7c9b4"),  # a ReplicaSet that is not one of ours
                 pod("b-rs", "a", "b-pool-5d8f7c9b4"),  # model a's labels, model b's ReplicaSet
                 pod("wrong-hash", "a", "a-pool-5d8f7c9b4", template_hash="0000")):
        kwargs["runtime_pods"].add(index_runtime_pod(kopf.Body(body)))
    cache = WatchCache()
    cache.bind(kwargs)
    assert sorted(p["metadata"]["name"] for p in cache.pods("ns", "a", MODEL_UID)) == ["p1", "p2"]
    assert cache.pods("ns", "b", MODEL_UID) == []
    assert cache.pods("ns", "c", MODEL_UID) == []


def test_status_only_events_do_not_wake_the_model() -> None:
    cache = WatchCache()
    key = ("ns", "a")
    body: dict[str, Any] = {"metadata": {"generation": 1, "annotations": {}, "labels": {}}, "status": {}}
    assert cache.model_changed(key, None, body), "the first sight of a model wakes it"
    assert not cache.model_changed(key, "MODIFIED", {**body, "status": {"pools": []}}), "our status write echoes"
    assert cache.model_changed(key, "MODIFIED", {**body, "metadata": {**body["metadata"], "generation": 2}})
    annotated = {"metadata": {"generation": 2, "annotations": {"specdec.io/action": "abort"}, "labels": {}}}
    assert cache.model_changed(key, "MODIFIED", annotated), "a manual action annotation wakes it"
    assert cache.model_changed(key, "DELETED", annotated)
    cache.forget(key)
    assert cache.model_changed(key, None, annotated), "forgotten models start over"


def test_watches_are_filtered_by_our_label_on_the_server_and_listed_in_pages() -> None:
    settings = kopf.OperatorSettings()
    filter_watches(settings, "specdec.io/shard=blue")
    selectors = settings.watching.label_selectors
    for plural in ("deployments", "configmaps", "services", "poddisruptionbudgets"):
        assert selectors[plural] == OWNED_SELECTOR
    assert "pods" not in selectors, "free-GPU counts watch every pod, not only ours"
    assert selectors[GROUP, PLURAL] == "specdec.io/shard=blue"
    assert settings.watching.chunk_size == 500
    unsharded = kopf.OperatorSettings()
    filter_watches(unsharded, "")
    assert (GROUP, PLURAL) not in unsharded.watching.label_selectors


def test_the_fleet_snapshot_is_shared_for_a_moment_then_read_again() -> None:
    from specdec_operator.handlers.services.cache import FleetSnapshot

    def claim(name: str, node: str, model: str | None = None) -> PodGpus:
        return PodGpus("ns", name, 2, node, model)

    nodes = {"n1": [node_gpus("node-1", {}, {"amd.com/gpu": "8"})]}
    pods = {"ns/p1": [claim("p1", "node-1", "ns/m")], "ns/p2": [claim("p2", "node-1")]}
    snapshot = FleetSnapshot(max_age_s=1.0)
    seen_nodes, claims = snapshot.read(nodes, pods, now=100.0)
    assert [n.name for n in seen_nodes] == ["node-1"]
    assert claims.held == {"node-1": 4} and [p.name for p in claims.by_model["ns/m"]] == ["p1"]
    pods["ns/p3"] = [claim("p3", "node-2")]
    del nodes["n1"]
    assert snapshot.read(nodes, pods, now=100.9) == (seen_nodes, claims)  # shared
    again_nodes, again = snapshot.read(nodes, pods, now=101.0)  # read again
    assert again_nodes == [] and again.held == {"node-1": 4, "node-2": 2}
    assert snapshot.read(nodes, {}, now=50.0)[1].held == {}  # a clock that went back never serves an old one
    snapshot.read(nodes, pods, now=200.0)
    snapshot.clear()  # the last model went: nothing pins the fleet's claims
    assert snapshot.read(nodes, {}, now=200.5)[1].held == {}


def test_a_runtime_pod_is_held_as_what_the_scrape_path_and_the_canary_read_of_it() -> None:
    from specdec_operator.canary.evidence import pod_restarts
    from specdec_operator.reconcile.tuning_inputs import scrape_targets

    full = pod("p1", "a")
    full["metadata"].update({
        "annotations": {contract.ANNOTATION_K: "4"},
        "labels": {**full["metadata"]["labels"], contract.LABEL_POOL: "a-gfx942", contract.LABEL_REVISION: "r1"},
        "managedFields": [{"manager": "kubelet"}], "ownerReferences": [{"kind": "ReplicaSet"}],
    })
    full["spec"] = {"containers": [{"name": "vllm", "args": ["--model", "x"] * 50, "env": [{"name": "A"}] * 20}]}
    full["status"].update({
        "phase": "Running", "hostIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"}],
        "containerStatuses": [{"name": "vllm", "restartCount": 2, "image": "x", "state": {"running": {}}}],
    })
    (held,) = index_runtime_pod(kopf.Body(full)).values()  # type: ignore[union-attr]
    assert "spec" not in held and "managedFields" not in held["metadata"]
    assert scrape_targets([held]) == scrape_targets([full]) and len(scrape_targets([held])) == 1
    assert pod_restarts([held]) == pod_restarts([full]) and pod_restarts([held])[0].restart_count == 2
    terminating = {**full, "metadata": {**full["metadata"], "deletionTimestamp": "2026-11-30T10:01:00Z"}}
    (held,) = index_runtime_pod(kopf.Body(terminating)).values()  # type: ignore[union-attr]
    assert scrape_targets([held]) == []
