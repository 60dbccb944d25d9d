"""Which pools a SpeculativeModel gets: one per allowed gfx target with eligible nodes and enough memory."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from specdec_operator.api.spec import SpeculativeModelSpec, Toleration
from specdec_operator.decisions.capacity import GpuUsage, replica_slots
from specdec_operator.decisions.drafter import DrafterDecision, MemoryBudget, choose_drafter
from specdec_operator.decisions.replica_split import split_replicas
from specdec_operator.decisions.weights import WeightsEstimate, target_weights
from specdec_operator.gpu.devices import BUILTIN_DEVICES, DeviceTable
from specdec_operator.gpu.inventory import GPU_RESOURCE, NodeGpus, Taint

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
NODE_LIFECYCLE_TAINT_PREFIX = "node.kubernetes.io/"


@dataclass(frozen=True)
class PoolPlan:
    gfx: str
    nodes: tuple[str, ...]  # where the pool's replicas can run now (see plan_placement)
    slots: int  # replicas those nodes can hold at this TP
    replicas: int
    vram_gib_per_gpu: float
    drafter: DrafterDecision
    notes: tuple[str, ...] = ()
    # Nodes the gfx affinity's labels would admit although the inventory cannot vouch for all their GPUs
    # (a mixed node with a device id missing from the table); the pod template excludes them by name.
    excluded_nodes: tuple[str, ...] = ()
    # Why fewer replicas than the spec asks fit, when other workloads hold the GPUs (InsufficientGpus).
    shortfall: str | None = None
    # The extended resource the pool's pods request: amd.com/gpu, or a partition resource of the device
    # plugin's `mixed` strategy (amd.com/cpx_nps4), which then also pins the partition.
    gpu_resource: str = GPU_RESOURCE
    products: tuple[str, ...] = ()  # the GPU products on the pool's nodes, e.g. ("MI300X",)
    requested_as: tuple[str, ...] = ()  # the spec.placement.gfxTargets entries naming this target (mi300x, gfx942)


@dataclass(frozen=True)
class SkippedTarget:
    gfx: str
    reason: str  # NoCompatibleNodes | InsufficientMemory | NoReplicas | InsufficientGpus
    message: str


@dataclass(frozen=True)
class PlacementPlan:
    pools: tuple[PoolPlan, ...]
    skipped: tuple[SkippedTarget, ...]
    target_weights: WeightsEstimate | None
    problems: tuple[str, ...] = field(default=())


# Clusters taint their GPU nodes with the GPU resource's name (`amd.com/gpu=<any>:NoSchedule`) so that only pods
# that use a GPU land there; Kubernetes' ExtendedResourceToleration admission plugin adds exactly this toleration to
# every pod that requests amd.com/gpu. Runtime pods carry it themselves, so they schedule whether or not the
# cluster enables that plugin.
GPU_TAINT_TOLERATION = Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")


def honoured_tolerations(tolerations: Sequence[Toleration]) -> list[Toleration]:
    """The tolerations runtime pods carry: the GPU taint's, then the user's; placement honours exactly these.

    Admission refuses a toleration of AMD's transient taints and a keyless one (api/placement.py), so every
    user toleration is carried; one equal to the GPU taint's is carried once.
    """
    return [GPU_TAINT_TOLERATION, *(t for t in tolerations if t != GPU_TAINT_TOLERATION)]


def tolerates(taint: Taint, tolerations: Sequence[Toleration]) -> bool:
    """Whether a runtime pod tolerates `taint`: the scheduler's rule over the honoured tolerations."""
    for toleration in honoured_tolerations(tolerations):
        if toleration.key != taint.key or (toleration.effect and toleration.effect != taint.effect):
            continue
        if toleration.operator == "Exists" or (toleration.value or "") == taint.value:
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
    tp = spec.tensor_parallel_of(gfx)
    if node.allocatable_gpus < tp:
        return f"{node.name} has {node.allocatable_gpus} GPUs, fewer than TP {tp}"
    return None


