"""One pass over one SpeculativeModel: gather what it needs (I/O), evaluate it with pure functions, then write.

Gather: the model, its owned objects and pods from the watch cache, the refusals known so far, its HTTPRoute,
the scrape round and /health probes into the tuner's and canary's windows (handlers/tuning.py) and the clocks'
now, all in one `ObservedModel`. Decide: `evaluate` (reconcile/plan.py) makes the tuner's K decision, the
canary's verdict (with the route's rejection as gathered), the plan and the conditions from it. Write
(`write`): status through `write_model_status`, the one status writer, then traffic (reconcile/route_status.py
decides the route's change), owned objects, deletions and the one-shot annotation; or, for a K decision, its
record and then the tuner's commit. What the pass did goes on /metrics last.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import kopf

from specdec_operator import KIND
from specdec_operator.canary.progress import CANARY_ACTION_ANNOTATION
from specdec_operator.decisions.capacity import FleetClaims
from specdec_operator.gpu.inventory import NodeGpus
from specdec_operator.handlers.context import Logger, OperatorContext
from specdec_operator.handlers.resync import cache_known
from specdec_operator.handlers.traffic import read_route, sync_route
from specdec_operator.handlers.tuning import commit_tuning, observe_tuning, pace_tuning
from specdec_operator.handlers.writes import apply_owned, newest_body, remember_written, write_status
from specdec_operator.kube.api import KubeApiError
from specdec_operator.metrics import (
    RECONCILE_SECONDS,
    RECONCILES,
    count_k_change,
    count_model_pass,
    count_rollouts,
    set_canary_weight,
    set_model_conditions,
)
from specdec_operator.reconcile.observed import ObservedModel
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from specdec_operator.reconcile.tuning_policy import recorded_decision_id
from specdec_operator.render.names import label_value
from specdec_operator.timestamps import format_stamp
from specdec_operator.tuner.exporter import publish

OWNED_KINDS = ("Deployment", "ConfigMap", "Service", "PodDisruptionBudget")
LOG = logging.getLogger(__name__)
async def gather(
    ctx: OperatorContext, body: Mapping[str, Any], nodes: Sequence[NodeGpus], gpu_claims: FleetClaims | None = None,
    logger: Logger | None = None,
) -> ObservedModel:
    """Everything the pass decides from, read once before anything is decided."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    known = await cache_known(ctx, namespace, name, uid, logger or LOG)
    # Owned objects come from the watch cache, already filtered to our labels and indexed by owner uid.
    children = ctx.cache.children(namespace, uid)
    # What the object writes of earlier passes met (handlers/writes.py apply_owned keeps it).
    refused = ctx.model(namespace, name).refusals
    # The HTTPRoute is not ours (no owner reference, no watch): read it, status and all, once per pass.
    route = await read_route(ctx, namespace, body.get("spec") or {}, logger)
    # One reading of the wall clock for the pass: its status stamps and the canary windows' look agree, so a step
    # this pass starts is never mistaken for one started before this process watched.
    wall_now = ctx.wall_clock()
    observed = ObservedModel(
        namespace=namespace,
        name=name,
        uid=uid,
        generation=int(meta.get("generation", 0)),
        spec=dict(body.get("spec", {})),
        status=dict(body.get("status", {})),
        annotations=dict(meta.get("annotations", {})),
        children=children,
        nodes=nodes,
        gpu_claims=gpu_claims or FleetClaims(),
        pods=ctx.cache.pods(namespace, label_value(name), uid),
        route=route.route,
        route_read=route.read,
        route_error=route.error,
        route_not_permitted=route.not_permitted,
        children_known=known,
        refusals=tuple(refused.summary()) if refused is not None else (),
        not_owned=tuple(refused.conflicts()) if refused is not None else (),
        now=format_stamp(wall_now),
    )
    # The scrape round feeds the tuner's and the canary's windows; the pass reads them through observed.tuning.
    return await observe_tuning(ctx, observed, wall_now, logger or LOG)


