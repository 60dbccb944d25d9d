"""Node labels, capacity and taints -> what GPUs a node offers, per gfx target.

Two label shapes exist: a homogeneous node has plain keys (`amd.com/gpu.device-id=74a1`) and a node
whose GPUs differ has only per-value keys (`amd.com/gpu.device-id.74a1=4`). The partition mode has two
spellings in the wild (`amd.com/gpu.compute-memory-partition` in code, `amd.com/compute-memory-partition`
in docs), so both are read. The node labeller writes `amd.com/...` and `beta.amd.com/...` keys; a node carrying
only one of them is read the same way (render/affinity.py matches both, so pods land where capacity is counted).

The device plugin names its resource `amd.com/gpu` (strategy `single`) or, with strategy `mixed` on a
partitioned node, `amd.com/<compute>_<memory>` (e.g. `amd.com/cpx_nps4`; ROCm/k8s-device-plugin
internal/pkg/amdgpu/amdgpu.go counts partitions as `computePartition + "_" + memoryPartition`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec_operator.gpu.devices import BUILTIN_DEVICES, PARTITIONS_PER_GPU, DeviceTable, parse_vram_gib

GPU_RESOURCE = "amd.com/gpu"
# Resource names of the device plugin's `mixed` strategy: one per compute/memory partition mode.
PARTITION_RESOURCE = re.compile(r"^amd\.com/((?:spx|dpx|qpx|cpx)_nps[1248])$")
PREFIXES = ("amd.com/gpu.", "beta.amd.com/gpu.")  # plain keys are read in this order
MIXED_PREFIX = PREFIXES[0]  # the labeller writes a mixed node's per-value keys under amd.com/ only
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
    allocatable_gpus: int  # units of `gpu_resource` the node allocates
    partition: str | None
    gpu_resource: str = GPU_RESOURCE  # the extended resource a pod requests to get this node's GPUs
    taints: tuple[Taint, ...] = field(default=())
    cordoned: bool = False
    unknown_device_ids: tuple[str, ...] = field(default=())
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)
    uid: str = field(default="", compare=False)  # the Node object's: a LIST proves a node gone by it

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
    """device-id -> GPU count, from `amd.com/` per-value keys (mixed node) or else the first plain key found
    (`amd.com/`, then `beta.amd.com/`). render/affinity.py matches nodes in exactly this order."""
    counts: dict[str, int] = {}
    per_value = f"{MIXED_PREFIX}device-id."
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
            device_id = plain.lower().removeprefix("0x")
            # A homogeneous node's beta.amd.com/gpu.device-id.<id>=<n> counts physical GPUs; without it the caller
            # fills the count from capacity.
            try:
                return {device_id: int(labels.get(f"{PREFIXES[1]}device-id.{device_id}", "0"))}
            except ValueError:
                return {device_id: 0}
    return {}


def _vram_from_labels(labels: Mapping[str, str]) -> float | None:
    for prefix in PREFIXES:
        value = labels.get(f"{prefix}vram")
        if value:
            return parse_vram_gib(value)
    return None


def _count(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def gpu_resource_of(allocatable: Mapping[str, str]) -> tuple[str, int]:
    """(resource name, units): `amd.com/gpu` when the node allocates any, else the partition resource with most
    units (a node whose GPUs sit in different partition modes offers several; a pod can request only one)."""
    gpus = _count(allocatable.get(GPU_RESOURCE, "0"))
    if gpus > 0:
        return GPU_RESOURCE, gpus
    partitioned = sorted((-_count(v), k) for k, v in allocatable.items() if PARTITION_RESOURCE.match(k))
    if partitioned and partitioned[0][0] < 0:
        return partitioned[0][1], -partitioned[0][0]
    return GPU_RESOURCE, 0


def is_gpu_resource(name: str) -> bool:
    return name == GPU_RESOURCE or PARTITION_RESOURCE.match(name) is not None


def node_gpus(
    name: str,
    labels: Mapping[str, str],
    allocatable: Mapping[str, str],
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    devices: DeviceTable = BUILTIN_DEVICES,
) -> NodeGpus:
    """Derive a node's GPUs. Unknown device ids are kept aside so the node is never guessed into a pool."""
    resource, allocatable_gpus = gpu_resource_of(allocatable)
    counts = _device_counts(labels)
    if len(counts) == 1 and next(iter(counts.values())) == 0:
        counts = {next(iter(counts)): allocatable_gpus}
    label_vram = _vram_from_labels(labels)
    groups, unknown = [], []
    for device_id, count in sorted(counts.items()):
        device = devices.get(device_id)
        if device is None:
            unknown.append(device_id)
            continue
        # The table wins; a homogeneous node's vram label breaks ties such as W7800 32G vs 48G.
        vram = label_vram if (label_vram and len(counts) == 1) else device.vram_gib
        groups.append(GpuGroup(device_id, device.product, device.gfx, vram, count))
    partition = next((labels[key] for key in PARTITION_LABELS if labels.get(key)), None)
    by_resource = PARTITION_RESOURCE.match(resource)
    if by_resource is not None:
        partition = by_resource.group(1)  # the resource itself says which partition a pod gets
    return NodeGpus(
        name=name,
        groups=tuple(groups),
        allocatable_gpus=allocatable_gpus,
        partition=partition,
        gpu_resource=resource,
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
    uid: str = field(default="", compare=False)  # the Pod object's: a LIST proves a pod gone by it


def _gpu_quantity(resources: Mapping[str, Any]) -> int:
    """GPUs (amd.com/gpu or partitions) of one container; an extended resource's request defaults to its limit."""
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    names = {name for name in [*requests, *limits] if is_gpu_resource(str(name))}
    return sum(_count(requests[name] if name in requests else limits[name]) for name in names)


def requested_gpus(pod_spec: Mapping[str, Any]) -> int:
    """The scheduler's effective request: the larger of the containers' sum and any single init container."""
    containers = sum(_gpu_quantity(c.get("resources") or {}) for c in pod_spec.get("containers") or [])
    inits = [_gpu_quantity(c.get("resources") or {}) for c in pod_spec.get("initContainers") or []]
    return max([containers, *inits])


@dataclass(frozen=True)
class RuntimePodLabels:
    """The labels that mark a runtime pod of ours and name its model and pool (the runtime's pod contract)."""

    managed_by: tuple[str, str]  # the key, and the value our pods carry under it
    model: str
    pool: str


def pod_gpus(
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    pod_spec: Mapping[str, Any],
    pod_status: Mapping[str, Any],
    runtime_labels: RuntimePodLabels,
) -> PodGpus | None:
    """What a pod holds or waits for, or None when it neither holds nor wants a GPU (finished pods hold none)."""
    gpus = requested_gpus(pod_spec)
    if gpus <= 0 or pod_status.get("phase") in TERMINAL_POD_PHASES:
        return None
    managed_by_key, managed_by_value = runtime_labels.managed_by
    model_label = runtime_labels.model
    ours = labels.get(managed_by_key) == managed_by_value and labels.get(model_label)
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
        pool=labels.get(runtime_labels.pool) if ours else None,
        unschedulable=unschedulable,
        pending_since=str(since) if since else None,
    )
