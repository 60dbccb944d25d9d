"""Grace before giving up capacity: a pool whose nodes stop matching is held, not removed, for a while.

Nodes leave the inventory for reasons that heal on their own: a node group replaced (Node objects deleted
and re-created), the device plugin re-registering (allocatable amd.com/gpu 0), the node labeller restarting
(device-id labels gone), a cordon for maintenance. Placement alone would drop the pool (or shrink it) in
the pass that first sees this, deleting serving Deployments and sending K back to initialK when it returns.

So a pool whose placement lost capacity because its nodes went missing keeps its objects, replicas and K;
status records which nodes are missing and since when (written before anything acts on it, so an operator
restart keeps the clock), and only once `grace_s` has passed from that stamp does placement's answer stand.
Pure: previous pool statuses, the placement and the inventory in; what to hold and what to say out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import NodesMissing, PoolStatus
from specdec_operator.decisions.placement import (
    PlacementPlan,
    PoolPlan,
    SkippedTarget,
    label_mismatch,
    scheduling_block,
)
from specdec_operator.gpu.inventory import NodeGpus
from specdec_operator.timestamps import format_stamp, parse_stamp

# Skips that mean "the nodes stopped offering", as opposed to a spec that no longer wants the pool.
NODE_SKIP_REASONS = ("NoCompatibleNodes", "InsufficientGpus")


@dataclass(frozen=True)
class HeldPool:
    """One pool kept through missing nodes."""

    gfx: str
    missing: NodesMissing
    until: datetime
    # The pool has no placement at all now: its status entry and live objects are kept as they are.
    whole: bool
    why: tuple[str, ...]  # per missing node, what the inventory says


@dataclass(frozen=True)
class AbsenceDecision:
    placement: PlacementPlan  # with held replicas restored on pools that lost nodes
    held: tuple[HeldPool, ...] = ()
    expired: tuple[str, ...] = ()  # gfx targets whose grace ran out in this pass
    first_seen: tuple[str, ...] = ()  # gfx targets whose nodes went missing in this pass

    def held_for(self, gfx: str) -> HeldPool | None:
        return next((h for h in self.held if h.gfx == gfx), None)


def why_missing(name: str, gfx: str, nodes: Mapping[str, NodeGpus], spec: SpeculativeModelSpec) -> str:
    """What the inventory says of a node the pool was placed on and no longer uses."""
    node = nodes.get(name)
    if node is None:
        return f"{name} is not in the node inventory (deleted)"
    if not node.groups and not node.unknown_device_ids:
        return f"{name} has no AMD GPU device-id label"
    if node.gfx != gfx:
        return label_mismatch(node, gfx, spec) or f"{name} is no longer recognised as {gfx}"
    return label_mismatch(node, gfx, spec) or scheduling_block(node, spec) or f"{name} has no room for the pool"


def _no_longer_matches(name: str, gfx: str, nodes: Mapping[str, NodeGpus], spec: SpeculativeModelSpec) -> bool:
    node = nodes.get(name)
    if node is None or node.gfx != gfx:
        return True
    return label_mismatch(node, gfx, spec) is not None or scheduling_block(node, spec) is not None


def _nodes_lost(
    before: PoolStatus, plan: PoolPlan | None, skip: SkippedTarget | None, missing_names: Sequence[str]
) -> bool:
    """Whether the pool lost nodes it was on (rather than being shrunk or dropped for another reason)."""
    known = bool(before.node_names)
    if plan is None:
        if skip is None or skip.reason not in NODE_SKIP_REASONS:
            return False
        # Nodes the pool was on are gone; a status from before nodeNames can only go by the skip's reason.
        return bool(missing_names) if known else skip.reason == "NoCompatibleNodes"
    # Fewer replicas count only when nodes the pool was on went, not when the spec or other workloads'
    # GPUs shrank it (InsufficientGpus is capacity taken, reported as such, not nodes missing).
    # A status from before nodeNames goes by the slots the nodes offer.
    return plan.replicas < before.replicas and (bool(missing_names) if known else plan.slots < before.replicas)


def hold_missing_pools(
    previous: Sequence[PoolStatus],
    placement: PlacementPlan,
    spec: SpeculativeModelSpec,
    nodes: Sequence[NodeGpus],
    now: datetime,
    grace_s: float,
) -> AbsenceDecision:
    """Which previous pools to hold because their nodes stopped matching, and the placement with them held."""
    placed = {pool.gfx: pool for pool in placement.pools}
    skipped = {skip.gfx: skip for skip in placement.skipped}
    inventory = {node.name: node for node in nodes}
    pools = list(placement.pools)
    held: list[HeldPool] = []
    expired: list[str] = []
    first_seen: list[str] = []
    for before in previous:
        gfx = before.gfx_target
        if gfx not in spec.placement.targets:
            continue  # the spec dropped the target: a decision in Git, not a missing node
        plan = placed.get(gfx)
        # Gone or no longer matching (deleted, labels, allocatable, cordon, taint); a node whose GPUs other
        # workloads took is still there, and that shortfall is InsufficientGpus, at once.
        missing_names = sorted(name for name in set(before.node_names)
                               if _no_longer_matches(name, gfx, inventory, spec))
        if not _nodes_lost(before, plan, skipped.get(gfx), missing_names):
            continue
        if before.missing is not None:
            since = parse_stamp(before.missing.since)
            recorded = before.missing
        else:
            since = now
            recorded = NodesMissing(since=format_stamp(now), nodes=missing_names)
            first_seen.append(gfx)
        until = since + timedelta(seconds=grace_s)
        if now >= until:
            expired.append(gfx)
            continue
        # The nodes missing now: an outage that reaches the pool's nodes one by one grows the record (and a node
        # that returned leaves it); the clock stays the first one's. A status from before nodeNames has no names.
        names = missing_names or recorded.nodes
        record = NodesMissing(since=recorded.since, nodes=names)
        why = tuple(why_missing(name, gfx, inventory, spec) for name in names) or (
            skipped[gfx].message if gfx in skipped else f"{gfx}: fewer nodes than the pool's {before.replicas} "
            "replicas need",)
        held.append(HeldPool(gfx, record, until, whole=plan is None, why=why))
        if plan is not None:
            pools[pools.index(plan)] = dataclasses.replace(plan, replicas=before.replicas)
    kept_skips = tuple(s for s in placement.skipped if not any(h.gfx == s.gfx for h in held))
    return AbsenceDecision(dataclasses.replace(placement, pools=tuple(pools), skipped=kept_skips), tuple(held),
                           tuple(expired), tuple(first_seen))


def held_message(pool: str, held: HeldPool, replicas: int, k: int) -> str:
    """One pool's part of the NodesMissing condition: which nodes, why, and until when."""
    nodes = f"nodes {', '.join(held.missing.nodes)}" if held.missing.nodes else f"its {held.gfx} nodes"
    return (f"{pool}: {nodes} missing since {held.missing.since} ({'; '.join(held.why)}); keeping "
            f"{replicas} replica(s) at K={k} until {format_stamp(held.until)}, then the pool is "
            f"{'removed' if held.whole else 'resized'}")
