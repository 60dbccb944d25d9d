"""A change freeze: spec.rollout.freeze for one model, or the operator setting for every model (pure).

What it holds, and only that: a pool's pod template (its stable and canary Deployments are left as they run), a
canary's start, a canary in flight (held at its step as a pause holds it: a failing one still rolls back, and the
step's window restarts when the freeze ends), and the tuner's K changes (none is recorded; the tuner proposes it
again at its next evaluation once the freeze is off). What it does not hold: scaling, the kubelet restarting
pods, ConfigMaps that nothing runs yet, and status. Progressing=False with reason RolloutsFrozen names the
freeze's source and what waits.
"""

from __future__ import annotations

from collections.abc import Mapping

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.conditions import Finding
from specdec_operator.reconcile.rollout_limit import RolloutsInFlight, queue_source

# How status names the fleet-wide switch: the setting and the chart value that sets it.
FLEET_SOURCE = "the operator setting SPECDEC_FREEZE_ROLLOUTS (chart value freezeRollouts)"
SPEC_SOURCE = "spec.rollout.freeze"


def freeze_source(spec: SpeculativeModelSpec, fleet_frozen: bool) -> str | None:
    """Who froze the model's rollouts; None when nothing did."""
    if spec.rollout.freeze:
        return SPEC_SOURCE
    return FLEET_SOURCE if fleet_frozen else None


def hold_source(spec: SpeculativeModelSpec, fleet_frozen: bool, in_flight: RolloutsInFlight | None) -> str | None:
    """What holds the model's rollouts and K changes: a freeze first (it also holds a canary in flight), else the
    fleet's rollout limit while the model has no slot; None when nothing does."""
    return freeze_source(spec, fleet_frozen) or queue_source(in_flight)


def frozen_finding(
    source: str | None, pools: Mapping[str, str], k_waiting: str | None, queued: bool = False
) -> Finding | None:
    """Progressing's words for what holds rollouts: a freeze (RolloutsFrozen), or with `queued` the fleet's rollout
    limit (RolloutQueued, reconcile/rollout_limit.py); its source, then what each held pool keeps (a revision, or a
    canary at its step) and the K change that waits. None when nothing holds."""
    if source is None:
        return None
    waiting = [f"pool {pool} keeps {kept}" for pool, kept in sorted(pools.items())]
    if k_waiting is not None:
        waiting.append(k_waiting)
    detail = "; ".join(waiting) if waiting else "nothing waits"
    if queued:
        return Finding("RolloutQueued", f"rollouts and K changes wait for {source}: {detail}")
    return Finding("RolloutsFrozen", f"rollouts and K changes frozen by {source}: {detail}")