def scheduling_block(node: NodeGpus, spec: SpeculativeModelSpec) -> str | None:
    """A condition that keeps pods off the node for now (cordon, untolerated taints); the scheduler enforces it."""
    if node.cordoned:
        return f"{node.name} is cordoned"
    for taint in node.taints:
        if taint.key.startswith(NODE_LIFECYCLE_TAINT_PREFIX):
            # not-ready/unreachable come and go with heartbeats; sizing pools by them would churn Deployments.
            continue
        if taint.effect in BLOCKING_EFFECTS and not tolerates(taint, spec.placement.tolerations):
            return f"{node.name} has taint {taint.key}={taint.value}:{taint.effect}"
    return None


def _none_wanted(gfx: str, spec: SpeculativeModelSpec) -> str:
    """What to say when the spec asks no replicas of this pool."""
    placement = spec.placement
    if placement.total_replicas is None:
        return f"{gfx}: replicasPerPool is 0"
    if placement.total_replicas == 0:
        return f"{gfx}: totalReplicas is 0"
    return f"{gfx}: all {placement.total_replicas} of totalReplicas are placed on earlier pools"


def _wanted_replicas(spec: SpeculativeModelSpec, targets: Sequence[str], available: Sequence[int],
                     allocatable: Sequence[int]) -> tuple[list[int], list[int]]:
    """(replicas that fit now, replicas the spec asks of each pool were no other workload holding GPUs), for the
    pools of `targets`."""
    placement = spec.placement
    if placement.total_replicas is None:
        per_pool = [spec.for_pool(gfx).placement.replicas_per_pool for gfx in targets]
        wanted = [1 if replicas is None else replicas for replicas in per_pool]
        return [min(slots, asked) for slots, asked in zip(available, wanted, strict=True)], wanted
    total, bounds = placement.total_replicas, (placement.min_replicas_per_pool or 0, placement.max_replicas_per_pool)
    fits = split_replicas(total, available, *bounds).replicas
    # What a pool is asked is what it would take were none of its own GPUs held by others, the other pools
    # as they are: a pool short of GPUs says so even when earlier pools' shortfalls pushed replicas to it.
    asked = [split_replicas(total, [*available[:i], allocatable[i], *available[i + 1:]], *bounds).replicas[i]
             for i in range(len(available))]
    return list(fits), asked


@dataclass(frozen=True)
class _Candidate:
    """A gfx target with eligible nodes and a drafter that fits, before replicas are split over pools."""

    gfx: str
    hosts: tuple[NodeGpus, ...]
    notes: tuple[str, ...]
    vram: float
    decision: DrafterDecision
    allocatable_slots: int
    slots: int


def unvetted_nodes(nodes: Sequence[NodeGpus], gfx: str) -> tuple[str, ...]:
    """Mixed nodes whose known GPUs are all `gfx` but which also carry a device id the table lacks.

    The gfx affinity can only exclude device ids it knows (DoesNotExist per id), so its labels admit
    these nodes while the inventory cannot say what the unknown GPUs are.
    """
    return tuple(sorted(n.name for n in nodes if n.unknown_device_ids and n.gfx_targets == {gfx}))


