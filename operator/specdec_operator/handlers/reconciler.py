"""Gather the observed state of one SpeculativeModel, evaluate it with pure functions, then write."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from specdec_operator import KIND
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.gpu.inventory import NodeGpus, PodGpus
from specdec_operator.handlers.context import Logger, OperatorContext
from specdec_operator.handlers.traffic import clear_manual_action, sync_route
from specdec_operator.handlers.tuning import TuningOutcome, tuning_step
from specdec_operator.kube.api import KubeApiError
from specdec_operator.metrics import RECONCILE_SECONDS, RECONCILES, ROLLOUTS
from specdec_operator.reconcile.observed import ObservedModel
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate, parse_previous_status
from specdec_operator.reconcile.tuning_inputs import rolling_pools
from specdec_operator.render.names import label_value
from specdec_runtime import contract

OWNED_KINDS = ("Deployment", "ConfigMap", "Service", "PodDisruptionBudget")
# Canary events that end a rollout, and the result label they count under.
ROLLOUT_RESULTS = {
    "CanaryPromoted": "promoted",
    "CanaryFailed": "rolledback",
    "CanaryTimedOut": "rolledback",
    "CanaryAborted": "aborted",
    "CanaryCancelled": "cancelled",
}


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def gather(
    ctx: OperatorContext, body: Mapping[str, Any], nodes: Sequence[NodeGpus], gpu_pods: Sequence[PodGpus] = ()
) -> ObservedModel:
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    selector = f"{contract.LABEL_MODEL}={label_value(name)},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
    children: dict[tuple[str, str], Mapping[str, Any]] = {}
    for kind in OWNED_KINDS:
        for child in await ctx.api.list(kind, namespace, selector):
            owners = child["metadata"].get("ownerReferences", [])
            if any(owner.get("uid") == uid for owner in owners):
                children[(kind, child["metadata"]["name"])] = child
    return ObservedModel(
        namespace=namespace,
        name=name,
        uid=uid,
        generation=int(meta.get("generation", 0)),
        spec=dict(body.get("spec", {})),
        status=dict(body.get("status", {})),
        annotations=dict(meta.get("annotations", {})),
        children=children,
        nodes=nodes,
        gpu_pods=gpu_pods,
    )


def changed_paths(old: Any, new: Any, path: str = "status") -> list[str]:
    """Leaf paths whose values differ, for a log line that says why a status write happened."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [p for key in sorted(old.keys() | new.keys()) for p in changed_paths(old.get(key), new.get(key),
                                                                                     f"{path}.{key}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True)) for p in changed_paths(a, b, f"{path}[{i}]")]
    return [] if old == new else [path]


async def write(
    ctx: OperatorContext, body: kopf.Body, observed: ObservedModel, plan: ReconcilePlan, logger: Logger
) -> bool:
    """Apply, delete, then status; returns whether the status changed."""
    for obj in plan.apply:
        await ctx.api.apply(obj)
    for kind, name in plan.delete:
        await ctx.api.delete(kind, observed.namespace, name)
    if plan.status is None:
        return False
    new_status = plan.status.to_wire()
    if new_status == dict(observed.status):
        return False
    logger.info("status changed: %s", changed_paths(dict(observed.status), new_status))
    await ctx.api.patch_status(KIND, observed.namespace, observed.name, new_status)
    for event in plan.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])
        result = ROLLOUT_RESULTS.get(event.reason)
        if result is not None and plan.status.canary is not None:
            ROLLOUTS.labels(observed.namespace, observed.name, plan.status.canary.pool, result).inc()
    return True


async def _tune(ctx: OperatorContext, observed: ObservedModel, logger: Logger) -> TuningOutcome:
    """Tuning needs a valid spec and pools that exist; anything else is the plan's business to report."""
    try:
        spec = SpeculativeModelSpec.model_validate(dict(observed.spec))
    except ValidationError:
        return TuningOutcome()
    previous = parse_previous_status(observed.status)
    rolling = rolling_pools(observed.children_of_kind("Deployment"))
    try:
        return await tuning_step(ctx, ctx.http, observed, spec, previous, rolling)
    except KubeApiError as error:
        logger.warning("tuning skipped this round: %s", error)
        return TuningOutcome()


async def reconcile(
    ctx: OperatorContext, body: kopf.Body, nodes: Sequence[NodeGpus], logger: Logger, gpu_pods: Sequence[PodGpus] = ()
) -> ReconcilePlan:
    started = time.monotonic()
    try:
        observed = await gather(ctx, body, nodes, gpu_pods)
        tuning = await _tune(ctx, observed, logger)
        plan = evaluate(
            observed, ctx.evaluation_settings, utc_now(), k_overrides=tuning.k_overrides,
            speculation=tuning.speculation, verdicts=tuning.verdicts,
        )
        plan.events.extend(tuning.events)
        # Traffic moves before Deployments: a canary loses its weight before it is deleted.
        await sync_route(ctx, body, observed, plan, logger)
        changed = await write(ctx, body, observed, plan, logger)
        await clear_manual_action(ctx, observed, plan)
    except Exception:
        RECONCILES.labels(result="error").inc()
        raise
    finally:
        RECONCILE_SECONDS.observe(time.monotonic() - started)
    RECONCILES.labels(result="invalid" if plan.invalid_spec else "ok").inc()
    if plan.apply or plan.delete or changed:
        logger.info(
            "reconciled: applied %d, deleted %d, status %s",
            len(plan.apply), len(plan.delete), "written" if changed else "unchanged",
        )
    return plan
