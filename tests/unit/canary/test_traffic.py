"""HTTPRoute weights: only our two backendRefs move; everything else is carried over untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec_operator.canary.traffic import (
    RouteError,
    RuleWeights,
    canary_percent,
    expected_canary_share,
    route_weights,
    weighted_route,
)

NS = "serving"
STABLE, CANARY = "llama-stable", "llama-canary"


def ref(name: str, weight: int | None = None, **extra: Any) -> dict[str, Any]:
    backend: dict[str, Any] = {"name": name, "port": 8000, **extra}
    if weight is not None:
        backend["weight"] = weight
    return backend


def http_route(
    *rules: list[dict[str, Any]], namespace: str = NS, resource_version: str | None = "4711"
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "llm", "namespace": namespace, "labels": {"team": "ml"}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata,
        "spec": {
            "parentRefs": [{"name": "inference-gateway"}],
            "hostnames": ["llm.example.internal"],
            "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": f"/r{index}"}}], "backendRefs": backends}
                for index, backends in enumerate(rules)
            ],
        },
    }


def refs_of(body: dict[str, Any], rule: int = 0) -> list[dict[str, Any]]:
    return list(body["spec"]["rules"][rule]["backendRefs"])


def apply(route: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores after our apply: rules replaced as a whole (atomic list)."""
    stored = copy.deepcopy(route)
    stored["spec"]["rules"] = copy.deepcopy(body["spec"]["rules"])
    return stored


@pytest.mark.parametrize(
    ("backends", "canary_weight", "expected"),
    [
        ([ref(STABLE)], 10, [ref(STABLE, 90), ref(CANARY, 10)]),
        ([ref(STABLE, 90), ref(CANARY, 10)], 50, [ref(STABLE, 50), ref(CANARY, 50)]),
        ([ref(STABLE, 50), ref(CANARY, 50)], 0, [ref(STABLE, 100)]),
        ([ref(STABLE, 50), ref(CANARY, 50)], 100, [ref(STABLE, 0), ref(CANARY, 100)]),
        # The canary is moved next to the stable backend and a duplicate of it is dropped.
        ([ref(CANARY, 5), ref(STABLE, 90), ref(CANARY, 5)], 10, [ref(STABLE, 90), ref(CANARY, 10)]),
        # The canary copies the stable backendRef, filters included, so both are served alike.
        (
            [ref(STABLE, filters=[{"type": "RequestHeaderModifier"}])],
            10,
            [
                ref(STABLE, 90, filters=[{"type": "RequestHeaderModifier"}]),
                ref(CANARY, 10, filters=[{"type": "RequestHeaderModifier"}]),
            ],
        ),
        # Other backends in the rule keep their weight; our pair shares the 50 it had.
        ([ref("other-model", 50), ref(STABLE, 50)], 10, [ref("other-model", 50), ref(STABLE, 45), ref(CANARY, 5)]),
        ([ref("other-model", 50), ref(STABLE, 45), ref(CANARY, 5)], 0, [ref("other-model", 50), ref(STABLE, 50)]),
        # Explicit defaults (core group, kind Service, the route's namespace) still point at our Service.
        (
            [ref(STABLE, group="", kind="Service", namespace=NS)],
            10,
            [
                ref(STABLE, 90, group="", kind="Service", namespace=NS),
                ref(CANARY, 10, group="", kind="Service", namespace=NS),
            ],
        ),
        # Same name but another kind or namespace is not ours.
        (
            [ref(STABLE, 1, group="inference.networking.k8s.io", kind="InferencePool"), ref(STABLE)],
            10,
            [ref(STABLE, 1, group="inference.networking.k8s.io", kind="InferencePool"), ref(STABLE, 1), ref(CANARY, 0)],
        ),
    ],
    ids=[
        "first-step",
        "next-step",
        "roll-back",
        "full",
        "canary-moved-and-deduplicated",
        "filters-copied",
        "shared-rule",
        "shared-rule-roll-back",
        "explicit-defaults",
        "other-kind-is-not-ours",
    ],
)
def test_weighted_route_rule(
    backends: list[dict[str, Any]], canary_weight: int, expected: list[dict[str, Any]]
) -> None:
    body = weighted_route(http_route(backends), NS, STABLE, CANARY, canary_weight)
    assert refs_of(body) == expected