def plan_placement(
    spec: SpeculativeModelSpec,
    nodes: Sequence[NodeGpus],
    kv_headroom_fraction: float,
    existing_pools: Collection[str] = (),
    usage: GpuUsage | None = None,
    devices: DeviceTable = BUILTIN_DEVICES,
) -> PlacementPlan:
    """Pools for the spec's gfx targets.

    Replicas are sized by the GPUs the model could hold: allocatable minus what bound pods of other
    models and workloads request (`usage`; the model's own pods are not competitors). When that caps
    a pool below what the spec asks, the plan says so with numbers (InsufficientGpus).

    A pool's nodes and slots are the matching nodes it can schedule on now: a cordoned or tainted node
    would only leave a replica Pending. Memory comes from every node whose labels match, tainted or not,
    since the pods may land there once the taint lifts. Taints come and go (driver upgrades, late
    heartbeats), so an existing pool with no schedulable node left is kept, sized by its label-matching
    nodes, rather than deleted; only a new pool needs a node it can schedule on now.
    """
    weights = target_weights(spec.model.name, spec.model.weights_gib)
    if weights is None:
        problem = f"cannot estimate the weights of {spec.model.name!r} from its name: set spec.model.weightsGib"
        return PlacementPlan((), (), None, (problem,))
    usage = usage or GpuUsage()
    # Per gfx target in preference order: a candidate pool, or why it was skipped. Replicas are split once
    # every candidate's capacity is known, since per-pool bounds spread a total over all of them.
    outcomes: list[_Candidate | SkippedTarget] = []
    for gfx in spec.placement.targets:
        if not devices.ids_for_gfx(gfx):
            # No label could ever identify such a node, and an affinity `In []` is invalid.
            outcomes.append(SkippedTarget(gfx, "NoCompatibleNodes", f"{gfx}: no eligible nodes (the device table "
                                          f"has no AMD device id for {gfx} yet, so no node is recognised as one)"))
            continue
        matching, hosts, notes = _hosts(spec, gfx, nodes, existing_pools)
        if not hosts:
            detail = "; ".join(notes) or "no node has this gfx target"
            outcomes.append(SkippedTarget(gfx, "NoCompatibleNodes", f"{gfx}: no eligible nodes ({detail})"))
            continue
        tp = spec.tensor_parallel_of(gfx)  # spec.placement.pools may give this pool its own
        vram = min(node.vram_gib_per_gpu for node in matching)
        decision = choose_drafter(spec.drafters, gfx, weights, MemoryBudget(tp, vram, kv_headroom_fraction))
        if decision.drafter is None:
            outcomes.append(SkippedTarget(gfx, "InsufficientMemory", decision.reason))
            continue
        allocatable_slots = replica_slots(hosts, {n.name: n.allocatable_gpus for n in hosts}, tp)
        slots = replica_slots(hosts, {n.name: usage.available_to_model(n) for n in hosts}, tp)
        outcomes.append(_Candidate(gfx, tuple(hosts), tuple(notes), vram, decision, allocatable_slots, slots))
    pools, skipped = _sized_pools(spec, outcomes, usage, nodes)
    return PlacementPlan(tuple(pools), tuple(skipped), weights)


def _sized_pools(
    spec: SpeculativeModelSpec,
    outcomes: Sequence[_Candidate | SkippedTarget],
    usage: GpuUsage,
    nodes: Sequence[NodeGpus],
) -> tuple[list[PoolPlan], list[SkippedTarget]]:
    """The replicas split over every candidate at once, then each target's pool or why it has none, in the
    spec's order."""
    candidates = [c for c in outcomes if isinstance(c, _Candidate)]
    fits, wanted = _wanted_replicas(spec, [c.gfx for c in candidates], [c.slots for c in candidates],
                                    [c.allocatable_slots for c in candidates])
    split = {c.gfx: (replicas, asked) for c, replicas, asked in zip(candidates, fits, wanted, strict=True)}
    pools: list[PoolPlan] = []
    skipped: list[SkippedTarget] = []
    for outcome in outcomes:
        placed = _pool_plan(spec.for_pool(outcome.gfx), outcome, split[outcome.gfx], usage, nodes) if isinstance(
            outcome, _Candidate) else outcome
        if isinstance(placed, SkippedTarget):
            skipped.append(placed)
        else:
            pools.append(placed)
    return pools, skipped


def _hosts(
    spec: SpeculativeModelSpec, gfx: str, nodes: Sequence[NodeGpus], existing_pools: Collection[str]
) -> tuple[list[NodeGpus], list[NodeGpus], list[str]]:
    """(matching, hosts, notes) for one gfx target: the nodes whose labels match (of one resource), those of
    them a pod can schedule on now (all matching ones for an existing pool that has none), and why others
    do not count."""
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
    matching = _one_resource(matching, notes)
    hosts = [node for node in matching if scheduling_block(node, spec) is None]
    if not hosts and matching and gfx in existing_pools:
        hosts = matching
    return matching, hosts, notes


