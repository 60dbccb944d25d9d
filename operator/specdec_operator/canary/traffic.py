"""Gateway API HTTPRoute weights for a canary: the server-side-apply body, and reading weights back.

HTTPRoute's `spec.rules` and each rule's `backendRefs` are atomic lists: server-side apply cannot own
one element, so the body must carry the whole rules list. Only the weights of the backendRefs that
point at our stable and canary Services change; every other rule and backendRef is copied as it was,
and the live `resourceVersion` rides along so the API server refuses the apply (409) if someone
edited the route between our read and our write, instead of our copy undoing their edit.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

GATEWAY_API_VERSION = "gateway.networking.k8s.io/v1"
GATEWAY_GROUP = "gateway.networking.k8s.io"
# Weights on a rule that holds only our two backends are percents; see `_pair_total`.
PERCENT = 100
# Gateway API: a backendRef without a weight weighs 1.
DEFAULT_BACKEND_WEIGHT = 1


class RouteError(ValueError):
    """The HTTPRoute cannot carry this canary (it does not route to the stable Service)."""


class RuleWeights(NamedTuple):
    """Weights of our two backends in one rule (the canary weighs 0 when its backendRef is absent)."""

    rule: int
    stable: int
    canary: int


def _points_at(ref: dict[str, Any], service: str, namespace: str, route_namespace: str) -> bool:
    # Empty group and kind Service are the Gateway API defaults; a missing namespace means the route's.
    return (
        (ref.get("group") or "") == ""
        and (ref.get("kind") or "Service") == "Service"
        and ref.get("name") == service
        and (ref.get("namespace") or route_namespace) == namespace
    )


def _weight(ref: dict[str, Any]) -> int:
    value = ref.get("weight")
    return DEFAULT_BACKEND_WEIGHT if value is None else int(value)


def _route_identity(route: dict[str, Any]) -> tuple[str, str, list[dict[str, Any]]]:
    metadata = route.get("metadata") or {}
    name, route_namespace = metadata.get("name"), metadata.get("namespace")
    rules = (route.get("spec") or {}).get("rules")
    if not name or not route_namespace or not isinstance(rules, list):
        raise RouteError("HTTPRoute needs metadata.name, metadata.namespace and a spec.rules list")
    return name, route_namespace, rules


def _pair_total(refs: list[dict[str, Any]], ours: list[dict[str, Any]]) -> int:
    """The weight our two backends share in a rule.

    When the rule holds only our backends the split is in percent. When other backends share the
    rule, our pair keeps the total weight it has, so their share of the traffic does not move; the
    split is then as fine as that total allows.
    """
    if len(ours) == len(refs):
        return PERCENT
    return sum(_weight(ref) for ref in ours)


def weighted_route(
    route: dict[str, Any], namespace: str, stable_service: str, canary_service: str, canary_weight: int
) -> dict[str, Any]:
    """Server-side-apply body that gives the canary Service `canary_weight` percent of what the
    stable Service receives now, in every rule that routes to the stable Service.

    The canary backendRef is added right after the stable one (a copy of it, so port, filters and
    namespace match) and removed at weight 0. `namespace` is where both Services live.
    """
    if not 0 <= canary_weight <= PERCENT:
        raise ValueError(f"canary_weight must lie in 0..100, got {canary_weight}")
    name, route_namespace, live_rules = _route_identity(route)
    rules = copy.deepcopy(live_rules)
    routed = False
    for rule in rules:
        refs: list[dict[str, Any]] = rule.get("backendRefs") or []
        stable_index = next(
            (i for i, ref in enumerate(refs) if _points_at(ref, stable_service, namespace, route_namespace)), None
        )
        if stable_index is None:
            continue
        routed = True
        canary_refs = [ref for ref in refs if _points_at(ref, canary_service, namespace, route_namespace)]
        total = _pair_total(refs, [refs[stable_index], *canary_refs])
        canary_share = math.floor(total * canary_weight / PERCENT + 0.5)
        stable_ref = {**refs[stable_index], "weight": total - canary_share}
        canary_ref = {**(canary_refs[0] if canary_refs else stable_ref), "name": canary_service}
        canary_ref["weight"] = canary_share
        rebuilt: list[dict[str, Any]] = []
        for index, ref in enumerate(refs):
            if index == stable_index:
                rebuilt.append(stable_ref)
                if canary_weight > 0:
                    rebuilt.append(canary_ref)
            elif not any(ref is canary for canary in canary_refs):
                rebuilt.append(ref)
        rule["backendRefs"] = rebuilt
    if not routed:
        raise RouteError(
            f"HTTPRoute {route_namespace}/{name} has no backendRef to Service {namespace}/{stable_service}"
        )
    metadata: dict[str, Any] = {"name": name, "namespace": route_namespace}
    resource_version = (route.get("metadata") or {}).get("resourceVersion")
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": route.get("apiVersion") or GATEWAY_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": metadata,
        "spec": {"rules": rules},
    }


def route_weights(route: dict[str, Any], namespace: str, stable_service: str, canary_service: str) -> list[RuleWeights]:
    """Weights of our two backends, per rule that routes to either of them.

    As in `weighted_route`, the first backendRef to the stable Service is ours; canary ones add up.
    """
    _, route_namespace, rules = _route_identity(route)
    weights: list[RuleWeights] = []
    for index, rule in enumerate(rules):
        refs = rule.get("backendRefs") or []
        stable = [_weight(ref) for ref in refs if _points_at(ref, stable_service, namespace, route_namespace)]
        canary = [_weight(ref) for ref in refs if _points_at(ref, canary_service, namespace, route_namespace)]
        if stable or canary:
            weights.append(RuleWeights(index, stable[0] if stable else 0, sum(canary)))
    return weights


def canary_percent(weights: list[RuleWeights]) -> int | None:
    """The canary's percent of our pair's traffic when every routed rule agrees, else None."""
    percents = {
        math.floor(PERCENT * item.canary / (item.stable + item.canary) + 0.5)
        for item in weights
        if item.stable + item.canary > 0
    }
    return percents.pop() if len(percents) == 1 else None


def reaches_canary(route: dict[str, Any] | None, namespace: str, stable_service: str, canary_service: str) -> bool:
    """Whether requests may still reach the canary Service through this route as read: a backendRef gives it
    weight, or a Gateway has not yet reported on the route's current generation (it may still route by the
    weights we took away). The canary's pods must outlive that, or its share of requests fails as they go.

    A route that is gone, that does not route to our Services, or that no Gateway reports on reaches nothing
    through a Gateway we can see: nothing to wait for.
    """
    if route is None:
        return False
    try:
        weights = route_weights(route, namespace, stable_service, canary_service)
    except RouteError:
        return False
    if any(item.canary > 0 for item in weights):
        return True
    generation = (route.get("metadata") or {}).get("generation")
    if generation is None:
        return False
    for parent in (route.get("status") or {}).get("parents") or []:
        observed = [c.get("observedGeneration") for c in parent.get("conditions") or []
                    if c.get("type") == "Accepted" and c.get("observedGeneration") is not None]
        if observed and int(observed[0]) < int(generation):
            return True
    return False


def expected_canary_share(
    route: dict[str, Any] | None, namespace: str, stable_service: str, canary_service: str
) -> float | None:
    """The canary's share of both sides' requests the route's weights promise, for the sample-ratio check; None
    when no share is promised: no route, weights that disagree between rules or give one side everything, or no
    Gateway that has accepted the route's current generation (weights no Gateway programs split nothing, and a
    Gateway that lags the generation may still split by the weights before).

    A Gateway assigns each request to a backend by weight, whatever the client waits for, so under a route the
    requests each side finishes follow the weights even when a slower side finishes each one later. Without a
    route, a Service's connections stay on the pod they opened to, so each side's share moves with its speed:
    nothing is promised there."""
    if route is None:
        return None
    try:
        percent = canary_percent(route_weights(route, namespace, stable_service, canary_service))
    except RouteError:
        return None
    if percent is None or not 0 < percent < PERCENT:
        return None
    if not _accepted_at_current_generation(route):
        return None
    return percent / PERCENT


def _accepted_at_current_generation(route: dict[str, Any]) -> bool:
    """Whether a Gateway reports the route Accepted at its current generation: every parent that reports must be
    current (one that lags may split by older weights) and at least one must have accepted it."""
    generation = (route.get("metadata") or {}).get("generation")
    accepted = False
    for parent in (route.get("status") or {}).get("parents") or []:
        for condition in parent.get("conditions") or []:
            if condition.get("type") != "Accepted":
                continue
            observed = condition.get("observedGeneration")
            if generation is not None and observed is not None and int(observed) < int(generation):
                return False
            accepted = accepted or condition.get("status") == "True"
    return accepted


def route_reference_granted(
    grants: Iterable[Mapping[str, Any]], model_namespace: str, route_name: str, model_group: str, model_kind: str
) -> bool:
    """Whether one of the route namespace's ReferenceGrants lets SpeculativeModels of `model_namespace` refer to
    the HTTPRoute `route_name`, as the Gateway API's ReferenceGrant lets routes refer to Services elsewhere: a
    `from` entry naming our kind and the model's namespace, and a `to` entry naming HTTPRoute (all of them, or
    this one by name). A route in another namespace belongs to whoever owns that namespace; without their
    grant the operator neither reads it nor re-weights it."""
    for grant in grants:
        spec = grant.get("spec") or {}
        from_ok = any(entry.get("group") == model_group and entry.get("kind") == model_kind
                      and entry.get("namespace") == model_namespace for entry in spec.get("from") or [])
        to_ok = any(entry.get("group") == GATEWAY_GROUP and entry.get("kind") == "HTTPRoute"
                    and entry.get("name") in (None, "", route_name) for entry in spec.get("to") or [])
        if from_ok and to_ok:
            return True
    return False
