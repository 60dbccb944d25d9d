"""Node labels, capacity and taints -> what GPUs a node offers, per gfx target.

Two label shapes exist: a homogeneous node has plain keys (`amd.com/gpu.device-id=74a1`) and a node
whose GPUs differ has only per-value keys (`amd.com/gpu.device-id.74a1=4`). The partition mode has two
spellings in the wild (`amd.com/gpu.compute-memory-partition` in code, `amd.com/compute-memory-partition`
in docs), so both are read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec_operator.gpu.devices import DEVICES_BY_ID, PARTITIONS_PER_GPU, parse_vram_gib

GPU_RESOURCE = "amd.com/gpu"
PREFIXES = ("amd.com/gpu.", "beta.amd.com/gpu.")
PARTITION_LABELS = ("amd.com/gpu.compute-memory-partition", "amd.com/compute-memory-partition")
# Transient taints the AMD GPU operator sets; a node carrying one must never get runtime pods.
AMD_TRANSIENT_TAINTS = ("amd-gpu-unhealthy", "amd-gpu-driver-upgrade", "amd-dcm")


@dataclass(frozen=True)
class GpuGroup:
    """Alike GPUs on one node."""

    device_id: str
    product: str
    gfx: str
    vram_gib: float
    count: int


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeGpus:
    """What one node offers for GPU pods."""

    name: str
    groups: tuple[GpuGroup, ...]
    allocatable_gpus: int
    partition: str | None
    taints: tuple[Taint, ...] = field(default=())
    cordoned: bool = False
    unknown_device_ids: tuple[str, ...] = field(default=())
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def gfx_targets(self) -> frozenset[str]:
        return frozenset(group.gfx for group in self.groups)

    @property
    def gfx(self) -> str | None:
        """The node's single gfx target, or None when it has none or several (amd.com/gpu can't pin one)."""
        targets = self.gfx_targets
        return next(iter(targets)) if len(targets) == 1 and not self.unknown_device_ids else None

    @property
    def vram_gib_per_gpu(self) -> float:
        """Smallest memory of any GPU the device plugin might hand out, per allocatable unit."""
        if not self.groups:
            return 0.0
        smallest = min(group.vram_gib for group in self.groups)
        return smallest / self._partitions_per_gpu()

    def _partitions_per_gpu(self) -> int:
        if not self.partition:
            return 1
        return PARTITIONS_PER_GPU.get(self.partition.split("_", 1)[0], 1)


def _device_counts(labels: Mapping[str, str]) -> dict[str, int]:
    """device-id -> GPU count, from plain keys (homogeneous node) or per-value keys (mixed node)."""
    counts: dict[str, int] = {}
    for prefix in PREFIXES:
        per_value = f"{prefix}device-id."
        for key, value in labels.items():
            if key.startswith(per_value):
                try:
                    counts.setdefault(key.removeprefix(per_value).lower(), int(value))
                except ValueError:
                    continue
    if counts:
        return counts
    for prefix in PREFIXES:
        plain = labels.get(f"{prefix}device-id")
        if plain:
            return {plain.lower().removeprefix("0x"): 0}  # count filled from capacity by the caller
    return {}


def _vram_from_labels(labels: Mapping[str, str]) -> float | None:
    for prefix in PREFIXES:
        value = labels.get(f"{prefix}vram")
        if value:
            return parse_vram_gib(value)
    return None


def node_gpus(
    name: str,
    labels: Mapping[str, str],
    allocatable: Mapping[str, str],
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
) -> NodeGpus:
    """Derive a node's GPUs. Unknown device ids are kept aside so the node is never guessed into a pool."""
    try:
        allocatable_gpus = int(allocatable.get(GPU_RESOURCE, "0"))
    except ValueError:
        allocatable_gpus = 0
    counts = _device_counts(labels)
    if len(counts) == 1 and next(iter(counts.values())) == 0:
        counts = {next(iter(counts)): allocatable_gpus}
    label_vram = _vram_from_labels(labels)
    groups, unknown = [], []
    for device_id, count in sorted(counts.items()):
        device = DEVICES_BY_ID.get(device_id)
        if device is None:
            unknown.append(device_id)
            continue
        # The table wins; a homogeneous node's vram label breaks ties such as W7800 32G vs 48G.
        vram = label_vram if (label_vram and len(counts) == 1) else device.vram_gib
        groups.append(GpuGroup(device_id, device.product, device.gfx, vram, count))
    partition = next((labels[key] for key in PARTITION_LABELS if labels.get(key)), None)
    return NodeGpus(
        name=name,
        groups=tuple(groups),
        allocatable_gpus=allocatable_gpus,
        partition=partition,
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", ""))) for t in taints
        ),
        cordoned=unschedulable,
        unknown_device_ids=tuple(unknown),
        labels=dict(labels),
    )


TERMINAL_POD_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodGpus:
    """One pod's claim on GPUs as the scheduler counts it.

    `node` is None while the pod is not bound (Pending); the scheduler then holds no GPU for it.
    `model_key` is `namespace/model-label` for our runtime pods (None for any other workload), so a
    model's own pods are not counted as competitors of itself. `unschedulable` is the scheduler's
    message (PodScheduled=False, reason Unschedulable) and `pending_since` when it was set.
    """

    namespace: str
    name: str
    gpus: int
    node: str | None
    model_key: str | None = None
    pool: str | None = None
    unschedulable: str | None = None
    pending_since: str | None = None


def _gpu_quantity(resources: Mapping[str, Any]) -> int:
    """amd.com/gpu of one container; an extended resource's request defaults to its limit."""
    for part in ("requests", "limits"):
        value = (resources.get(part) or {}).get(GPU_RESOURCE)
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def requested_gpus(pod_spec: Mapping[str, Any]) -> int:
    """The scheduler's effective request: the larger of the containers' sum and any single init container."""
    containers = sum(_gpu_quantity(c.get("resources") or {}) for c in pod_spec.get("containers") or [])
    inits = [_gpu_quantity(c.get("resources") or {}) for c in pod_spec.get("initContainers") or []]
    return max([containers, *inits])


def pod_gpus(
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    pod_spec: Mapping[str, Any],
    pod_status: Mapping[str, Any],
    model_label: str,
    managed_by: tuple[str, str],
    pool_label: str,
) -> PodGpus | None:
    """What a pod holds or waits for, or None when it neither holds nor wants a GPU (finished pods hold none)."""
    gpus = requested_gpus(pod_spec)
    if gpus <= 0 or pod_status.get("phase") in TERMINAL_POD_PHASES:
        return None
    ours = labels.get(managed_by[0]) == managed_by[1] and labels.get(model_label)
    unschedulable = since = None
    for condition in pod_status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            unschedulable = str(condition.get("message") or condition.get("reason") or "not scheduled")
            since = condition.get("lastTransitionTime")
    return PodGpus(
        namespace=namespace,
        name=name,
        gpus=gpus,
        node=pod_spec.get("nodeName") or None,
        model_key=f"{namespace}/{labels[model_label]}" if ours else None,
        pool=labels.get(pool_label) if ours else None,
        unschedulable=unschedulable,
        pending_since=str(since) if since else None,
    )
