"""A simulated AMD fleet as data: node groups in YAML become KWOK-managed Node objects.

Labels follow AMD's node labeller: a node whose GPUs are all alike gets plain keys under both prefixes
(`amd.com/gpu.device-id=74a1`, `beta.amd.com/gpu.device-id=74a1`) plus beta per-value counts; a node with
different GPUs gets only `amd.com/gpu.<kind>.<value>=<count>` keys.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localcluster.errors import ClusterError

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
DRIVER_VERSION = "6.12.12"
FLEETS_DIR = Path(__file__).resolve().parent.parent / "fleets"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class GpuModel(_Model):
    device_id: str = Field(alias="deviceId", pattern=r"^[0-9a-f]{4}$")
    product_name: str = Field(alias="productName")
    vram: str
    family: str
    cu_count: int = Field(alias="cuCount")
    simd_count: int = Field(alias="simdCount")


class GpuSlot(_Model):
    model: str
    count: int = Field(ge=1)


class Taint(_Model):
    key: str
    value: str = ""
    effect: str


class NodeGroup(_Model):
    prefix: str
    count: int = Field(ge=1)
    gpus: list[GpuSlot] = Field(default_factory=list)
    partition: str | None = None
    taints: list[Taint] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    # Host cores and memory of an 8-GPU MI300X/MI325X server (2 x 96-core EPYC, 2 TiB): runtime pods request cpu
    # and memory for what they load, so a smaller node type (workstation cards, MI250X blades) sets its own.
    cpu: str = "192"
    memory: str = "2048Gi"


class Fleet(_Model):
    gpu_models: dict[str, GpuModel] = Field(alias="gpuModels", default_factory=dict)
    node_groups: list[NodeGroup] = Field(alias="nodeGroups")


def load_fleet(path: Path) -> Fleet:
    try:
        data = yaml.safe_load(path.read_text())
        fleet = Fleet.model_validate(data)
    except (OSError, yaml.YAMLError) as error:
        raise ClusterError(f"cannot read fleet file {path}: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ClusterError(f"invalid fleet file {path}: {where}: {first['msg']}") from None
    for group in fleet.node_groups:
        for slot in group.gpus:
            if slot.model not in fleet.gpu_models:
                raise ClusterError(f"invalid fleet file {path}: node group {group.prefix} names unknown gpu model "
                                   f"{slot.model!r} (known: {', '.join(sorted(fleet.gpu_models))})")
    return fleet


def _gpu_labels(gpus: list[tuple[GpuModel, int]], partition: str | None) -> dict[str, str]:
    if not gpus:
        return {}
    kinds: dict[str, Counter[str]] = {kind: Counter() for kind in
                                      ("family", "device-id", "product-name", "vram", "cu-count", "simd-count")}
    for model, count in gpus:
        kinds["family"][model.family] += count
        kinds["device-id"][model.device_id] += count
        kinds["product-name"][model.product_name] += count
        kinds["vram"][model.vram] += count
        kinds["cu-count"][str(model.cu_count)] += count
        kinds["simd-count"][str(model.simd_count)] += count
    labels = {"feature.node.kubernetes.io/amd-gpu": "true", "amd.com/gpu.driver-version": DRIVER_VERSION}
    homogeneous = len(gpus) == 1
    for kind, values in kinds.items():
        for value, count in values.items():
            if homogeneous:
                labels[f"amd.com/gpu.{kind}"] = value
                labels[f"beta.amd.com/gpu.{kind}"] = value
                labels[f"beta.amd.com/gpu.{kind}.{value}"] = str(count)
            else:
                labels[f"amd.com/gpu.{kind}.{value}"] = str(count)
    if partition:
        labels["amd.com/gpu.compute-memory-partition"] = partition
        labels["amd.com/gpu.compute-partitioning-supported"] = "true"
        labels["amd.com/gpu.memory-partitioning-supported"] = "true"
    return labels


def node_objects(fleet: Fleet, pod_octet: int = 0) -> list[dict[str, Any]]:
    """Fake Node objects; node N hands out pod IPs from 127.<pod_octet>.N.0/24 (see cluster.pod_network_octet)."""
    nodes: list[dict[str, Any]] = []
    for group in fleet.node_groups:
        for index in range(group.count):
            cidr_octet = len(nodes) + 1
            if cidr_octet > 254:
                raise ClusterError("fleet has more than 254 nodes: loopback podCIDRs 127.X.N.0/24 run out")
            name = f"{group.prefix}-{index}"
            gpus = [(fleet.gpu_models[slot.model], slot.count) for slot in group.gpus]
            gpu_count = sum(count for _, count in gpus)
            capacity = {"cpu": group.cpu, "memory": group.memory, "pods": "110", "ephemeral-storage": "1Ti"}
            if gpu_count:
                capacity["amd.com/gpu"] = str(gpu_count)
            nodes.append({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        **_gpu_labels(gpus, group.partition),
                        **group.labels,
                    },
                },
                "spec": {
                    # Every pod IP kwok hands out on this node is a loopback address.
                    "podCIDR": f"127.{pod_octet}.{cidr_octet}.0/24",
                    "podCIDRs": [f"127.{pod_octet}.{cidr_octet}.0/24"],
                    "taints": [taint.model_dump() for taint in group.taints],
                },
                "status": {"capacity": capacity, "allocatable": dict(capacity)},
            })
    return nodes
