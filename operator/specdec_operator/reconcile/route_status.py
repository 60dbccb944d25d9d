"""What the Gateway says about the HTTPRoute we write weights into: its status.parents[].conditions. Pure.

Every Gateway the route is attached to reports, per parentRef, `Accepted` (the Gateway takes the route: its
listeners allow it, its hostnames and kinds are supported) and `ResolvedRefs` (every backendRef resolves: the
Service exists, and one in another namespace is allowed by a ReferenceGrant there). A route that a Gateway
refuses sends no traffic, or only part of it, where our weights say; the model says so in a condition with the
Gateway's own words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from specdec_operator.canary.traffic import RouteError, canary_percent, route_weights, weighted_route
from specdec_operator.render.names import service_name

ROUTE_CONDITIONS = ("Accepted", "ResolvedRefs")
REASONS = {"Accepted": "HTTPRouteNotAccepted", "ResolvedRefs": "HTTPRouteRefsNotResolved"}


class RouteVerdict(NamedTuple):
    """A Gateway's refusal of the route, ready to become a condition."""

    reason: str  # HTTPRouteNotAccepted | HTTPRouteRefsNotResolved | HTTPRouteNotFound
    message: str


def _parent(parent: Mapping[str, Any]) -> str:
    ref = parent.get("parentRef") or {}
    kind, namespace, name = ref.get("kind") or "Gateway", ref.get("namespace"), ref.get("name", "?")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _refusals(route: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """(condition type, parent, condition) of every current Accepted=False or ResolvedRefs=False, the route's
    worst first: not accepted at all outranks accepted-with-unresolved-refs.

    A condition about an older generation of the route (observedGeneration behind metadata.generation) is
    about weights or refs we have since changed, so it is left out until the Gateway catches up. No parents at
    all means no Gateway controller reports on the route: nothing is known, nothing refused.
    """
    generation = (route.get("metadata") or {}).get("generation")
    found: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]] = []
    for parent in (route.get("status") or {}).get("parents") or []:
        for condition in parent.get("conditions") or []:
            kind = condition.get("type")
            if kind not in ROUTE_CONDITIONS or condition.get("status") != "False":
                continue
            observed = condition.get("observedGeneration")
            if generation is not None and observed is not None and int(observed) < int(generation):
                continue
            found.append((str(kind), parent, condition))
    found.sort(key=lambda refusal: ROUTE_CONDITIONS.index(refusal[0]))
    return found


def route_verdict(namespace: str, name: str, route: Mapping[str, Any] | None) -> RouteVerdict | None:
    """The model's condition about its route: None while every reporting Gateway accepts the route and resolves
    its refs, or none reports yet; every refusal is named in the message."""
    where = f"HTTPRoute {namespace}/{name}"
    if route is None:
        return RouteVerdict("HTTPRouteNotFound", f"{where} not found: no traffic reaches the canary through it")
    refusals = _refusals(route)
    if not refusals:
        return None
    messages = [f"{_parent(parent)} reports {kind}=False ({condition.get('reason', 'unknown')}): "
                f"{condition.get('message') or 'no message'}" for kind, parent, condition in refusals]
    return RouteVerdict(REASONS[refusals[0][0]], f"{where}: " + "; ".join(messages))


def gathered_rejection(
    last: tuple[str, str] | None, route: Mapping[str, Any] | None, read: bool, error: str | None
) -> tuple[str, str] | None:
    """Whether a Gateway refuses the model's HTTPRoute as gathered this pass. A route that could not be read
    keeps what its last read said (`last`: unread is not accepted); a model without a route has nothing
    refused."""
    if read:
        return route_rejection(dict(route)) if route is not None else None
    return None if error is None else last


def route_rejection(route: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the route's worst refusal, from the same judgement as `route_verdict`: what holds a
    canary step (`gathered_rejection`, which the pass remembers for a pass that cannot read the route;
    canary/verdict.py route_hold turns a Pass into Inconclusive) and holds a higher weight (`route_step`)."""
    refusals = _refusals(route)
    if not refusals:
        return None
    kind, parent, condition = refusals[0]
    detail = condition.get("message") or condition.get("reason") or "no detail"
    return REASONS[kind], f"{_parent(parent)} reports {kind}=False ({condition.get('reason', 'unknown')}): {detail}"


@dataclass(frozen=True)
class RouteStep:
    """What the pass does to the HTTPRoute it owns weights in: the route to apply (None: nothing to change), and
    the problem to post (reason, message) instead. `accepted`: no Gateway refuses the route (a problem posted
    before is over)."""

    apply: dict[str, Any] | None = None
    problem: tuple[str, str] | None = None
    accepted: bool = False
    current: int | None = None  # the canary's percent in the route as read


def route_step(route: Mapping[str, Any] | None, model: str, namespace: str, where: str, weight: int) -> RouteStep:
    """Give the model's canary Service `weight` percent in every rule of `route` (at `where`, "namespace/name")
    that routes to its stable Service, in `namespace` (the model's). More traffic must not go where a Gateway
    says it cannot: that weight is held; less traffic (a rollback) always goes through."""
    if route is None:
        return RouteStep(problem=("HTTPRouteNotFound", f"HTTPRoute {where} not found"))
    stable, canary = service_name(model, "stable"), service_name(model, "canary")
    wire = dict(route)
    current = canary_percent(route_weights(wire, namespace, stable, canary))
    rejection = route_rejection(wire)
    if rejection is not None and (current is None or weight > current):
        # The canary's analysis reads the same rejection from the route it gathered and holds the step
        # (canary/verdict.py route_hold).
        return RouteStep(problem=(rejection[0], f"canary weight held at {current}% instead of {weight}%: "
                                                f"{rejection[1]}"), current=current)
    accepted = rejection is None
    if current == weight:
        return RouteStep(accepted=accepted, current=current)
    try:
        return RouteStep(apply=weighted_route(wire, namespace, stable, canary, weight), accepted=accepted,
                         current=current)
    except RouteError as error:
        return RouteStep(problem=("HTTPRouteUnusable", str(error)), accepted=accepted, current=current)