def test_body_is_a_minimal_apply_with_the_full_rules_list_and_a_precondition() -> None:
    untouched = [ref("other-model", 3)]
    route = http_route([ref(STABLE)], untouched)
    body = weighted_route(route, NS, STABLE, CANARY, 10)
    assert body["apiVersion"] == "gateway.networking.k8s.io/v1" and body["kind"] == "HTTPRoute"
    assert body["metadata"] == {"name": "llm", "namespace": NS, "resourceVersion": "4711"}
    assert set(body["spec"]) == {"rules"}
    assert body["spec"]["rules"][1] == route["spec"]["rules"][1]
    assert body["spec"]["rules"][0]["matches"] == route["spec"]["rules"][0]["matches"]


def test_without_resource_version_no_precondition_is_sent() -> None:
    body = weighted_route(http_route([ref(STABLE)], resource_version=None), NS, STABLE, CANARY, 10)
    assert "resourceVersion" not in body["metadata"]


def test_live_route_is_not_modified() -> None:
    route = http_route([ref(STABLE)], [ref(STABLE, 7)])
    snapshot = copy.deepcopy(route)
    weighted_route(route, NS, STABLE, CANARY, 50)
    assert route == snapshot


def test_services_in_another_namespace_are_matched_by_explicit_namespace() -> None:
    route = http_route([ref(STABLE, namespace="models")], namespace="gateways")
    body = weighted_route(route, "models", STABLE, CANARY, 10)
    assert refs_of(body) == [ref(STABLE, 90, namespace="models"), ref(CANARY, 10, namespace="models")]
    with pytest.raises(RouteError, match="has no backendRef to Service gateways/llama-stable"):
        weighted_route(route, "gateways", STABLE, CANARY, 10)


@pytest.mark.parametrize(
    ("route", "error"),
    [
        (http_route([ref("someone-else")]), "HTTPRoute serving/llm has no backendRef to Service serving/llama-stable"),
        ({"metadata": {"name": "llm"}, "spec": {"rules": []}}, "metadata.namespace"),
        ({"metadata": {"name": "llm", "namespace": NS}, "spec": {}}, "spec.rules"),
    ],
)
def test_route_errors(route: dict[str, Any], error: str) -> None:
    with pytest.raises(RouteError, match=error):
        weighted_route(route, NS, STABLE, CANARY, 10)


@pytest.mark.parametrize("weight", [-1, 101])
def test_weight_out_of_range(weight: int) -> None:
    with pytest.raises(ValueError, match=r"0\.\.100"):
        weighted_route(http_route([ref(STABLE)]), NS, STABLE, CANARY, weight)


def test_route_weights_reads_every_rule_that_routes_to_us() -> None:
    route = http_route([ref(STABLE, 90), ref(CANARY, 10)], [ref("other-model")], [ref(STABLE)])
    assert route_weights(route, NS, STABLE, CANARY) == [RuleWeights(0, 90, 10), RuleWeights(2, 1, 0)]


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([RuleWeights(0, 90, 10), RuleWeights(2, 45, 5)], 10),
        ([RuleWeights(0, 90, 10), RuleWeights(2, 1, 0)], None),
        ([RuleWeights(0, 0, 0)], None),
        ([], None),
    ],
)
def test_canary_percent(weights: list[RuleWeights], expected: int | None) -> None:
    assert canary_percent(weights) == expected


def test_canary_steps_round_trip_through_the_api_server() -> None:
    route = http_route([ref(STABLE)], [ref("other-model", 50), ref(STABLE, 50)])
    for weight in (10, 50, 100, 0):
        route = apply(route, weighted_route(route, NS, STABLE, CANARY, weight))
        assert canary_percent(route_weights(route, NS, STABLE, CANARY)) == weight
    assert refs_of(route) == [ref(STABLE, 100)]
    assert refs_of(route, 1) == [ref("other-model", 50), ref(STABLE, 50)]


@given(weight=st.integers(min_value=0, max_value=100), start=st.integers(min_value=0, max_value=100))
def test_weights_are_exact_percents_and_idempotent(weight: int, start: int) -> None:
    route = apply(http_route([ref(STABLE)]), weighted_route(http_route([ref(STABLE)]), NS, STABLE, CANARY, start))
    body = weighted_route(route, NS, STABLE, CANARY, weight)
    stored = apply(route, body)
    assert route_weights(stored, NS, STABLE, CANARY) == [RuleWeights(0, 100 - weight, weight)]
    assert weighted_route(stored, NS, STABLE, CANARY, weight) == body


