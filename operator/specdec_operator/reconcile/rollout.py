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
from specdec_operator.api.status import CanaryStatus, TuningDecision
from specdec_operator.canary.analysis import Verdict
from specdec_operator.canary.plan import IN_FLIGHT_PHASES, CanaryTarget, split_replicas
from specdec_operator.canary.progress import ManualAction, advance
from specdec_operator.reconcile.desired import DesiredPool
from specdec_operator.reconcile.observed import EventRecord
from specdec_operator.reconcile.tuning_inputs import rolling_pools
from specdec_operator.render.names import deployment_name
from specdec_runtime import contract


@dataclass
class RolloutResult:
    deployments: list[dict[str, Any]] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)
    canary: CanaryStatus | None = None
    events: list[EventRecord] = field(default_factory=list)
    route_weight: int | None = None  # canary percent for the HTTPRoute; None when not routing
    k_reverts: dict[str, int] = field(default_factory=dict)  # rolled-back tuner changes: pool -> stable K
    clear_action: bool = False


def _template_revision(deployment: Mapping[str, Any] | None) -> str | None:
    if deployment is None:
        return None
    labels = deployment.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
    revision = labels.get(contract.LABEL_REVISION)
    return str(revision) if revision else None


def _k_before(decision: TuningDecision | None, pool: str, canary_k: int) -> int | None:
    """The K a tuner change left, from the decision record in status (never from a live object)."""
    if decision is None or decision.pool != pool or decision.to_k != canary_k or decision.action == "Hold":
        return None
    return decision.from_k


def retracked(template: Mapping[str, Any], track: str) -> dict[str, Any]:
    """The same pod template (same revision) for the other track; only the track label differs."""
    copied = copy.deepcopy(dict(template))
    copied["metadata"] = dict(copied.get("metadata", {}))
    copied["metadata"]["labels"] = {**copied["metadata"].get("labels", {}), contract.LABEL_TRACK: track}
    copied["metadata"].pop("creationTimestamp", None)
    return copied


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
    """The revision the stable Deployment is ready at; while it rolls (a promotion), the one it left."""
    revision = _template_revision(live)
    if pool in rolling and previous is not None and previous.pool == pool:
        return previous.stable_revision
    return revision


def plan_rollout(
    pools: Sequence[DesiredPool],
    live: Mapping[str, Mapping[str, Any]],
    previous: CanaryStatus | None,
    rollout: Rollout,
    verdicts: Mapping[str, Verdict | None],
    action: ManualAction | None,
    now: datetime,
    routed: bool,
    last_decision: TuningDecision | None = None,
) -> RolloutResult:
    # With nothing in flight all routed traffic goes to the stable Service.
    result = RolloutResult(canary=previous, route_weight=0 if routed else None)
    rolling = rolling_pools(live.values(), tracks=("stable",))
    canary_pool = _canary_candidate(pools, live, previous, rollout, rolling)
    for pool in pools:
        stable_live = live.get(pool.name)
        if rollout.strategy == "Rolling" or stable_live is None or pool.name != canary_pool:
            held = canary_pool is not None and rollout.strategy == "Canary"
            if held and stable_live is not None and _template_revision(stable_live) != pool.revision:
                # Another pool is canarying (or a failed canary awaits a spec change): keep this one as it is.
                template = stable_live["spec"]["template"]
                result.deployments.append(_with(pool.deployment, template, pool.plan.replicas, "stable"))
            else:
                result.deployments.append(pool.deployment)
            if live.get(deployment_name(pool.name, "canary")) is not None and pool.name != canary_pool:
                result.delete.append(("Deployment", deployment_name(pool.name, "canary")))
            continue
        _canary_pool(result, pool, stable_live, live, previous, rollout, verdicts, action, now, routed, rolling,
                     last_decision)
    return result


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
        promoting = previous.phase == "Promoted" and previous.pool in rolling
        if in_flight or failed_same or promoting:
            return previous.pool
    for pool in pools:
        stable = live.get(pool.name)
        if stable is not None and stable_revision(stable, previous, pool.name, rolling) != pool.revision:
            return pool.name
    return None


def _canary_pool(
    result: RolloutResult,
    pool: DesiredPool,
    stable_live: Mapping[str, Any],
    live: Mapping[str, Mapping[str, Any]],
    previous: CanaryStatus | None,
    rollout: Rollout,
    verdicts: Mapping[str, Verdict | None],
    action: ManualAction | None,
    now: datetime,
    routed: bool,
    rolling: set[str],
    last_decision: TuningDecision | None,
) -> None:
    stable_rev = stable_revision(stable_live, previous, pool.name, rolling) or pool.revision
    current = previous if previous is not None and previous.pool == pool.name else None
    canary_name = deployment_name(pool.name, "canary")
    canary_live = live.get(canary_name)
    canary_ready = (
        canary_live is not None
        and not rolling_pools([canary_live], tracks=("canary",))
        and _template_revision(canary_live) == pool.revision
    )
    target = CanaryTarget(pool.name, stable_rev, pool.revision, desired_k=pool.k)
    progress = advance(
        current, target=target, rollout=rollout, verdict=verdicts.get(pool.revision), now=now, action=action,
        canary_ready=canary_ready,
    )
    result.canary = progress.status if progress.status is not None else previous
    result.clear_action = progress.plan.clear_action
    if progress.event is not None:
        result.events.append(EventRecord(progress.event.type, progress.event.reason, progress.event.message))
    plan = progress.plan
    total = pool.plan.replicas
    stable_template = stable_live["spec"]["template"]
    if plan.promote:
        result.deployments.append(_with(pool.deployment, pool.deployment["spec"]["template"], total, "stable"))
    else:
        stable_size, _ = split_replicas(total, plan.sizing_weight) if not routed else (total, 0)
        result.deployments.append(_with(pool.deployment, stable_template, stable_size, "stable"))
    if plan.keep_canary:
        _, canary_size = split_replicas(total, plan.sizing_weight)
        result.deployments.append(_with(pool.deployment, pool.deployment["spec"]["template"], canary_size, "canary"))
    elif canary_live is not None:
        result.delete.append(("Deployment", canary_name))
    result.route_weight = plan.weight
    rolled_back = progress.status is not None and progress.status.phase in ("RolledBack", "Aborted")
    if rolled_back and progress.status is not None and progress.status.canary_k is not None:
        stable_k = _k_before(last_decision, pool.name, progress.status.canary_k)
        if stable_k is not None and stable_k != pool.k:
            # A tuner K change failed its canary: the pool keeps the K its stable revision runs.
            result.k_reverts[pool.name] = stable_k
