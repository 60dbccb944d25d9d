"""Kwok GPU nodes a test adds for itself (labelled for its namespace, so only its models select them)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from localcluster.cluster import LocalCluster, pod_network_octet
from localcluster.fleet import Fleet, node_objects
from tests.e2e.kube import reader, wait_for
from tests.e2e.lanes import MAX_TEST_NODES, first_test_network

FLEET_LABEL = "specdec.io/e2e-fleet"
MI300X = {"deviceId": "74a1", "productName": "AMD_Instinct_MI300X_OAM", "vram": "192G", "family": "AI",
          "cuCount": 304, "simdCount": 1216}


def toleration_for_test_nodes(namespace: str) -> dict[str, str]:
    """What a model needs to be placed on the nodes a test in `namespace` adds."""
    return {"key": FLEET_LABEL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}


def mi300x_nodes(namespace: str, prefix: str, count: int) -> list[dict[str, Any]]:
    """`count` 8-GPU MI300X Node objects, with loopback pod CIDRs 127.X.N.0/24 of their own (tests/e2e/lanes.py:
    clear of the demo fleet's nodes and of other lanes' test nodes). They are labelled for the test's models to
    select and tainted so that no other model does: a model of another lane that places on every gfx942 node
    (the shipped examples) would otherwise see them come and go with this test."""
    assert count <= MAX_TEST_NODES, f"a test adds at most {MAX_TEST_NODES} nodes (tests/e2e/lanes.py)"
    first = first_test_network(namespace)
    fleet = Fleet.model_validate({"gpuModels": {"mi300x": MI300X}, "nodeGroups": [{
        "prefix": prefix, "count": count, "gpus": [{"model": "mi300x", "count": 8}], "partition": "spx_nps1",
        "labels": {FLEET_LABEL: namespace},
        "taints": [{"key": FLEET_LABEL, "value": namespace, "effect": "NoSchedule"}]}]})
    nodes = node_objects(fleet, pod_network_octet())
    for index, node in enumerate(nodes):
        cidr = f"127.{pod_network_octet()}.{first + index}.0/24"
        node["spec"]["podCIDR"], node["spec"]["podCIDRs"] = cidr, [cidr]
    return nodes


def apply_nodes(cluster: LocalCluster, nodes: list[dict[str, Any]]) -> list[str]:
    cluster.kubectl("apply", "--server-side", "-f", "-",
                    input_text=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    names = [node["metadata"]["name"] for node in nodes]
    def ready(name: str) -> bool:
        node = reader(cluster).get("node", name, None, None)
        return node is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in node.get("status", {}).get("conditions", []))

    wait_for("test nodes Ready", lambda: all(ready(name) for name in names), 60)
    return names


@pytest.fixture
def test_nodes(cluster: LocalCluster, namespace: str) -> Iterator[Callable[[str, int], list[dict[str, Any]]]]:
    """Adds `count` MI300X nodes named after `prefix` that only this test's models select; removed afterwards.
    Returns the Node objects as applied (a test that deletes them re-creates them from these)."""
    added: list[str] = []

    def add(prefix: str, count: int) -> list[dict[str, Any]]:
        nodes = mi300x_nodes(namespace, f"{prefix}{zlib.crc32(namespace.encode()) % 100000}", count)
        added.extend(apply_nodes(cluster, nodes))
        return nodes

    yield add
    for name in added:
        cluster.kubectl("delete", "node", name, "--wait=true", "--timeout=60s", check=False)


def pinned_model(name: str, namespace: str, replicas: int = 1, **runtime: Any) -> dict[str, Any]:
    """An 8B model, TP 8, on this test's nodes only, autotune off (K stays what the operator decided)."""
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "tensorParallelSize": 8},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            "speculation": {"initialK": 3, "minK": 1, "maxK": 8, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": replicas,
                          "nodeSelector": {FLEET_LABEL: namespace},
                          "tolerations": [toleration_for_test_nodes(namespace)]},
            "runtime": {"simulatorProfile": "quick", **runtime},
        },
    }


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), None)
