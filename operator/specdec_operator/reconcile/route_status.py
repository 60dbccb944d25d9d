"""What the Gateway says about the HTTPRoute we write weights into: its status.parents[].conditions. Pure.

Every Gateway the route is attached to reports, per parentRef, `Accepted` (the Gateway takes the route: its
listeners allow it, its hostnames and kinds are supported) and `ResolvedRefs` (every backendRef resolves: the
Service exists, and one in another namespace is allowed by a ReferenceGrant there). A route that a Gateway
refuses sends no traffic, or only part of it, where our weights say; the model says so in a condition with the
Gateway's own words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

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


def route_verdict(namespace: str, name: str, route: Mapping[str, Any] | None) -> RouteVerdict | None:
    """None while every reporting Gateway accepts the route and resolves its refs, or none reports yet.

    A condition about an older generation of the route (observedGeneration behind metadata.generation) is
    about weights or refs we have since changed, so it is left out until the Gateway catches up.
    """
    where = f"HTTPRoute {namespace}/{name}"
    if route is None:
        return RouteVerdict("HTTPRouteNotFound", f"{where} not found: no traffic reaches the canary through it")
    generation = (route.get("metadata") or {}).get("generation")
    problems: list[tuple[str, str]] = []
    for parent in (route.get("status") or {}).get("parents") or []:
        for condition in parent.get("conditions") or []:
            kind = condition.get("type")
            if kind not in ROUTE_CONDITIONS or condition.get("status") != "False":
                continue
            observed = condition.get("observedGeneration")
            if generation is not None and observed is not None and int(observed) < int(generation):
                continue
            detail = condition.get("message") or "no message"
            problems.append((kind, f"{_parent(parent)} reports {kind}=False ({condition.get('reason', 'unknown')}): "
                                   f"{detail}"))
    if not problems:
        return None
    # Not accepted at all outranks accepted-with-unresolved-refs.
    problems.sort(key=lambda problem: ROUTE_CONDITIONS.index(problem[0]))
    return RouteVerdict(REASONS[problems[0][0]], f"{where}: " + "; ".join(message for _, message in problems))