def _route_with_parents(*conditions: dict[str, object], generation: int = 3) -> dict[str, object]:
    return {
        "metadata": {"name": "chat", "namespace": "gw", "generation": generation},
        "spec": {"rules": []},
        "status": {"parents": [{"parentRef": {"name": "public", "namespace": "gw"}, "controllerName": "x/y",
                                "conditions": list(conditions)}]},
    }


def _condition(kind: str, status: str, reason: str, observed: int = 3, message: str = "") -> dict[str, object]:
    return {"type": kind, "status": status, "reason": reason, "observedGeneration": observed, "message": message}


def test_an_accepted_route_with_resolved_refs_is_not_rejected() -> None:
    from specdec_operator.reconcile.route_status import route_rejection

    route = _route_with_parents(_condition("Accepted", "True", "Accepted"),
                                _condition("ResolvedRefs", "True", "ResolvedRefs"))
    assert route_rejection(route) is None


def test_no_gateway_status_holds_nothing() -> None:
    from specdec_operator.reconcile.route_status import route_rejection

    assert route_rejection({"metadata": {"name": "r", "namespace": "n", "generation": 1}, "spec": {}}) is None


def test_a_cross_namespace_backend_without_reference_grant_is_named() -> None:
    from specdec_operator.reconcile.route_status import route_rejection

    route = _route_with_parents(
        _condition("Accepted", "True", "Accepted"),
        _condition("ResolvedRefs", "False", "RefNotPermitted", message="backendRef team-a/m-canary not permitted"),
    )
    assert route_rejection(route) == (
        "HTTPRouteRefsNotResolved",
        "Gateway gw/public reports ResolvedRefs=False (RefNotPermitted): backendRef team-a/m-canary not permitted",
    )


def test_a_gateway_that_refuses_the_route_is_named() -> None:
    from specdec_operator.reconcile.route_status import route_rejection

    rejection = route_rejection(_route_with_parents(_condition("Accepted", "False", "NotAllowedByListeners")))
    assert rejection is not None and rejection[0] == "HTTPRouteNotAccepted"
    assert "NotAllowedByListeners" in rejection[1]


def test_a_condition_about_an_older_generation_is_ignored() -> None:
    from specdec_operator.reconcile.route_status import route_rejection

    stale = _route_with_parents(_condition("ResolvedRefs", "False", "BackendNotFound", observed=2), generation=3)
    assert route_rejection(stale) is None


def _reported(route: dict[str, Any], generation: int, observed: int) -> dict[str, Any]:
    """The route at `generation`, with a Gateway that has reported on generation `observed`."""
    route = copy.deepcopy(route)
    route["metadata"]["generation"] = generation
    route["status"] = {"parents": [{"parentRef": {"name": "inference-gateway"}, "conditions": [
        {"type": "Accepted", "status": "True", "observedGeneration": observed}]}]}
    return route


def test_the_share_a_route_promises_is_its_canary_weight_in_force() -> None:
    route = http_route([ref(STABLE, 75), ref(CANARY, 25)], [ref(STABLE, 75), ref(CANARY, 25)])
    assert expected_canary_share(_reported(route, 3, 3), NS, STABLE, CANARY) == 0.25


@pytest.mark.parametrize("route", [
    None,  # no route: a Service's connections stay on their pod, so shares move with each side's speed
    _reported(http_route([ref(STABLE, 100), ref(CANARY, 0)]), 3, 3),  # the canary gets nothing: no share to check
    _reported(http_route([ref(STABLE, 0), ref(CANARY, 100)]), 3, 3),  # the last step: no stable side to share with
    # The rules disagree.
    _reported(http_route([ref(STABLE, 90), ref(CANARY, 10)], [ref(STABLE, 50), ref(CANARY, 50)]), 3, 3),
    http_route([ref("someone-else", 100)]),  # not our route
    _reported(http_route([ref(STABLE, 50), ref(CANARY, 50)]), 4, 3),  # the Gateway still splits by older weights
    # No Gateway has accepted the route: its weights split nothing (traffic reaches the pods some other way).
    http_route([ref(STABLE, 50), ref(CANARY, 50)]),
])
def test_no_share_is_promised_where_the_weights_do_not_say_one(route: dict[str, Any] | None) -> None:
    assert expected_canary_share(route, NS, STABLE, CANARY) is None
