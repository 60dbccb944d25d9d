"""How each pool's Deployments move to their desired revision: directly (Rolling) or through a canary.

Pure: the canary state machine (canary/progress.py) decides; this module turns its plan into the stable
and canary Deployments, the canary status and the traffic weight. One pool canaries at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specdec_operator.api.spec import Rollout
from specdec_operator.api.status import CanaryStatus, RejectedK, TuningDecision
from specdec_operator.canary.analysis import Verdict
from specdec_operator.canary.plan import (
    FULL_WEIGHT,
    IN_FLIGHT_PHASES,
    CanaryEvent,
    CanaryTarget,
    RolloutPlan,
    ServingReplicas,
    equal_load_percent,
    in_place_canary_size,
    split_canary_replicas,
    step_canary_replicas,
)
from specdec_operator.canary.progress import ManualAction, StepObservation, advance
from specdec_operator.decisions.capacity import RolloutMode
from specdec_operator.reconcile.desired import DesiredPool
from specdec_operator.reconcile.observed import EventRecord
from specdec_operator.reconcile.tuning_inputs import rolling_pools
from specdec_operator.render.names import deployment_name
from specdec_operator.render.pool import deployment_revision, rolling_strategy
from specdec_operator.timestamps import format_stamp
from specdec_runtime import contract


@dataclass
class RolloutResult:
    deployments: list[dict[str, Any]] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)
    canary: CanaryStatus | None = None
    events: list[EventRecord] = field(default_factory=list)
    route_weight: int | None = None  # canary percent for the HTTPRoute; None when not routing
    k_reverts: dict[str, int] = field(default_factory=dict)  # rolled-back tuner changes: pool -> stable K
    # A tuner K change whose canary failed in this pass: the record the tuner reads before it decides again.
    rejected: RejectedK | None = None
    clear_action: bool = False
    # Pools held as they are: their canary is in flight but their stable Deployment was not observed, so
    # nothing is written for their Deployments (the live ones here are kept) and the route is left alone.
    held: list[str] = field(default_factory=list)
    kept: list[Mapping[str, Any]] = field(default_factory=list)  # live Deployments of held pools, untouched
    # Pools a change freeze holds (reconcile/freeze.py) -> what they keep; a held pool's live Deployments are in
    # `kept`, and the route is left alone while one of them has a canary.
    frozen: dict[str, str] = field(default_factory=dict)
    # Pool -> the revision its stable Deployment keeps under a freeze (what it is to serve meanwhile).
    frozen_revisions: dict[str, str] = field(default_factory=dict)


def _k_before(decision: TuningDecision | None, pool: str, canary_k: int) -> int | None:
    """The K a tuner change left, from the decision record in status (never from a live object)."""
    if decision is None or decision.pool != pool or decision.to_k != canary_k or decision.action == "Hold":
        return None
    return decision.from_k


def _decision_id(decision: TuningDecision | None, pool: DesiredPool, previous: CanaryStatus | None) -> str | None:
    """The recorded tuner decision the pool's desired revision carries out, if it is a K change not yet
    rolled out: a decision that an earlier canary of another revision already carried is spent (a later
    spec change at that K is not the tuner's)."""
    if decision is None or not decision.id or decision.action == "Hold" or decision.from_k == decision.to_k:
        return None
    if decision.pool != pool.name or decision.to_k != pool.k:
        return None
    if previous is not None and previous.decision_id == decision.id and previous.canary_revision != pool.revision:
        return None
    return decision.id


def _rolled_out_event(decision: TuningDecision, pool: str) -> EventRecord:
    """KChanged (or KExplore) once the canary carrying the decision is promoted: the change is real now."""
    reason = "KChanged" if decision.action == "Change" else "KExplore"
    return EventRecord("Normal", reason, (
        f"{pool}: K {decision.from_k} -> {decision.to_k} rolled out (canary promoted), predicted gain "
        f"{decision.predicted_gain:+.1%}, confidence {decision.confidence:.0%}: {decision.reason} "
        f"(decision {decision.id})"
    ))


def retracked(template: Mapping[str, Any], track: str) -> dict[str, Any]:
    """The same pod template (same revision) for the other track; only the track label differs."""
    copied = copy.deepcopy(dict(template))
    copied["metadata"] = dict(copied.get("metadata", {}))
    copied["metadata"]["labels"] = {**copied["metadata"].get("labels", {}), contract.LABEL_TRACK: track}
    copied["metadata"].pop("creationTimestamp", None)
    return copied


def _ready_replicas(deployment: Mapping[str, Any] | None) -> int:
    return int((deployment or {}).get("status", {}).get("readyReplicas", 0) or 0)


def _size(deployment: Mapping[str, Any] | None) -> int:
    return int((deployment or {}).get("spec", {}).get("replicas", 0) or 0)


def with_strategy(deployment: Mapping[str, Any], mode: RolloutMode | None) -> dict[str, Any]:
    """The Deployment with the rolling update its pool's rollout mode allows (the default without one)."""
    body = copy.deepcopy(dict(deployment))
    body["spec"]["strategy"] = rolling_strategy(mode.max_surge, mode.max_unavailable) if mode else rolling_strategy()
    return body


def _with(deployment: Mapping[str, Any], template: Mapping[str, Any], replicas: int, track: str) -> dict[str, Any]:
    """A copy of our desired Deployment with another template, size and track."""
    body = copy.deepcopy(dict(deployment))
    pool = body["metadata"]["labels"][contract.LABEL_POOL]
    body["metadata"]["name"] = deployment_name(pool, track)
    body["metadata"]["labels"] = {**body["metadata"]["labels"], contract.LABEL_TRACK: track}
    body["spec"]["replicas"] = replicas
    body["spec"]["selector"]["matchLabels"][contract.LABEL_TRACK] = track
    body["spec"]["template"] = retracked(template, track)
    return body


def stable_revision(
    live: Mapping[str, Any] | None, previous: CanaryStatus | None, pool: str, rolling: set[str]
) -> str | None:
    """The revision the stable Deployment serves.

    While the pool's canary is in flight, status.canary.stableRevision says it: the one source of truth for
    that fact, so a live template read from a cache that lags (a replica that just took over), edited by hand
    or rolled by mistake never turns into "the desired revision is the stable one again". While the stable
    rolls (a promotion), the revision it left; otherwise the live template's.
    """
    if previous is not None and previous.pool == pool and (previous.phase in IN_FLIGHT_PHASES or pool in rolling):
        return previous.stable_revision
    return deployment_revision(live)


def _stable_unrenderable(pool: DesiredPool, previous: CanaryStatus | None, rollout: Rollout) -> bool:
    """The pool's canary is in flight and its stable revision is not the desired one: the spec renders only the
    desired (the canary's) revision, so a stable Deployment rendered now would roll the canary out unanalysed."""
    return (
        rollout.strategy == "Canary" and previous is not None and previous.pool == pool.name
        and previous.phase in IN_FLIGHT_PHASES and previous.stable_revision != pool.revision
    )


@dataclass(frozen=True)
class RolloutInputs:
    """Everything rollout planning reads, gathered and parsed once by the evaluation (reconcile/plan.py).

    `live`: the model's live Deployments by name. `previous`: status.canary as stored. `verdicts`: the canary
    analysis per revision. `modes`: each pool's rollout mode (reconcile/capacity.py); a pool without one surges
    as by default. `last_decision`: the tuner's decision record in status, the K a failed tuner canary returns
    to. `route_percent`: the canary's share in the HTTPRoute as read this pass (None: no route, or unread).
    """

    pools: Sequence[DesiredPool]
    live: Mapping[str, Mapping[str, Any]]
    previous: CanaryStatus | None
    rollout: Rollout
    now: datetime
    routed: bool
    verdicts: Mapping[str, Verdict | None] = field(default_factory=dict)
    action: ManualAction | None = None
    modes: Mapping[str, RolloutMode] = field(default_factory=dict)
    last_decision: TuningDecision | None = None
    route_percent: int | None = None
    # A change freeze's source (reconcile/freeze.py): no pod template moves and no canary starts; one in flight
    # holds at its step as if paused.
    frozen: str | None = None

    def in_place_budget(self, pool: str) -> int:
        """Replicas an in-place canary takes out of the stable set at a time; 0 when the pool surges."""
        mode = self.modes.get(pool)
        return mode.max_unavailable if mode is not None and mode.mode == "InPlace" else 0


def plan_rollout(inputs: RolloutInputs) -> RolloutResult:
    """Each pool's Deployments, the canary status and the route weight, for the pools as rendered from status."""
    result = _plan_rollout(inputs)
    result.deployments = [
        with_strategy(body, inputs.modes.get(body["metadata"]["labels"][contract.LABEL_POOL]))
        for body in result.deployments
    ]
    return result


def _plan_rollout(inputs: RolloutInputs) -> RolloutResult:
    live, previous, rollout = inputs.live, inputs.previous, inputs.rollout
    # With nothing in flight all routed traffic goes to the stable Service.
    result = RolloutResult(canary=previous, route_weight=0 if inputs.routed else None)
    rolling = rolling_pools(live.values(), tracks=("stable",))
    canary_pool = _canary_candidate(inputs.pools, live, previous, rollout, rolling)
    for pool in inputs.pools:
        stable_live = live.get(pool.name)
        if inputs.frozen and stable_live is not None and _freeze_holds(inputs, pool, stable_live):
            _hold_frozen(result, inputs, pool, stable_live)
            continue
        if stable_live is None and _stable_unrenderable(pool, previous, rollout):
            # Not observed is not absent: a replica that took over may read its watch cache before the
            # Deployments are listed again. Hold the pool until its stable Deployment is seen.
            result.held.append(pool.name)
            result.kept += [body for name in (pool.name, deployment_name(pool.name, "canary"))
                            if (body := live.get(name)) is not None]
            result.route_weight = None
            continue
        if rollout.strategy == "Rolling" or stable_live is None or pool.name != canary_pool:
            held = canary_pool is not None and rollout.strategy == "Canary"
            if held and stable_live is not None and deployment_revision(stable_live) != pool.revision:
                # Another pool is canarying (or a failed canary awaits a spec change): keep this one as it is.
                template = stable_live["spec"]["template"]
                result.deployments.append(_with(pool.deployment, template, pool.plan.replicas, "stable"))
            else:
                result.deployments.append(pool.deployment)
            if live.get(deployment_name(pool.name, "canary")) is not None and pool.name != canary_pool:
                result.delete.append(("Deployment", deployment_name(pool.name, "canary")))
            continue
        _canary_pool(result, inputs, pool, stable_live, rolling)
    return result


def _running_canary(inputs: RolloutInputs, pool: DesiredPool) -> CanaryStatus | None:
    previous = inputs.previous
    in_flight = previous is not None and previous.pool == pool.name and previous.phase in IN_FLIGHT_PHASES
    return previous if in_flight else None


def _freeze_holds(inputs: RolloutInputs, pool: DesiredPool, stable_live: Mapping[str, Any]) -> bool:
    """Whether a freeze leaves the pool as it runs: its pod template would change or a canary Deployment would
    move. A canary in flight whose revision is still the one desired is not held here: it holds at its step as
    if paused (`_canary_pool`), so that a failing one still rolls back."""
    running = _running_canary(inputs, pool)
    if running is not None:
        return running.canary_revision != pool.revision
    canary_live = inputs.live.get(deployment_name(pool.name, "canary")) is not None
    return canary_live or deployment_revision(stable_live) != pool.revision


def _hold_frozen(
    result: RolloutResult, inputs: RolloutInputs, pool: DesiredPool, stable_live: Mapping[str, Any]
) -> None:
    """Leave the pool's Deployments as they run, and its route weight where it is if it has a canary."""
    canary_live = inputs.live.get(deployment_name(pool.name, "canary"))
    result.kept += [body for body in (stable_live, canary_live) if body is not None]
    kept = deployment_revision(stable_live) or pool.revision
    result.frozen_revisions[pool.name] = kept
    running = _running_canary(inputs, pool)
    if running is not None:
        result.frozen[pool.name] = f"{_canary_at(running)}, though the spec asks for revision {pool.revision}"
    else:
        result.frozen[pool.name] = f"revision {kept}"
    if canary_live is not None or running is not None:
        result.route_weight = None


def _canary_at(canary: CanaryStatus) -> str:
    """How Progressing names a canary a freeze holds."""
    return f"its canary {canary.canary_revision} at step {canary.step + 1} ({canary.weight}%)"


def _canary_candidate(
    pools: Sequence[DesiredPool],
    live: Mapping[str, Mapping[str, Any]],
    previous: CanaryStatus | None,
    rollout: Rollout,
    rolling: set[str],
) -> str | None:
    if rollout.strategy != "Canary":
        return None
    names = {pool.name: pool for pool in pools}
    if previous is not None and previous.pool in names:
        pool = names[previous.pool]
        in_flight = previous.phase in IN_FLIGHT_PHASES
        failed_same = previous.phase in ("RolledBack", "Aborted") and previous.canary_revision == pool.revision
        # A promotion lasts until the stable Deployment is rolled and the canary is gone (an in-place
        # promotion hands the canary's replicas back to the stable one at a time).
        handing_over = live.get(deployment_name(previous.pool, "canary")) is not None
        promoting = previous.phase == "Promoted" and (previous.pool in rolling or handing_over)
        if in_flight or failed_same or promoting:
            return previous.pool
    for pool in pools:
        stable = live.get(pool.name)
        if stable is not None and stable_revision(stable, previous, pool.name, rolling) != pool.revision:
            return pool.name
    return None


def _canary_pool(
    result: RolloutResult,
    inputs: RolloutInputs,
    pool: DesiredPool,
    stable_live: Mapping[str, Any],
    rolling: set[str],
) -> None:
    """The pool that canaries: the state machine's step, then its Deployments' sizes and the route weight.

    With an in-place budget (`RolloutInputs.in_place_budget`) the pool is full, so the canary takes that many
    replicas at a time out of the stable set instead of adding its own beside it."""
    previous, rollout, verdicts, now = inputs.previous, inputs.rollout, inputs.verdicts, inputs.now
    last_decision, in_place_budget = inputs.last_decision, inputs.in_place_budget(pool.name)
    stable_rev = stable_revision(stable_live, previous, pool.name, rolling) or pool.revision
    current = previous if previous is not None and previous.pool == pool.name else None
    canary_name = deployment_name(pool.name, "canary")
    canary_live = inputs.live.get(canary_name)
    total = pool.plan.replicas
    canary_ready = (
        canary_live is not None
        and not rolling_pools([canary_live], tracks=("canary",))
        and deployment_revision(canary_live) == pool.revision
    )
    if in_place_budget and current is not None and current.phase in IN_FLIGHT_PHASES and rollout.canary:
        # In place the canary grows a budget at a time: its step starts once it has all of the step's replicas.
        steps = rollout.canary.steps
        step_target = step_canary_replicas(total, steps, current.step)
        canary_ready = canary_ready and _size(canary_live) >= step_target
    target = CanaryTarget(pool.name, stable_rev, pool.revision, desired_k=pool.k,
                          decision_id=_decision_id(last_decision, pool, current))
    in_step = current is not None and current.phase in IN_FLIGHT_PHASES and current.weight > 0
    route_target = equal_load_percent(total, current.weight) if in_step and current is not None else None
    seen = StepObservation(verdicts.get(pool.revision), canary_ready, inputs.route_percent, route_target,
                           pool_replicas=total)
    progress = advance(current, target=target, rollout=rollout, now=now, action=inputs.action, seen=seen,
                       frozen=inputs.frozen)
    if inputs.frozen is not None and progress.status is not None and progress.status.phase in IN_FLIGHT_PHASES:
        result.frozen[pool.name] = _canary_at(progress.status)
    result.canary = progress.status if progress.status is not None else previous
    result.clear_action = progress.plan.clear_action
    if progress.event is not None:
        result.events.append(EventRecord(progress.event.type, progress.event.reason, progress.event.message))
    plan = progress.plan
    stable_template = stable_live["spec"]["template"]
    serving = ServingReplicas(_ready_replicas(stable_live), _ready_replicas(canary_live), _size(canary_live))
    if in_place_budget and total > 0:
        _in_place_sizes(result, pool, plan, stable_template, serving, in_place_budget, deployment_revision(canary_live))
    else:
        _surge_sizes(result, pool, plan, stable_template, serving, canary_live is not None)
    # The route follows the replica split, so both sides' pods carry the same load (docs/canary.md).
    routing_step = plan.keep_canary and not plan.promote and 0 < plan.weight < FULL_WEIGHT
    result.route_weight = equal_load_percent(total, plan.weight) if routing_step else plan.weight
    _record_tuner_outcome(result, inputs, pool, progress.status, progress.event)


def _record_tuner_outcome(
    result: RolloutResult,
    inputs: RolloutInputs,
    pool: DesiredPool,
    finished: CanaryStatus | None,
    event: CanaryEvent | None,
) -> None:
    """What a canary that carried a tuner K change means for the tuner: a failed one returns the pool to the K
    its stable revision runs and is recorded as rejected; a promoted one is the K change rolled out."""
    last_decision = inputs.last_decision
    rolled_back = finished is not None and finished.phase in ("RolledBack", "Aborted")
    if rolled_back and finished is not None and finished.canary_k is not None:
        stable_k = _k_before(last_decision, pool.name, finished.canary_k)
        if stable_k is not None and stable_k != pool.k:
            # A tuner K change failed its canary: the pool keeps the K its stable revision runs.
            result.k_reverts[pool.name] = stable_k
    just_ended = event is not None and finished is not None and finished.phase in ("RolledBack", "Promoted")
    carried = (last_decision if finished is not None and last_decision is not None
               and finished.decision_id == last_decision.id else None)
    if just_ended and finished is not None and carried is not None:
        if finished.phase == "Promoted":
            result.events.append(_rolled_out_event(carried, pool.name))
        else:
            result.rejected = RejectedK(pool=pool.name, k=carried.to_k, stable_revision=finished.stable_revision,
                                        time=format_stamp(inputs.now), predicted_gain=carried.predicted_gain,
                                        reason=_rollback_reason(inputs.verdicts.get(pool.revision), event))


def _rollback_reason(verdict: Verdict | None, event: CanaryEvent | None) -> str:
    """The failed verdict's reason (TPOTExceeded, ...), or the event's when the step timed out."""
    if verdict is not None and verdict.outcome == "Fail":
        return verdict.reason
    return event.reason if event is not None else ""


def _surge_sizes(
    result: RolloutResult,
    pool: DesiredPool,
    plan: RolloutPlan,
    stable_template: Mapping[str, Any],
    serving: ServingReplicas,
    canary_exists: bool,
) -> None:
    """Sizes with free GPUs: the canary's replicas beside the stable ones.

    Behind a route as without one the step's replicas are `split_canary_replicas` (the route's weight follows that
    split, `equal_load_percent`), so a canary pod and a stable pod carry the same load. The stable gives up a
    replica only for a canary replica that is ready, so serving replicas never drop.
    """
    total = pool.plan.replicas
    if plan.promote:
        result.deployments.append(_with(pool.deployment, pool.deployment["spec"]["template"], total, "stable"))
    else:
        stable_size, canary_target = split_canary_replicas(total, plan.sizing_weight)
        stable_size = max(stable_size, total - min(serving.canary_ready, canary_target))
        result.deployments.append(_with(pool.deployment, stable_template, stable_size, "stable"))
    if plan.keep_canary:
        _, canary_size = split_canary_replicas(total, plan.sizing_weight)
        result.deployments.append(_with(pool.deployment, pool.deployment["spec"]["template"], canary_size, "canary"))
    elif canary_exists:
        result.delete.append(("Deployment", deployment_name(pool.name, "canary")))


def _in_place_sizes(
    result: RolloutResult,
    pool: DesiredPool,
    plan: RolloutPlan,
    stable_template: Mapping[str, Any],
    serving: ServingReplicas,
    budget: int,
    canary_revision: str | None,
) -> None:
    """Sizes on a full pool: stable + canary replicas == total, moved a budget at a time.

    `canary_revision` is the live canary Deployment's revision (None: no canary Deployment).
    """
    total = pool.plan.replicas
    promote, keep_canary, sizing_weight = plan.promote, plan.keep_canary, plan.sizing_weight
    canary_name = deployment_name(pool.name, "canary")
    desired_template = pool.deployment["spec"]["template"]
    canary_exists = canary_revision is not None
    stable_at_desired = deployment_revision({"spec": {"template": stable_template}}) == pool.revision
    handing_over = not keep_canary and canary_revision == pool.revision and stable_at_desired
    if promote or handing_over:
        # The stable Deployment runs the new revision; it takes the canary's replicas back one budget at a time.
        canary = in_place_canary_size(total, 0, serving, budget)
        result.deployments.append(_with(pool.deployment, desired_template, total - canary, "stable"))
        if canary > 0:
            result.deployments.append(_with(pool.deployment, desired_template, canary, "canary"))
        else:
            result.delete.append(("Deployment", canary_name))
        return
    if keep_canary:
        target = split_canary_replicas(total, sizing_weight)[1]
        canary = in_place_canary_size(total, target, serving, budget)
        result.deployments.append(_with(pool.deployment, stable_template, total - canary, "stable"))
        result.deployments.append(_with(pool.deployment, desired_template, canary, "canary"))
        return
    # Rolled back or idle: the canary (failed or cancelled) goes at once; the stable refills its GPUs.
    result.deployments.append(_with(pool.deployment, stable_template, total, "stable"))
    if canary_exists:
        result.delete.append(("Deployment", canary_name))
