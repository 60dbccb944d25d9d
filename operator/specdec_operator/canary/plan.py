"""What the canary state machine hands the reconciler: the observed target, the plan, the event."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specdec_operator.api.spec import CanaryStep
from specdec_operator.api.status import CanaryStatus

IN_FLIGHT_PHASES = ("Progressing", "Paused")
FULL_WEIGHT = 100


@dataclass(frozen=True)
class CanaryTarget:
    """What the reconciler observed about one pool's revisions.

    `stable_revision` is the revision the stable Deployment is ready at; `desired_revision` the one
    the spec (or a tuner K change, then with `desired_k`) asks for. `decision_id`: the tuner decision
    the desired revision carries out, if a K change is what it rolls out.
    """

    pool: str
    stable_revision: str
    desired_revision: str
    desired_k: int | None = None
    decision_id: str | None = None


@dataclass(frozen=True)
class RolloutPlan:
    """What the reconciler should make true now.

    weight: percent of traffic routed to the canary (HTTPRoute backend).
    sizing_weight: percent the canary Deployment is sized for (`split_canary_replicas`); it leads `weight`
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


def split_canary_replicas(total: int, weight: int) -> tuple[int, int]:
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


def step_canary_replicas(total: int, steps: Sequence[CanaryStep], step: int) -> int:
    """The canary replicas a step needs Ready before it starts or passes: its weight's share of the pool
    (`split_canary_replicas`); a step index past the last reads the last step."""
    return split_canary_replicas(total, steps[min(step, len(steps) - 1)].weight)[1]


def equal_load_percent(total: int, weight: int) -> int:
    """The canary's share of a route at a step of `weight` percent: its share of the step's replicas.

    Behind an HTTPRoute the route's weights decide each side's requests and the replicas decide how they
    spread, so a canary pod and a stable pod carry the same offered load only when the route's split is the
    replica split (Argo Rollouts' `setCanaryScale: {matchTrafficWeight: true}` read the other way round). The
    replicas come from `split_canary_replicas`, as without a route, so both backends split alike; the route weight
    is that split to the whole percent (a per-pod load within half a percent of traffic of equal).
    """
    stable, canary = split_canary_replicas(total, weight)
    return replica_share_percent(stable, canary)


def replica_share_percent(stable: int, canary: int) -> int:
    """The canary's share of the serving replicas, to the whole percent: at least 1 while it has a replica."""
    if canary == 0:
        return 0
    return max(1, math.floor(FULL_WEIGHT * canary / (stable + canary) + 0.5))


@dataclass(frozen=True)
class ServingReplicas:
    """Ready replicas of each track now, and the canary Deployment's current size."""

    stable_ready: int
    canary_ready: int
    canary_size: int


def in_place_canary_size(total: int, target: int, serving: ServingReplicas, max_unavailable: int) -> int:
    """The canary size to set now when the pool has no free GPUs; the stable Deployment gets `total` minus it.

    Like Argo Rollouts' dynamic stable scale: the canary's replicas come out of the stable set, so the two
    never hold more than `total` replicas' GPUs. The canary moves towards `target` one budget at a time:
    a size is taken only if the replicas still ready after the move (stable replicas that remain, canary
    replicas already ready) are at least `total - max_unavailable`; otherwise it waits for readiness.
    Growing takes stable replicas out for new canary ones; shrinking (a promotion handing over to the new
    stable revision) takes canary replicas out for new stable ones.
    """
    if total < 0 or not 0 <= target <= total or max_unavailable < 1:
        raise ValueError(f"need 0 <= target <= total and max_unavailable >= 1, got {total}, {target}, "
                         f"{max_unavailable}")
    floor = total - max_unavailable
    current = min(serving.canary_size, total)

    def serving_after(canary: int) -> int:
        return min(serving.stable_ready, total - canary) + min(serving.canary_ready, canary)

    size = current
    step = 1 if target > current else -1
    for candidate in range(current + step, target + step, step):
        if serving_after(candidate) < floor:
            break
        size = candidate
    return size


def canary_summary(status: CanaryStatus | None) -> str:
    """Short text for the Canary printer column."""
    if status is None:
        return ""
    if status.phase in IN_FLIGHT_PHASES:
        return f"{status.phase} {status.weight}% (step {status.step + 1})"
    return status.phase
