"""Ghost capacity (issue 34, item 11): a node or GPU pod deleted during a watch gap stays in kopf's indices (kopf
re-lists after a gap but never drops what the new list lacks). The fleet audit finds them with a LIST and the fleet
snapshot placement reads leaves them out; an object re-created under the same name (a new uid) counts again."""

from __future__ import annotations

import types
from typing import Any, cast

from specdec_operator.gpu.inventory import NodeGpus, PodGpus
from specdec_operator.handlers import register
from specdec_operator.handlers.services.cache import FleetSnapshot
from specdec_operator.handlers.services.fleet_audit import FleetAudit
from specdec_operator.kube.api import KubeApiError
from tests.unit.handlers.fakeapi import FakeKubeApi
from tests.unit.handlers.test_reconciler import settings

GPU_LABELS = {"amd.com/gpu.device-id": "74a1", "amd.com/gpu.family": "AI"}


def node(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": uid, "labels": GPU_LABELS},
            "spec": {}, "status": {"allocatable": {"amd.com/gpu": "8"}}}


def gpu_pod(namespace: str, name: str, uid: str, on: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "2"}}}]},
            "status": {"phase": "Running"}}


async def indexed_node(body: dict[str, Any]) -> dict[str, NodeGpus]:
    """What kopf's node index holds for `body`: the operator's own index handler, called as kopf calls it."""
    memo = types.SimpleNamespace(context=types.SimpleNamespace(settings=settings()))
    meta = body["metadata"]
    # kopf.index wraps the handler in a type that wants every kwarg kopf passes; the handler reads these.
    found: dict[str, NodeGpus] = await cast(Any, register.gpu_nodes)(
        name=meta["name"], uid=meta["uid"], labels=meta["labels"], spec=body["spec"], status=body["status"],
        memo=memo)
    return found


async def indexed_pod(body: dict[str, Any]) -> dict[str, PodGpus]:
    meta = body["metadata"]
    found: dict[str, PodGpus] = await cast(Any, register.gpu_pods)(
        namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], labels={}, spec=body["spec"],
        status=body["status"])
    return found


class Indices:
    """kopf.Index-shaped stores (key -> the values of the objects under it), kept as kopf keeps them: an object
    leaves only through a DELETED event, which a watch gap loses."""

    def __init__(self) -> None:
        self.nodes: dict[str, list[NodeGpus]] = {}
        self.pods: dict[str, list[PodGpus]] = {}

    async def add(self, api: FakeKubeApi, body: dict[str, Any]) -> None:
        api.put(body)
        if body["kind"] == "Node":
            self.nodes.update({key: [value] for key, value in (await indexed_node(body)).items()})
        else:
            self.pods.update({key: [value] for key, value in (await indexed_pod(body)).items()})


def free_gpus(fleet: FleetSnapshot, indices: Indices, now: float) -> dict[str, int]:
    nodes, claims = fleet.read(indices.nodes, indices.pods, now)
    return {facts.name: facts.allocatable_gpus - claims.held.get(facts.name, 0) for facts in nodes}


async def test_nodes_and_pods_deleted_during_a_watch_gap_leave_the_fleet_after_the_audit() -> None:
    api, indices, fleet = FakeKubeApi(), Indices(), FleetSnapshot(max_age_s=0)
    audit = FleetAudit(interval_s=600)
    for body in (node("n1", "u-n1"), node("n2", "u-n2"), gpu_pod("team", "trainer", "u-p1", "n1"),
                 gpu_pod("other", "job", "u-p2", "n2")):
        await indices.add(api, body)
    audit.due(0.0)  # the first pass starts the period: kopf's indices were just filled by a LIST
    assert free_gpus(fleet, indices, 1.0) == {"n1": 6, "n2": 6}

    # The gap: n2 and the pod on n1 are deleted while no watch runs; kopf's re-list keeps both.
    await api.delete("Node", "", "n2")
    await api.delete("Pod", "team", "trainer")
    await audit.run_if_due(api, indices.nodes, indices.pods, fleet, 599.0)
    assert free_gpus(fleet, indices, 599.0) == {"n1": 6, "n2": 6}, "not due yet: nothing listed"
    assert not api.writes("list")

    await audit.run_if_due(api, indices.nodes, indices.pods, fleet, 600.0)
    assert free_gpus(fleet, indices, 600.0) == {"n1": 8}
    # One LIST of the nodes and one of the pods of each namespace the pod index holds pods in.
    assert [(call.kind, call.name) for call in api.writes("list")] == [("Node", ""), ("Pod", ""), ("Pod", "")]

    # n2 comes back under the same name (a new uid): the watch indexes it and it counts at once, with the claim
    # of the job the LIST still returned (it was never buried).
    await indices.add(api, node("n2", "u-n2-again"))
    assert free_gpus(fleet, indices, 601.0) == {"n1": 8, "n2": 6}


async def test_the_audit_runs_on_the_first_pass_after_a_pause_and_a_refused_list_changes_nothing() -> None:
    api, indices, fleet = FakeKubeApi(), Indices(), FleetSnapshot(max_age_s=0)
    audit = FleetAudit(interval_s=600)
    await indices.add(api, node("n1", "u-n1"))
    audit.due(0.0)
    await api.delete("Node", "", "n1")
    audit.paused()  # kopf closed the watches for a peer; the replica resumes later
    api.refuse[("list", "Node")] = lambda _: KubeApiError(403, "Forbidden", "nodes is forbidden")
    await audit.run_if_due(api, indices.nodes, indices.pods, fleet, 5.0)
    assert free_gpus(fleet, indices, 5.0) == {"n1": 8}, "a refused LIST proves nothing"
    del api.refuse[("list", "Node")]
    audit.paused()
    await audit.run_if_due(api, indices.nodes, indices.pods, fleet, 6.0)
    assert free_gpus(fleet, indices, 6.0) == {}
