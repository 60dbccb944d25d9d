"""Discovery that adapts (issue 32): nodes labelled only `beta.amd.com/...`, and nodes whose device id only the
installation's device table knows, get pods that the scheduler binds to them (local cluster)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterator

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import apply_nodes, mi300x_nodes, pinned_model
from tests.e2e.operator_process import OperatorFactory, OperatorProcess

CUSTOM_DEVICE_ID = "7fff"  # a device id the built-in table lacks, as a new SR-IOV virtual function would be


@pytest.fixture
def own_nodes(cluster: LocalCluster, namespace: str) -> Iterator[Callable[[str, Callable[[dict[str, str]],
                                                                                          dict[str, str]]], list[str]]]:
    """Adds one MI300X test node whose labels `relabel` rewrites; removed afterwards."""
    added: list[str] = []

    def add(prefix: str, relabel: Callable[[dict[str, str]], dict[str, str]]) -> list[str]:
        nodes = mi300x_nodes(namespace, f"{prefix}{zlib.crc32(namespace.encode()) % 100000}", 1)
        for node in nodes:
            node["metadata"]["labels"] = relabel(dict(node["metadata"]["labels"]))
        added.extend(apply_nodes(cluster, nodes))
        return [node["metadata"]["name"] for node in nodes]

    yield add
    for name in added:
        cluster.kubectl("delete", "node", name, "--wait=true", "--timeout=60s", check=False)


def beta_only(labels: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in labels.items() if not key.startswith("amd.com/")}


def custom_device(labels: dict[str, str]) -> dict[str, str]:
    return {key.replace("74a1", CUSTOM_DEVICE_ID): value.replace("74a1", CUSTOM_DEVICE_ID)
            for key, value in labels.items()}


def bound_pods(kube: Kube, model: str) -> list[tuple[str, str]]:
    """(pod, node) of the model's pods the scheduler has bound."""
    pods = kube.items("pod", f"specdec.io/model={model}")
    return [(p["metadata"]["name"], p["spec"].get("nodeName", "")) for p in pods
            if any(c["type"] == "PodScheduled" and c["status"] == "True"
                   for c in p.get("status", {}).get("conditions", []))]


def _placed_and_bound(kube: Kube, model: str, nodes: list[str]) -> None:
    wait_for(f"{model}'s pod bound to {nodes}", lambda: any(node in nodes for _, node in bound_pods(kube, model)),
             120, describe=lambda: ((kube.get("sm", model) or {}).get("status", {}).get("conditions"),
                                    kube.items("pod", f"specdec.io/model={model}")[-1:]))
    pools = (kube.get("sm", model) or {})["status"]["pools"]
    assert [p["gfxTarget"] for p in pools] == ["gfx942"] and pools[0]["nodeNames"] == nodes, pools


def test_nodes_labelled_only_with_beta_prefix_get_pods_that_schedule(
    kube: Kube, operator: OperatorProcess, own_nodes: Callable[..., list[str]]
) -> None:
    nodes = own_nodes("beta", beta_only)
    labels = kube.get("node", nodes[0])["metadata"]["labels"]
    assert "amd.com/gpu.device-id" not in labels and labels["beta.amd.com/gpu.device-id"] == "74a1"
    body = pinned_model("beta-only", str(kube.namespace))
    body["spec"]["placement"]["gfxTargets"] = ["mi300x"]  # a product alias, shown back in status
    kube.apply(body)
    _placed_and_bound(kube, "beta-only", nodes)
    pool = kube.get("sm", "beta-only")["status"]["pools"][0]
    assert pool["requestedAs"] == ["mi300x"] and pool["products"] == ["MI300X"], pool


def test_a_device_id_added_through_the_setting_gets_pods_that_schedule(
    kube: Kube, scoped_operator: OperatorFactory, own_nodes: Callable[..., list[str]]
) -> None:
    nodes = own_nodes("vf", custom_device)
    assert kube.get("node", nodes[0])["metadata"]["labels"]["amd.com/gpu.device-id"] == CUSTOM_DEVICE_ID
    # What the chart renders from `gpuDevices` (tests/unit/shipping/test_chart_render.py checks the rendering).
    entry = {"deviceId": CUSTOM_DEVICE_ID, "product": "MI300X VF (site)", "gfx": "gfx942", "vramGib": 192}
    scoped_operator(SPECDEC_GPU_DEVICES=json.dumps([entry]))
    kube.apply(pinned_model("custom-vf", str(kube.namespace)))
    _placed_and_bound(kube, "custom-vf", nodes)
    assert kube.get("sm", "custom-vf")["status"]["pools"][0]["products"] == ["MI300X VF (site)"]
