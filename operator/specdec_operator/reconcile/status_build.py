"""Status for a reconcile: pools, conditions and the short strings `kubectl get` shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec_operator.api.status import (
    CanaryStatus,
    DrafterChoice,
    PoolStatus,
    SpeculationStatus,
    SpeculativeModelStatus,
    Summary,
    TuningDecision,
)
from specdec_operator.canary.plan import IN_FLIGHT_PHASES, canary_summary
from specdec_operator.conditions import ConditionFacts, Finding, apply_updates, summarize
from specdec_operator.decisions.placement import PlacementPlan
from specdec_operator.reconcile.desired import DesiredPool
from specdec_operator.reconcile.observed import ObservedModel
from specdec_operator.render.names import model_selector
from specdec_operator.render.service import service_url
from specdec_runtime import contract


def pool_status(pool: DesiredPool, live: Mapping[str, Any] | None) -> PoolStatus:
    drafter = pool.plan.drafter.drafter
    live_status = (live or {}).get("status", {})
    return PoolStatus(
        name=pool.name,
        gfx_target=pool.plan.gfx,
        requested_as=list(pool.plan.requested_as),
        products=list(pool.plan.products),
        gpu_resource=pool.plan.gpu_resource,
        drafter=DrafterChoice(
            method=drafter.method if drafter else "none",
            model=drafter.model if drafter else None,
            mtp_layers=drafter.mtp_layers if drafter else None,
            fallback=pool.plan.drafter.fallback,
            reason=pool.plan.drafter.reason,
        ),
        effective_k=pool.k,
        replicas=pool.plan.replicas,
        ready_replicas=int(live_status.get("readyReplicas", 0) or 0),
        revision=pool.revision,
        image=pool.runtime.image,
        nodes=len(pool.plan.nodes),
        node_names=list(pool.plan.nodes),
    )


def rollout_done(pool: DesiredPool, live: Mapping[str, Any] | None, revision: str) -> bool:
    """The stable Deployment runs `revision` on every replica, and all are ready."""
    if live is None:
        return False
    labels = live.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
    status = live.get("status", {})
    replicas = int(live.get("spec", {}).get("replicas", pool.plan.replicas))
    return (
        labels.get(contract.LABEL_REVISION) == revision
        and status.get("observedGeneration", 0) >= live.get("metadata", {}).get("generation", 0)
        and int(status.get("updatedReplicas", 0) or 0) >= replicas
        and int(status.get("readyReplicas", 0) or 0) >= replicas
        and int(status.get("replicas", 0) or 0) == replicas
    )


def printer_columns(pools: Sequence[PoolStatus], acceptance: float | None, canary: str) -> Summary:
    """status.summary: the strings `kubectl get specdec` prints as columns (not `conditions.summarize`)."""
    return Summary(
        drafter=",".join(sorted({p.drafter.method for p in pools})),
        effective_k=",".join(f"{p.gfx_target}={p.effective_k}" for p in pools),
        acceptance="" if acceptance is None else f"{acceptance:.0%}",
        pools=len(pools),
        canary=canary,
    )


@dataclass(frozen=True)
class PlacementFacts:
    no_pools: Finding | None = None
    pending: str | None = None
    held_waiting: str | None = None
    ready: str = ""
    reduced: tuple[Finding, ...] = ()


def placement_facts(
    placement: PlacementPlan,
    pools: Sequence[DesiredPool],
    live: Mapping[str, Mapping[str, Any]],
    stable_revisions: Mapping[str, str],
    held_pools: Sequence[PoolStatus] = (),
) -> PlacementFacts:
    """What placement and the live Deployments say: no pool (and why), pools still rolling, or all ready;
    and what the model serves with less than the spec's first choice (drafter fallbacks, skipped targets).

    Pools held through missing nodes (`held_pools`) count as placed; their live Deployment says if they serve.
    """
    if not pools and not held_pools:
        reasons = {skipped.reason for skipped in placement.skipped}
        if placement.problems:
            reason = "UnknownModelSize"
        elif len(reasons) == 1:
            reason = reasons.pop()
        else:
            reason = "NoCompatibleNodes"
        message = "; ".join([*placement.problems, *(s.message for s in placement.skipped)]) or "no pools"
        return PlacementFacts(no_pools=Finding(reason, message))
    pending = [f"{p.name} -> {stable_revisions.get(p.name, p.revision)}" for p in pools
               if not rollout_done(p, live.get(p.name), stable_revisions.get(p.name, p.revision))]
    held_waiting = []
    for held in held_pools:
        ready = int((live.get(held.name) or {}).get("status", {}).get("readyReplicas", 0) or 0)
        if ready < held.replicas:
            held_waiting.append(f"{held.name} ({ready} of {held.replicas} ready, held through missing nodes)")
    summary = ", ".join([*(f"{p.name}: {p.plan.replicas} ready at K={p.k}" for p in pools),
                         *(f"{h.name}: {h.replicas} ready at K={h.effective_k}" for h in held_pools)])
    if placement.target_weights is not None and placement.target_weights.guessed:
        # Memory and drafter fit rest on it: a checkpoint of another precision than its name says is sized wrong.
        summary += (f" (target weights {placement.target_weights} guessed from the model's name: set "
                    "spec.model.weightsGib if the checkpoint differs)")
    reduced = [Finding("DrafterFallback", f"{p.name}: {p.plan.drafter.reason}")
               for p in pools if p.plan.drafter.fallback]
    # A target skipped because other workloads hold the GPUs is Degraded (capacity_findings), not by design.
    reduced += [Finding(s.reason, s.message) for s in placement.skipped if s.reason != "InsufficientGpus"]
    return PlacementFacts(pending=", ".join(pending) if pending else None,
                          held_waiting=", ".join(held_waiting) if held_waiting else None, ready=summary,
                          reduced=tuple(reduced))


def build_status(
    observed: ObservedModel,
    previous: SpeculativeModelStatus,
    pools: Sequence[PoolStatus],
    speculation: SpeculationStatus | None = None,
    canary: CanaryStatus | None = None,
) -> SpeculativeModelStatus:
    """Every field of the status a pass renders, but its conditions (`decided_status` sets those)."""
    status = previous.model_copy(deep=True)
    status.canary = canary if canary is not None else previous.canary
    if speculation is not None:
        status.speculation = speculation
    status.observed_generation = observed.generation
    status.pools = list(pools)
    status.summary = printer_columns(pools, status.speculation.acceptance_rate, canary_summary(status.canary))
    status.replicas = sum(pool.replicas for pool in pools)
    status.selector = model_selector(observed.name)
    # The model's Service exists while it has pools (reconcile/plan.py renders it with them).
    status.url = service_url(observed.namespace, observed.name) if pools else ""
    return status


@dataclass(frozen=True)
class StatusDecision:
    """What a pass's policies decided its status says, before it is built: `decided_status` builds every kind
    of it, in one place (reconcile/plan.py:evaluate calls it once, at its end)."""

    previous: SpeculativeModelStatus  # the stored status (its readable part)
    facts: ConditionFacts = field(default_factory=ConditionFacts)  # what the conditions summarise
    pools: Sequence[PoolStatus] | None = None  # None: the pools the stored status records
    speculation: SpeculationStatus | None = None  # None: the stored record
    canary: CanaryStatus | None = None  # None: the stored canary
    conditions_only: bool = False  # an unreadable status: only its conditions are written
    proposal: TuningDecision | None = None  # a proposed K change: recorded alone, the conditions as they are


def decided_status(observed: ObservedModel, decided: StatusDecision, now: str) -> SpeculativeModelStatus:
    """The status a pass writes, from what its policies decided: a proposed K alone; otherwise the status's
    fields (none of them while the stored status is unreadable), then its conditions, summarised once."""
    previous = decided.previous
    if decided.proposal is not None:
        return proposal_status(previous, decided.proposal, decided.speculation)
    pools = previous.pools if decided.pools is None else decided.pools
    status = previous.model_copy() if decided.conditions_only else build_status(
        observed, previous, pools, decided.speculation, decided.canary)
    status.conditions = apply_updates(previous.conditions, summarize(decided.facts), observed.generation, now)
    return status


def proposal_status(
    previous: SpeculativeModelStatus, decision: TuningDecision, speculation: SpeculationStatus | None
) -> SpeculativeModelStatus:
    """The stored status with the proposed K as the pool's effective K and the decision record, nothing else:
    what a pass that proposes a K change writes (the next pass renders the Deployments from it)."""
    pools = [p.model_copy(update={"effective_k": decision.to_k}) if p.name == decision.pool else p
             for p in previous.pools]
    recorded = speculation or previous.speculation
    return previous.model_copy(update={
        "pools": pools,
        "speculation": recorded,
        "summary": printer_columns(pools, recorded.acceptance_rate, canary_summary(previous.canary)),
    })


def canary_facts(canary: CanaryStatus | None, pools: Sequence[DesiredPool]) -> tuple[Finding | None, Finding | None]:
    """(progress, failure): a canary in flight is progress; a rolled-back revision the spec still asks for
    is degradation."""
    if canary is None:
        return None, None
    where = f"{canary.pool}: revision {canary.canary_revision} vs stable {canary.stable_revision}"
    if canary.phase in IN_FLIGHT_PHASES:
        reason = "CanaryPaused" if canary.phase == "Paused" else "CanaryInProgress"
        detail = f"{where}, step {canary.step + 1} at {canary.weight}%"
        message = f"{detail}; {canary.message}" if canary.message else detail
        return Finding(reason, message), None
    desired = {pool.name: pool.revision for pool in pools}
    if canary.phase in ("RolledBack", "Aborted") and desired.get(canary.pool) == canary.canary_revision:
        reason = "CanaryRolledBack" if canary.phase == "RolledBack" else "CanaryAborted"
        return None, Finding(reason, f"{where}: {canary.message}")
    return None, None
