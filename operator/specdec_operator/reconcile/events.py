"""Events for decisions that changed since the last status, so a steady state posts nothing."""

from __future__ import annotations

from collections.abc import Sequence

from specdec_operator.api.status import PoolStatus, SpeculativeModelStatus
from specdec_operator.decisions.placement import PlacementPlan
from specdec_operator.reconcile.observed import EventRecord


def _drafter_key(pool: PoolStatus) -> tuple[str, str | None]:
    return pool.drafter.method, pool.drafter.model


def pool_events(
    previous: SpeculativeModelStatus, current: Sequence[PoolStatus], placement: PlacementPlan
) -> list[EventRecord]:
    events: list[EventRecord] = []
    before = {p.name: p for p in previous.pools}
    after = {p.name: p for p in current}
    for name, pool in after.items():
        old = before.get(name)
        drafter = f"{pool.drafter.method}{f' {pool.drafter.model}' if pool.drafter.model else ''}"
        if old is None:
            events.append(EventRecord(
                "Normal", "PoolPlaced",
                f"{name}: {pool.replicas} replica(s) on {pool.nodes} {pool.gfx_target} node(s), image {pool.image}, "
                f"drafter {drafter}, K={pool.effective_k}",
            ))
        if pool.drafter.fallback and (old is None or not old.drafter.fallback):
            events.append(EventRecord("Warning", "DrafterFallback", f"{name}: {pool.drafter.reason}"))
        elif not pool.drafter.fallback and (old is None or _drafter_key(old) != _drafter_key(pool)):
            events.append(EventRecord("Normal", "DrafterSelected", f"{name}: {pool.drafter.reason}"))
        if old is not None and old.revision and old.revision != pool.revision:
            events.append(EventRecord(
                "Normal", "RevisionChanged", f"{name}: rolling {old.revision} -> {pool.revision} (K={pool.effective_k})"
            ))
    for name in before.keys() - after.keys():
        events.append(EventRecord("Normal", "PoolRemoved", f"{name}: no longer placed"))
    # A skipped target is reported in Reduced (or Degraded, with no pool at all): warn when it first appears.
    said = " ".join(c.message for c in previous.conditions if c.type in ("Degraded", "Reduced"))
    for skipped in placement.skipped:
        if skipped.message not in said:
            events.append(EventRecord("Warning", skipped.reason, skipped.message))
    return events
