"""The HTTPRoute we write weights into is read back: a Gateway's refusal is a condition in its own words."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specdec_operator.reconcile.plan import evaluate
from specdec_operator.reconcile.route_status import route_verdict
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.reconcile.reconcilefactories import NAMESPACE, SETTINGS, T0, observed

GATEWAY_MESSAGE = "backendRef to Service other/llama8b-stable is not permitted by any ReferenceGrant"


def route(*conditions: dict[str, Any], generation: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "llama8b", "namespace": NAMESPACE, "generation": generation},
        "spec": {"parentRefs": [{"name": "inference-gateway"}], "rules": []},
        "status": {"parents": [{"parentRef": {"name": "inference-gateway"}, "conditions": list(conditions)}]},
    }


def condition(kind: str, status: str, reason: str, message: str = "", observed_generation: int = 2) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "observedGeneration": observed_generation}


def test_an_accepted_route_with_resolved_refs_says_nothing() -> None:
    accepted = route(condition("Accepted", "True", "Accepted"), condition("ResolvedRefs", "True", "ResolvedRefs"))
    assert route_verdict(NAMESPACE, "llama8b", accepted) is None
    assert route_verdict(NAMESPACE, "llama8b", {"metadata": {"generation": 1}}) is None  # no Gateway reports yet


def test_unresolved_refs_carry_the_gateways_reason_and_message() -> None:
    refused = route(condition("Accepted", "True", "Accepted"),
                    condition("ResolvedRefs", "False", "RefNotPermitted", GATEWAY_MESSAGE))
    verdict = route_verdict(NAMESPACE, "llama8b", refused)
    assert verdict is not None
    assert verdict.reason == "HTTPRouteRefsNotResolved"
    assert "Gateway inference-gateway reports ResolvedRefs=False (RefNotPermitted)" in verdict.message
    assert GATEWAY_MESSAGE in verdict.message


def test_not_accepted_outranks_unresolved_and_a_stale_condition_is_ignored() -> None:
    both = route(condition("ResolvedRefs", "False", "BackendNotFound", "no Service x"),
                 condition("Accepted", "False", "NotAllowedByListeners", "listener allows no routes from ns"))
    verdict = route_verdict(NAMESPACE, "llama8b", both)
    assert verdict is not None and verdict.reason == "HTTPRouteNotAccepted"
    assert verdict.message.index("NotAllowedByListeners") < verdict.message.index("BackendNotFound")
    stale = route(condition("Accepted", "False", "NotAllowedByListeners", observed_generation=1), generation=2)
    assert route_verdict(NAMESPACE, "llama8b", stale) is None


def test_a_missing_route_is_named() -> None:
    verdict = route_verdict(NAMESPACE, "llama8b", None)
    assert verdict is not None and verdict.reason == "HTTPRouteNotFound"


def canary_spec() -> dict[str, Any]:
    return spec_wire(drafters=[drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")],
                     rollout={"strategy": "Canary", "canary": {"traffic": {"httpRouteRef": {"name": "llama8b"}}}})


def test_a_refused_route_is_a_degraded_condition_in_the_same_evaluation() -> None:
    refused = route(condition("Accepted", "True", "Accepted"),
                    condition("ResolvedRefs", "False", "RefNotPermitted", GATEWAY_MESSAGE))
    base = observed(canary_spec())
    plan = evaluate(replace(base, route=refused, route_read=True), SETTINGS, T0)
    assert plan.status is not None
    degraded = next(c for c in plan.status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "HTTPRouteRefsNotResolved")
    assert GATEWAY_MESSAGE in degraded.message
    # Accepted again: the condition clears in the next evaluation.
    accepted = route(condition("Accepted", "True", "Accepted"), condition("ResolvedRefs", "True", "ResolvedRefs"))
    healed = evaluate(replace(base, route=accepted, route_read=True), SETTINGS, T0)
    assert healed.status is not None
    assert next(c for c in healed.status.conditions if c.type == "Degraded").status == "False"