def _pool_plan(
    spec: SpeculativeModelSpec,
    candidate: _Candidate,
    split: tuple[int, int],
    usage: GpuUsage,
    nodes: Sequence[NodeGpus],
) -> PoolPlan | SkippedTarget:
    """A candidate target's pool at the replicas the split gives it (`split`: replicas, asked), or why it has
    none (InsufficientGpus, NoReplicas)."""
    tp = spec.model.tensor_parallel_size
    candidate_gfx, candidate_hosts, slots = candidate.gfx, candidate.hosts, candidate.slots
    replicas, asked = split
    shortfall = _shortfall(candidate_gfx, candidate_hosts, usage, tp, asked, replicas, candidate.allocatable_slots)
    if replicas == 0:
        if shortfall:
            return SkippedTarget(candidate_gfx, "InsufficientGpus", shortfall)
        return SkippedTarget(candidate_gfx, "NoReplicas", _none_wanted(candidate_gfx, spec))
    notes = list(candidate.notes)
    if replicas < (spec.placement.replicas_per_pool or 0) and not shortfall:
        notes.append(f"replicasPerPool {spec.placement.replicas_per_pool} capped to {replicas}: "
                     f"{len(candidate_hosts)} nodes hold {slots} replicas at TP {tp}")
    names = tuple(sorted(n.name for n in candidate_hosts))
    products = tuple(sorted({group.product for n in candidate_hosts for group in n.groups}))
    return PoolPlan(candidate_gfx, names, slots, replicas, candidate.vram, candidate.decision, tuple(notes),
                    unvetted_nodes(nodes, candidate_gfx), shortfall, candidate_hosts[0].gpu_resource,
                    products, _requested_as(spec, candidate_gfx))


def _requested_as(spec: SpeculativeModelSpec, gfx: str) -> tuple[str, ...]:
    return tuple(t for t, resolved in zip(spec.placement.gfx_targets, spec.placement.targets, strict=True)
                 if resolved == gfx)


def _one_resource(nodes: list[NodeGpus], notes: list[str]) -> list[NodeGpus]:
    """The nodes that offer the pool's resource. A pod requests one resource name, so a pool whose nodes differ
    (amd.com/gpu here, amd.com/cpx_nps4 there) uses the one with most units and says which nodes it leaves."""
    if len({n.gpu_resource for n in nodes}) <= 1:
        return nodes
    units: dict[str, int] = {}
    for n in nodes:
        units[n.gpu_resource] = units.get(n.gpu_resource, 0) + n.allocatable_gpus
    chosen = min(units, key=lambda name: (-units[name], name))
    for n in nodes:
        if n.gpu_resource != chosen:
            notes.append(f"{n.name} offers {n.gpu_resource}, the pool requests {chosen}")
    return [n for n in nodes if n.gpu_resource == chosen]


def _shortfall(
    gfx: str, hosts: Sequence[NodeGpus], usage: GpuUsage, tp: int, wanted: int, replicas: int, allocatable_slots: int
) -> str | None:
    """The message when other workloads' GPUs, not the fleet's size, keep replicas from fitting."""
    if replicas >= min(wanted, allocatable_slots):
        return None
    allocatable = sum(n.allocatable_gpus for n in hosts)
    held = sum(min(usage.held_by_others(n.name), n.allocatable_gpus) for n in hosts)
    return (f"{gfx}: {replicas} of {wanted} replicas fit: {wanted} at TP {tp} need {wanted * tp} GPUs, but other "
            f"models and workloads hold {held} of the {allocatable} GPUs on {len(hosts)} nodes")


def effective_k(previous: int | None, initial_k: int, min_k: int, max_k: int) -> int:
    """The K a pool runs: what it ran before (operator-owned), clamped into the current spec bounds."""
    k = initial_k if previous is None else previous
    return max(min_k, min(max_k, k))

