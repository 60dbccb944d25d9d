"""Node label sets exactly as AMD's node labeller writes them, and NodeGpus built from them.

Homogeneous node: `amd.com/gpu.<kind>=<v>`, `beta.amd.com/gpu.<kind>=<v>` and `beta.amd.com/gpu.<kind>.<v>=<n>`.
Node whose GPUs differ: only `amd.com/gpu.<kind>.<v>=<n>`; the plain keys are missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specdec_operator.gpu.inventory import NodeGpus, node_gpus

DRIVER_VERSION = "6.12.12"
PLAIN_PARTITION_LABEL = "amd.com/gpu.compute-memory-partition"  # what the labeller's code writes
DOCS_PARTITION_LABEL = "amd.com/compute-memory-partition"  # what AMD's docs and cleanup use


@dataclass(frozen=True)
class Card:
    """One GPU model as the labeller describes it."""

    device_id: str
    product_name: str
    vram: str
    family: str
    cu_count: int
    simd_count: int

    def kinds(self) -> dict[str, str]:
        return {
            "family": self.family,
            "device-id": self.device_id,
            "product-name": self.product_name,
            "vram": self.vram,
            "cu-count": str(self.cu_count),
            "simd-count": str(self.simd_count),
        }


MI300X = Card("74a1", "AMD_Instinct_MI300X_OAM", "192G", "AI", 304, 1216)
MI325X = Card("74a5", "AMD_Instinct_MI325X_OAM", "256G", "AI", 304, 1216)
MI355X = Card("75a3", "AMD_Instinct_MI355X_OAM", "288G", "AI", 256, 1024)
MI250X = Card("7408", "AMD_Instinct_MI250X_MI250", "64G", "AI", 110, 440)  # one GCD, as the device plugin counts
MI100 = Card("738c", "AMD_Instinct_MI100", "32G", "AI", 120, 480)
W7900 = Card("7448", "AMD_Radeon_PRO_W7900", "48G", "GC_11_0_0", 96, 192)
W7800 = Card("745e", "AMD_Radeon_PRO_W7800", "32G", "GC_11_0_0", 70, 140)
RX7800XT = Card("747e", "AMD_Radeon_RX_7800_XT", "16G", "GC_11_0_0", 60, 120)
R9700 = Card("7551", "AMD_Radeon_AI_PRO_R9700", "32G", "GC_12_0_0", 64, 128)
UNLISTED = Card("7ffe", "AMD_Unreleased_Accelerator", "192G", "AI", 304, 1216)  # a device id our table lacks


def homogeneous_labels(
    card: Card,
    count: int,
    partition: str | None = None,
    partition_label: str = PLAIN_PARTITION_LABEL,
    prefixes: Sequence[str] = ("amd.com", "beta.amd.com"),
) -> dict[str, str]:
    labels = {"feature.node.kubernetes.io/amd-gpu": "true", "amd.com/gpu.driver-version": DRIVER_VERSION}
    for kind, value in card.kinds().items():
        for prefix in prefixes:
            labels[f"{prefix}/gpu.{kind}"] = value
        if "beta.amd.com" in prefixes:
            labels[f"beta.amd.com/gpu.{kind}.{value}"] = str(count)
    if partition is not None:
        labels[partition_label] = partition
        labels["amd.com/gpu.compute-partitioning-supported"] = "true"
        labels["amd.com/gpu.memory-partitioning-supported"] = "true"
    return labels


def mixed_labels(cards: Sequence[tuple[Card, int]]) -> dict[str, str]:
    labels = {"feature.node.kubernetes.io/amd-gpu": "true", "amd.com/gpu.driver-version": DRIVER_VERSION}
    totals: dict[str, int] = {}
    for card, count in cards:
        for kind, value in card.kinds().items():
            key = f"amd.com/gpu.{kind}.{value}"
            totals[key] = totals.get(key, 0) + count
    labels.update({key: str(total) for key, total in totals.items()})
    return labels


def base_labels(name: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}


def node(
    name: str,
    gpu_labels: Mapping[str, str],
    gpus: int,
    taints: Sequence[Mapping[str, str]] = (),
    cordoned: bool = False,
    extra_labels: Mapping[str, str] | None = None,
) -> NodeGpus:
    allocatable = {"cpu": "192", "memory": "1536Gi", "pods": "110"}
    if gpus:
        allocatable["amd.com/gpu"] = str(gpus)
    labels = {**base_labels(name), **gpu_labels, **(extra_labels or {})}
    return node_gpus(name, labels, allocatable, taints, cordoned)


def homogeneous_node(
    name: str,
    card: Card,
    count: int,
    partition: str | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    cordoned: bool = False,
    extra_labels: Mapping[str, str] | None = None,
) -> NodeGpus:
    """A node of `count` alike GPUs; a partitioned MI300-class node allocates 8 units per GPU in CPX mode."""
    units = {"spx": 1, "dpx": 2, "qpx": 4, "cpx": 8}[partition.split("_")[0]] if partition else 1
    return node(name, homogeneous_labels(card, count, partition), count * units, taints, cordoned, extra_labels)


def mixed_node(name: str, cards: Sequence[tuple[Card, int]]) -> NodeGpus:
    return node(name, mixed_labels(cards), sum(count for _, count in cards))


def cpu_node(name: str) -> NodeGpus:
    return node(name, {}, 0)


UNHEALTHY = {"key": "amd-gpu-unhealthy", "value": "ecc-errors", "effect": "NoSchedule"}
DRIVER_UPGRADE = {"key": "amd-gpu-driver-upgrade", "value": "true", "effect": "NoSchedule"}
DCM = {"key": "amd-dcm", "value": "up", "effect": "NoExecute"}
DEDICATED = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}


def demo_fleet() -> list[NodeGpus]:
    """The demo fleet of hack/fleets/demo.yaml, plus a mixed node whose GPUs differ in gfx target."""
    return [
        *(homogeneous_node(f"mi300x-{i}", MI300X, 8, partition="spx_nps1") for i in range(4)),
        *(homogeneous_node(f"mi250x-{i}", MI250X, 8) for i in range(2)),
        *(homogeneous_node(f"w7900-{i}", W7900, 4) for i in range(2)),
        cpu_node("cpu-0"),
        mixed_node("mixed-gfx942", [(MI300X, 4), (MI325X, 4)]),
        mixed_node("mixed-rdna3", [(W7900, 2), (RX7800XT, 2)]),
        homogeneous_node("unhealthy-0", MI300X, 8, partition="spx_nps1", taints=[UNHEALTHY]),
    ]
