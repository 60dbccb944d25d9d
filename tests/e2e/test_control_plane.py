"""Smoke tests of the local control plane and the simulated AMD fleet."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.kube import Kube, wait_for

pytestmark = pytest.mark.e2e

# MI300A, MI300X and MI325X are gfx942 (device ids 74a0, 74a1, 74a5).
GFX942_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "amd.com/gpu.device-id", "operator": "In", "values": ["74a0", "74a1", "74a5"]}
            ]}]
        }
    }
}


def _deployment(name: str, replicas: int, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": GFX942_AFFINITY,
                    "containers": [{"name": "c", "image": "example.invalid/fake:1",
                                    "resources": {"limits": {"amd.com/gpu": str(gpus)}}}],
                },
            },
        },
    }


def test_gfx942_pods_run_on_mi300x_only_with_loopback_ips(kube: Kube) -> None:
    kube.apply(_deployment("gfx942", replicas=4, gpus=1))

    def running() -> list[dict[str, Any]] | None:
        pods = kube.items("pods", "app=gfx942")
        ok = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return ok if len(ok) == 4 else None

    pods = wait_for("4 Running gfx942 pods", running, 60)
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("mi300x-"), pod["spec"]["nodeName"]
        assert ipaddress.ip_address(pod["status"]["podIP"]).is_loopback


def test_unsatisfiable_gpu_request_stays_pending_with_failed_scheduling(kube: Kube) -> None:
    kube.apply(_deployment("too-big", replicas=1, gpus=9))

    def failed_scheduling() -> dict[str, Any] | None:
        return next((e for e in kube.events() if e["reason"] == "FailedScheduling"), None)

    event = wait_for("a FailedScheduling event", failed_scheduling, 60)
    assert "Insufficient amd.com/gpu" in event["message"]
    (pod,) = kube.items("pods", "app=too-big")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_deleting_a_namespace_deletes_its_pods(cluster: LocalCluster, kube: Kube, namespace: str) -> None:
    kube.apply(_deployment("doomed", replicas=2, gpus=1))
    wait_for("2 pods", lambda: len(kube.items("pods", "app=doomed")) == 2, 60)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    wait_for(
        f"namespace {namespace} gone",
        lambda: cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", check=False).strip() == "",
        240,  # a bound: the namespace controller works through every lane's deleted namespaces in turn
    )
    assert cluster.kubectl("get", "pods", "-A", "-l", "app=doomed", "-o", "name").strip() == ""


def test_every_pod_and_node_address_is_loopback(cluster: LocalCluster) -> None:
    kube = Kube(cluster)
    offenders = []
    for node in kube.items("nodes"):
        for address in node["status"].get("addresses", []):
            if address["type"] == "InternalIP" and not ipaddress.ip_address(address["address"]).is_loopback:
                offenders.append(f"node {node['metadata']['name']} {address['address']}")
        cidr = node["spec"].get("podCIDR")
        if cidr and not ipaddress.ip_network(cidr).subnet_of(ipaddress.ip_network("127.0.0.0/8")):
            offenders.append(f"node {node['metadata']['name']} podCIDR {cidr}")
    pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json"))["items"]
    for pod in pods:
        for field in ("podIP", "hostIP"):
            value = pod["status"].get(field)
            if value and not ipaddress.ip_address(value).is_loopback:
                offenders.append(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} {field} {value}")
    assert offenders == []


def test_tainted_and_cpu_nodes_carry_what_the_fleet_says(cluster: LocalCluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in Kube(cluster).items("nodes")}
    unhealthy = {"key": "amd-gpu-unhealthy", "value": "ecc-errors", "effect": "NoSchedule"}
    assert unhealthy in nodes["unhealthy-0"]["spec"]["taints"]
    assert "amd.com/gpu" not in nodes["cpu-0"]["status"]["capacity"]
    mixed = nodes["mixed-0"]["metadata"]["labels"]
    assert mixed["amd.com/gpu.device-id.74a1"] == "4"
    assert "amd.com/gpu.device-id" not in mixed
    assert nodes["mi300x-0"]["metadata"]["labels"]["amd.com/gpu.device-id"] == "74a1"
