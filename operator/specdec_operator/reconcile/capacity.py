"""Capacity in a reconcile: free GPUs for placement, each pool's rollout mode, and what status says about both.

Pure: observed pods and nodes in; a GPU usage, per-pool rollout decisions, conditions and events out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from specdec_operator.api.spec import Canary, SpeculativeModelSpec
from specdec_operator.api.status import PoolRollout, SpeculativeModelStatus
from specdec_operator.canary.plan import split_canary_replicas
from specdec_operator.conditions import Finding
from specdec_operator.decisions.capacity import GpuUsage, RolloutMode, choose_mode, pool_room
from specdec_operator.decisions.placement import PlacementPlan
from specdec_operator.gpu.inventory import PodGpus
from specdec_operator.reconcile.desired import DesiredPool
from specdec_operator.reconcile.observed import EventRecord, ObservedModel
from specdec_operator.render.names import label_value
from specdec_operator.timestamps import parse_stamp

# A pod the scheduler cannot place for this long is reported; shorter waits are an in-place replacement's
# new pod waiting for the old one's GPUs.
UNSCHEDULABLE_GRACE_S = 30


def model_usage(observed: ObservedModel) -> GpuUsage:
    return observed.gpu_claims.usage(f"{observed.namespace}/{label_value(observed.name)}")


def _surge_need(spec: SpeculativeModelSpec, total: int) -> int:
    """Extra replicas a surge rollout needs at its peak (see decisions.capacity.choose_mode)."""
    if spec.rollout.strategy != "Canary":
        return 1
    steps = (spec.rollout.canary or Canary()).steps
    # The last step's canary replicas stay until the promoted stable set, surging, is ready beside them.
    return split_canary_replicas(total, steps[-1].weight)[1] + max(spec.rollout.max_surge, 1)


def _as_mode(decision: PoolRollout) -> RolloutMode:
    return RolloutMode(decision.mode, decision.max_surge, decision.max_unavailable, decision.reason)


def _still_valid(decision: PoolRollout, pool: DesiredPool, spec: SpeculativeModelSpec, usage: GpuUsage) -> bool:
    """A decision holds for its revision while the spec's budget allows it and a surge pod can still schedule."""
    rollout = spec.rollout
    if decision.revision != pool.revision:
        return False
    if decision.mode == "InPlace":
        # Held even if GPUs free up mid-rollout: flipping the strategy back and forth would churn the Deployment.
        return decision.max_unavailable == rollout.max_unavailable
    if rollout.max_surge == 0 and rollout.max_unavailable > 0:
        return False
    stuck = [p for p in usage.unscheduled if p.pool == pool.name]
    # Someone took the free GPUs the surge counted on: replace in place rather than wait forever.
    return not (stuck and rollout.max_unavailable > 0)


def rollout_modes(
    spec: SpeculativeModelSpec,
    pools: Sequence[DesiredPool],
    observed: ObservedModel,
    usage: GpuUsage,
    previous: SpeculativeModelStatus,
) -> dict[str, PoolRollout]:
    """Each pool's rollout mode: kept for its revision once decided, decided afresh for a new revision."""
    earlier = {p.name: p.rollout for p in previous.pools if p.rollout is not None}
    nodes = {node.name: node for node in observed.nodes}
    decisions: dict[str, PoolRollout] = {}
    for pool in pools:
        kept = earlier.get(pool.name)
        if kept is not None and _still_valid(kept, pool, spec, usage):
            decisions[pool.name] = kept
            continue
        hosts = [nodes[name] for name in pool.plan.nodes if name in nodes]
        room = pool_room(pool.plan.gfx, hosts, usage, spec.tensor_parallel_of(pool.plan.gfx))
        mode = choose_mode(room, _surge_need(spec, pool.plan.replicas), spec.rollout.max_surge,
                           spec.rollout.max_unavailable, canary=spec.rollout.strategy == "Canary")
        if kept is not None and kept.revision == pool.revision and kept.mode == "Surge" and mode.mode == "InPlace":
            stuck = next((p for p in usage.unscheduled if p.pool == pool.name), None)
            if stuck is not None:
                mode = RolloutMode(mode.mode, mode.max_surge, mode.max_unavailable,
                                   f"surge pod {stuck.name} cannot be scheduled ({stuck.unschedulable}); {mode.reason}")
        decisions[pool.name] = PoolRollout(
            mode=mode.mode, revision=pool.revision, max_surge=mode.max_surge,
            max_unavailable=mode.max_unavailable, reason=mode.reason,
        )
    return decisions


def modes_for_rollout(decisions: Mapping[str, PoolRollout]) -> dict[str, RolloutMode]:
    return {name: _as_mode(decision) for name, decision in decisions.items()}


def rollout_mode_events(
    decisions: Mapping[str, PoolRollout], previous: SpeculativeModelStatus, live_revisions: Mapping[str, str | None]
) -> list[EventRecord]:
    """One event per decision that starts a real rollout (a live pool moving to a new revision) or changes mode."""
    earlier = {p.name: p.rollout for p in previous.pools}
    events = []
    for name, decision in decisions.items():
        before = earlier.get(name)
        if before is not None and (before.revision, before.mode) == (decision.revision, decision.mode):
            continue
        if live_revisions.get(name) in (None, decision.revision):
            continue  # a new pool, or nothing left to roll: no rollout to speak of
        how = "surges" if decision.mode == "Surge" else "replaces in place"
        events.append(EventRecord(
            "Normal", f"Rollout{decision.mode}",
            f"pool {name} {how} to revision {decision.revision} (maxSurge {decision.max_surge}, maxUnavailable "
            f"{decision.max_unavailable}): {decision.reason}",
        ))
    return events


def _unschedulable_for(pod: PodGpus, now: datetime) -> float | None:
    if not pod.pending_since:
        return None
    try:
        since = parse_stamp(pod.pending_since)
    except ValueError:
        return None
    return max(0.0, (now - since).total_seconds())


def capacity_findings(placement: PlacementPlan, usage: GpuUsage, now: datetime) -> tuple[Finding, ...]:
    """Other workloads' GPUs cap a pool (InsufficientGpus), or a pod of the model stays Pending
    (PodsUnschedulable, with the scheduler's message)."""
    shortfalls = [p.shortfall for p in placement.pools if p.shortfall]
    shortfalls += [s.message for s in placement.skipped if s.reason == "InsufficientGpus"]
    pending = []
    for pod in usage.unscheduled:
        waited = _unschedulable_for(pod, now)
        if waited is not None and waited >= UNSCHEDULABLE_GRACE_S:
            pending.append(f"pod {pod.name} Pending for {waited:.0f} s: {pod.unschedulable}")
    found = [Finding("InsufficientGpus", message) for message in shortfalls]
    if pending:
        found.append(Finding("PodsUnschedulable", "; ".join(pending)))
    return tuple(found)
