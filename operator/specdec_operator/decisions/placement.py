"""Which pools a SpeculativeModel gets: one per allowed gfx target with eligible nodes and enough memory."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from specdec_operator.api.spec import SpeculativeModelSpec, Toleration
from specdec_operator.decisions.drafter import DrafterDecision, MemoryBudget, choose_drafter
from specdec_operator.decisions.weights import WeightsEstimate, target_weights
from specdec_operator.gpu.inventory import AMD_TRANSIENT_TAINTS, NodeGpus, Taint

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class PoolPlan:
    gfx: str
    nodes: tuple[str, ...]
    slots: int  # replicas the eligible nodes can hold at this TP
    replicas: int
    vram_gib_per_gpu: float
    drafter: DrafterDecision
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SkippedTarget:
    gfx: str
    reason: str  # NoCompatibleNodes | InsufficientMemory | NoReplicas
    message: str


@dataclass(frozen=True)
class PlacementPlan:
    pools: tuple[PoolPlan, ...]
    skipped: tuple[SkippedTarget, ...]
    target_weights: WeightsEstimate | None
    problems: tuple[str, ...] = field(default=())


def tolerates(taint: Taint, tolerations: Sequence[Toleration]) -> bool:
    if taint.key in AMD_TRANSIENT_TAINTS:
        return False  # a sick or upgrading GPU node is never a place for inference
    for toleration in tolerations:
        if toleration.effect and toleration.effect != taint.effect:
            continue
        if toleration.operator == "Exists" and (not toleration.key or toleration.key == taint.key):
            return True
        if toleration.key == taint.key and (toleration.value or "") == taint.value:
            return True
    return False


def label_mismatch(node: NodeGpus, gfx: str, spec: SpeculativeModelSpec) -> str | None:
    """Why a node can never host this model's gfx pool (labels, partition, size), or None when it can."""
    placement = spec.placement
    if node.gfx != gfx:
        return None if gfx not in node.gfx_targets else f"{node.name} mixes gfx targets {sorted(node.gfx_targets)}"
    if placement.partition and node.partition != placement.partition:
        return f"{node.name} partition is {node.partition or 'unset'}, not {placement.partition}"
    for key, value in placement.node_selector.items():
        if node.labels.get(key) != value:
            return f"{node.name} lacks label {key}={value}"
    if node.allocatable_gpus < spec.model.tensor_parallel_size:
        return f"{node.name} has {node.allocatable_gpus} GPUs, fewer than TP {spec.model.tensor_parallel_size}"
    return None


def scheduling_block(node: NodeGpus, spec: SpeculativeModelSpec) -> str | None:
    """A condition that keeps pods off the node for now (cordon, untolerated taints); the scheduler enforces it."""
    if node.cordoned:
        return f"{node.name} is cordoned"
    for taint in node.taints:
        if taint.effect in BLOCKING_EFFECTS and not tolerates(taint, spec.placement.tolerations):
            return f"{node.name} has taint {taint.key}={taint.value}:{taint.effect}"
    return None


def _replicas(spec: SpeculativeModelSpec, slots: int, remaining: int | None) -> int:
    if remaining is not None:
        return min(slots, remaining)
    wanted = spec.placement.replicas_per_pool if spec.placement.replicas_per_pool is not None else 1
    return min(slots, wanted)


def plan_placement(
    spec: SpeculativeModelSpec,
    nodes: Sequence[NodeGpus],
    kv_headroom_fraction: float,
    existing_pools: Collection[str] = (),
) -> PlacementPlan:
    """Pools for the spec's gfx targets.

    A new pool needs a node it can schedule on now. Capacity and memory come from every node whose labels
    match, tainted or not, and an existing pool stays while such nodes exist: taints come and go (driver
    upgrades, late heartbeats) and must not delete or resize pools, only leave pods Pending.
    """
    weights = target_weights(spec.model.name, spec.model.weights_gib)
    if weights is None:
        problem = f"cannot estimate the weights of {spec.model.name!r} from its name: set spec.model.weightsGib"
        return PlacementPlan((), (), None, (problem,))
    tp = spec.model.tensor_parallel_size
    remaining = spec.placement.total_replicas
    pools: list[PoolPlan] = []
    skipped: list[SkippedTarget] = []
    for gfx in spec.placement.gfx_targets:
        matching: list[NodeGpus] = []
        notes: list[str] = []
        for node in nodes:
            mismatch = label_mismatch(node, gfx, spec)
            if mismatch:
                notes.append(mismatch)
            elif node.gfx == gfx:
                matching.append(node)
                block = scheduling_block(node, spec)
                if block:
                    notes.append(block)
        schedulable = [node for node in matching if scheduling_block(node, spec) is None]
        if not schedulable and not (matching and gfx in existing_pools):
            detail = "; ".join(notes) or "no node has this gfx target"
            skipped.append(SkippedTarget(gfx, "NoCompatibleNodes", f"{gfx}: no eligible nodes ({detail})"))
            continue
        vram = min(node.vram_gib_per_gpu for node in matching)
        decision = choose_drafter(spec.drafters, gfx, weights, MemoryBudget(tp, vram, kv_headroom_fraction))
        if decision.drafter is None:
            skipped.append(SkippedTarget(gfx, "InsufficientMemory", decision.reason))
            continue
        slots = sum(node.allocatable_gpus // tp for node in matching)
        replicas = _replicas(spec, slots, remaining)
        if remaining is not None:
            remaining -= replicas
        if replicas == 0:
            skipped.append(SkippedTarget(gfx, "NoReplicas", f"{gfx}: totalReplicas already placed on earlier pools"))
            continue
        if replicas < (spec.placement.replicas_per_pool or 0):
            notes.append(f"replicasPerPool {spec.placement.replicas_per_pool} capped to {replicas}: "
                         f"{len(matching)} nodes hold {slots} replicas at TP {tp}")
        names = tuple(sorted(n.name for n in matching))
        pools.append(PoolPlan(gfx, names, slots, replicas, vram, decision, tuple(notes)))
    return PlacementPlan(tuple(pools), tuple(skipped), weights)


def effective_k(previous: int | None, initial_k: int, min_k: int, max_k: int) -> int:
    """The K a pool runs: what it ran before (operator-owned), clamped into the current spec bounds."""
    k = initial_k if previous is None else previous
    return max(min_k, min(max_k, k))