async def write_model_status(
    ctx: OperatorContext,
    baseline: Mapping[str, Any],
    observed: ObservedModel,
    plan: ReconcilePlan,
    logger: Logger,
) -> dict[str, Any] | None:
    """The plan's decisions and conditions in one merge patch, conditional on the baseline's resourceVersion.
    Returns the stored object, or None when nothing changed.

    With an unreadable status only its conditions are written. A K decision is written with its statistics; if
    the write's answer is lost, a fresh read says whether it is stored (then it counts as written) or not (the
    error is raised: nothing may act on it).
    """
    assert plan.status is not None
    if plan.status_unreadable:
        computed = {**dict(observed.status), "conditions": plan.status.to_wire().get("conditions", [])}
    else:
        computed = plan.status.to_wire()
    decision = plan.tuning.proposal
    try:
        return await write_status(ctx, baseline, computed, logger, force_stats=decision is not None)
    except KubeApiError as error:
        if decision is None:
            raise
        stored = await _decision_stored(ctx, observed, baseline, decision.id)
        if stored is None:
            logger.warning("K decision %s (%s: K %d -> %d) not recorded, the tuner keeps K %d: %s",
                           decision.id, decision.pool, decision.from_k, decision.to_k, decision.from_k, error)
            raise
        # The write reached etcd but its answer was lost (a timeout, or a retry that met our own write as a
        # 409): the record is what counts, so the tuner commits it like any other recorded decision.
        logger.info("K decision %s was stored although its write answered %s", decision.id, error)
        return stored


async def write(
    ctx: OperatorContext,
    body: kopf.Body,
    baseline: Mapping[str, Any],
    observed: ObservedModel,
    plan: ReconcilePlan,
    logger: Logger,
) -> bool:
    """The pass's writes, in order: status once (the decision record), then traffic, then owned objects rendered
    from that status, then the one-shot annotation; the pass's figures on /metrics last. Returns whether the
    status changed. A held plan writes nothing; with an unreadable status only its conditions are written.

    A pass that decides a K change (`plan.tuning.proposal`, recorded alone in `plan.status`) writes that record
    and nothing else, and commits it in the tuner only once it is stored; the next pass (nudged at once) renders
    the Deployments from the recorded K, like any other pass. Refusals the object writes meet are not written
    in this pass: they change the refusal memory, and the next pass (nudged at once) gathers them into its
    conditions, so status has one writer and a pass writes it at most once.
    """
    key = (observed.namespace, observed.name)
    decision = plan.tuning.proposal
    written: dict[str, Any] | None = None
    weighted = committed = conditions_written = False
    try:
        if plan.held is not None and decision is None:
            return False
        if plan.status is not None:
            written = await write_model_status(ctx, baseline, observed, plan, logger)
        if decision is None:
            if written is not None:
                for event in plan.events:
                    kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])
            if not plan.status_unreadable:
                # Traffic moves before Deployments: a canary loses its weight before it is deleted.
                weighted = await sync_route(ctx, body, observed, plan, logger)
                if await apply_owned(ctx, body, key, plan.apply, logger, owned=observed.children.keys()):
                    # A refusal appeared, changed or cleared: the next pass decides Degraded from the refusals
                    # it gathers.
                    ctx.nudge(*key)
                for kind, name in plan.delete:
                    await ctx.api.delete(kind, observed.namespace, name)
            # The objects are written: the conditions' series follow (set with the pass's other figures below).
            conditions_written = plan.status is not None
            if not plan.status_unreadable and plan.clear_action and CANARY_ACTION_ANNOTATION in observed.annotations:
                # A used (or invalid) one-shot action is removed so it cannot fire again; spec stays untouched.
                await ctx.api.patch_merge(KIND, observed.namespace, observed.name,
                                          {"metadata": {"annotations": {CANARY_ACTION_ANNOTATION: None}}})
            return written is not None
        # A K decision: its record is all this pass writes.
        for event in plan.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])
        logger.info("K decision %s recorded: %s K %d -> %d (%s, confidence %.0f%%)", decision.id, decision.pool,
                    decision.from_k, decision.to_k, decision.action, 100 * decision.confidence)
        ctx.nudge(*key)
        # Status holds the decision: only now may the tuner remember it.
        commit_tuning(ctx, observed.namespace, observed.name, plan.tuning)
        committed = True
        return written is not None
    finally:
        # What the pass did, on /metrics, whether or not its later writes went through: the tuner's report, the
        # conditions once the objects are written, the canary's weight once the route carries it, the rollouts
        # and K changes the written events end, and a K change committed without a canary.
        if plan.tuning.report is not None:
            publish(observed.namespace, observed.name, plan.tuning.report)
        if conditions_written and plan.status is not None:
            set_model_conditions(observed.namespace, observed.name,
                                 [(c.type, c.status, c.reason) for c in plan.status.conditions])
        canary = plan.status.canary if plan.status is not None else None
        if weighted:
            set_canary_weight(observed.namespace, observed.name, [pool.name for pool in plan.pools],
                              canary.pool if canary is not None else None, plan.route_weight or 0)
        if written is not None and decision is None and canary is not None:
            count_rollouts(observed.namespace, observed.name, canary.pool, [event.reason for event in plan.events])
        if committed and decision is not None and plan.tuning.rolls_out_now and decision.to_k != decision.from_k:
            count_k_change(observed.namespace, observed.name, decision.pool)  # a rolling K change counts now


