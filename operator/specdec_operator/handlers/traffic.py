"""Writes that follow a reconcile's plan outside owned objects: HTTPRoute weights, the one-shot annotation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import kopf

from specdec_operator import GROUP, KIND
from specdec_operator.canary.traffic import route_reference_granted
from specdec_operator.handlers.context import Logger, OperatorContext
from specdec_operator.kube.api import KubeApiError
from specdec_operator.reconcile.observed import ObservedModel
from specdec_operator.reconcile.plan import ReconcilePlan


def route_ref(namespace: str, spec: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of the HTTPRoute the spec names, read from the raw spec (validation comes later)."""
    rollout = spec.get("rollout") if isinstance(spec, Mapping) else None
    canary = rollout.get("canary") if isinstance(rollout, Mapping) else None
    traffic = canary.get("traffic") if isinstance(canary, Mapping) else None
    ref = traffic.get("httpRouteRef") if isinstance(traffic, Mapping) else None
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    return str(ref.get("namespace") or namespace), str(ref["name"])


class RouteReading(NamedTuple):
    """The HTTPRoute as gathered: the object (with the status its Gateways wrote), whether it was read, and if it
    was not, why (the API server's words, or the missing grant); `not_permitted` marks the missing grant."""

    route: dict[str, Any] | None = None
    read: bool = False
    error: str | None = None
    not_permitted: bool = False


async def read_route(
    ctx: OperatorContext, namespace: str, spec: Mapping[str, Any], logger: Logger | None = None
) -> RouteReading:
    """Gather: the HTTPRoute the model routes through. One GET per pass, shared with sync_route; a route in another
    namespace only with a ReferenceGrant there (issue 34, item 12: that namespace's owner consents, as the
    Gateway API asks of a route that refers to a Service elsewhere), which costs one LIST more per pass."""
    ref = route_ref(namespace, spec)
    if ref is None:
        return RouteReading()
    try:
        if ref[0] != namespace and not route_reference_granted(
                await ctx.api.list("ReferenceGrant", ref[0], ""), namespace, ref[1], GROUP, KIND):
            return RouteReading(error=(
                f"HTTPRoute {ref[0]}/{ref[1]} is in another namespace and no ReferenceGrant there lets "
                f"{KIND}s from {namespace} refer to it (spec.rollout.canary.traffic.httpRouteRef; docs/canary.md)"),
                not_permitted=True)
        return RouteReading(await ctx.api.get("HTTPRoute", *ref), True)
    except KubeApiError as error:
        if logger is not None:
            logger.warning("HTTPRoute %s/%s unreadable this pass: %s", *ref, error)
        return RouteReading(error=f"HTTPRoute {ref[0]}/{ref[1]} cannot be read: {error}")


async def sync_route(
    ctx: OperatorContext, body: kopf.Body, observed: ObservedModel, plan: ReconcilePlan, logger: Logger
) -> bool:
    """Apply the HTTPRoute change the pass decided (`plan.route_step`, from the route it gathered); returns whether
    the route was written. The loop runs every few seconds: an unchanged problem is posted once, not once per
    loop."""
    step = plan.route_step
    if step is None or plan.route is None:
        return False
    memory = ctx.model(observed.namespace, observed.name)
    if step.accepted:
        memory.route_warning = None
    if step.problem is not None:
        if memory.route_warning != step.problem:
            memory.route_warning = step.problem
            kopf.warn(body, reason=step.problem[0], message=step.problem[1])
        return False
    if step.apply is None:
        return False
    namespace = plan.route.namespace or observed.namespace
    try:
        await ctx.api.apply(step.apply)
    except KubeApiError as error:
        if error.status == 409:  # edited since we read it; the next loop reads it again
            logger.info("HTTPRoute %s/%s changed under us; retrying next round", namespace, plan.route.name)
            return False
        raise
    logger.info("HTTPRoute %s/%s: canary weight %d%%", namespace, plan.route.name, plan.route_weight)
    return True
