"""What the canary state machine hands the reconciler: the observed target, the plan, the event."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from specdec_operator.api.status import CanaryStatus

IN_FLIGHT_PHASES = ("Progressing", "Paused")
FULL_WEIGHT = 100


@dataclass(frozen=True)
class CanaryTarget:
    """What the reconciler observed about one pool's revisions.

    `stable_revision` is the revision the stable Deployment is ready at; `desired_revision` the one
    the spec (or a tuner K change, then with `desired_k`) asks for.
    """

    pool: str
    stable_revision: str
    desired_revision: str
    desired_k: int | None = None


@dataclass(frozen=True)
class RolloutPlan:
    """What the reconciler should make true now.

    weight: percent of traffic routed to the canary (HTTPRoute backend).
    sizing_weight: percent the canary Deployment is sized for (`split_replicas`); it leads `weight`
        while a step waits for the canary pods, which must exist before they can become ready.
    keep_canary: False means delete the canary Deployment.
    promote: roll the stable Deployment to the canary revision at the pool's full size; keep the
        canary serving as it is until the stable is ready there (the next call then sees
        stable == desired and releases the canary).
    roll_back: the canary failed or was stopped: all traffic to stable.
    clear_action: remove the one-shot manual action annotation (abort, promote, resume); it was used.
    """

    weight: int
    sizing_weight: int
    keep_canary: bool
    promote: bool = False
    roll_back: bool = False
    clear_action: bool = False


@dataclass(frozen=True)
class CanaryEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class CanaryProgress:
    status: CanaryStatus | None
    plan: RolloutPlan
    event: CanaryEvent | None = None


def split_replicas(total: int, weight: int) -> tuple[int, int]:
    """(stable, canary) replicas for the replica-ratio backend at `weight` percent.

    In a pool of at least one replica the canary keeps one while it has any weight, and the stable
    keeps one until the weight reaches 100: a small pool surges by a replica rather than sending
    everything to one side. A pool scaled to zero stays at zero.
    """
    if total < 0 or not 0 <= weight <= FULL_WEIGHT:
        raise ValueError(f"need total >= 0 and 0 <= weight <= 100, got total={total}, weight={weight}")
    if weight == 0 or total == 0:
        return total, 0
    if weight == FULL_WEIGHT:
        return 0, total
    canary = max(1, math.floor(total * weight / FULL_WEIGHT + 0.5))
    return max(total - canary, 1), canary


def canary_summary(status: CanaryStatus | None) -> str:
    """Short text for the Canary printer column."""
    if status is None:
        return ""
    if status.phase in IN_FLIGHT_PHASES:
        return f"{status.phase} {status.weight}% (step {status.step + 1})"
    return status.phase