async def _decision_stored(
    ctx: OperatorContext, observed: ObservedModel, baseline: Mapping[str, Any], decision_id: str
) -> dict[str, Any] | None:
    """The stored model if its status already records this decision, read fresh (the last write's answer is
    unknown); None otherwise."""
    try:
        fresh = await ctx.api.get(KIND, observed.namespace, observed.name)
    except KubeApiError:
        return None
    if fresh is None or recorded_decision_id(fresh.get("status") or {}) != decision_id:
        return None
    # The next pass's baseline: the write (conditional on the baseline's resourceVersion) came after it.
    remember_written(ctx, (observed.namespace, observed.name), fresh, baseline)
    return dict(fresh)


async def reconcile(
    ctx: OperatorContext, body: kopf.Body, nodes: Sequence[NodeGpus], logger: Logger,
    gpu_claims: FleetClaims | None = None, departures: int | None = None,
) -> ReconcilePlan:
    """One pass. `departures` is the model's departure count when its loop started (OperatorContext.departures):
    a departure since then, even one before this pass began, means the model is no longer this install's."""
    started = ctx.clock()
    key = (str(body["metadata"]["namespace"]), str(body["metadata"]["name"]))
    try:
        # Whether the model is still this install's (its model selector) is the loop's to judge (handlers/register.py).
        baseline = newest_body(ctx, key, body)
        if departures is None:
            departures = ctx.departures.get(key, 0)
        observed = await gather(ctx, baseline, nodes, gpu_claims, logger)
        # The last of the gathering, after its last await: no other pass takes a rollout slot between this view
        # and this pass's record of its plan below, so the fleet's limit holds (handlers/services/rollout_slots.py).
        observed = replace(observed, rollouts_in_flight=ctx.rollout_slots.in_flight(key, ctx.cache.models_rolling_out))
        if ctx.departures.get(key, 0) != departures:
            # The watch said DELETED since the loop started (before this pass, or while it gathered). For a
            # relabel out of the model selector, the API server sends the object as it was before (labels that
            # still match) with the relabel's resourceVersion, and kopf hands that body to the loop: a write
            # from it would pass the resourceVersion check and land after the model became another shard's.
            logger.info("the model left this install's watch during the pass: nothing written")
            RECONCILES.labels(result="ok").inc()
            return ReconcilePlan(held="the model left this install's watch")
        plan = evaluate(observed, ctx.evaluation_settings, observed.now)
        pace_tuning(ctx, observed, plan.tuning)
        # Before the first write's await (see gather): the model takes, keeps or frees its rollout slot.
        ctx.nudge_all(ctx.rollout_slots.record(key, plan.rolls_out, plan.queued))
        changed = await write(ctx, body, baseline, observed, plan, logger)
        if ctx.departures.get(key, 0) == departures:
            # Not for a model that left during the writes: its series are gone and must stay gone.
            count_model_pass(*key)
    except Exception:
        RECONCILES.labels(result="error").inc()
        raise
    finally:
        RECONCILE_SECONDS.observe(ctx.clock() - started)
    if plan.tuning.proposal is not None:
        RECONCILES.labels(result="ok").inc()
        return plan
    if plan.held is not None:
        logger.debug("reconcile held: %s", plan.held)
        RECONCILES.labels(result="ok").inc()
        return plan
    RECONCILES.labels(result="invalid" if plan.invalid_spec else "ok").inc()
    if plan.status_unreadable:
        logger.warning("status unreadable, holding: %s", "; ".join(plan.status_unreadable))
    if plan.apply or plan.delete or changed:
        logger.info(
            "reconciled: applied %d, deleted %d, status %s",
            len(plan.apply), len(plan.delete), "written" if changed else "unchanged",
        )
    return plan
