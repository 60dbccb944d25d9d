"""A canary Deployment outlives the route weight that reached it: deleted only once the HTTPRoute as read gives
it nothing and the Gateway has reported on that generation. Promotion and rollback both set the canary's weight to
0 in the pass that ends the canary; deleting its pods in that same pass failed its share of requests (about 4 s of
502/503 at every promotion on the local Gateway stand-in)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from specdec_operator.canary.traffic import reaches_canary
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from specdec_runtime import contract
from tests.unit.reconcile.reconcilefactories import NAMESPACE, SETTINGS, T0, T1, live_children, observed
from tests.unit.reconcile.test_route_status import canary_spec


def route(stable: int, canary: int | None, generation: int = 3, acked: int | None = 3) -> dict[str, Any]:
    """Our route with the stable (and maybe canary) backend at these weights, as a Gateway reported it."""
    refs = [{"name": "llama8b-stable", "port": 8000, "weight": stable}]
    if canary is not None:
        refs.append({"name": "llama8b-canary", "port": 8000, "weight": canary})
    parents = [] if acked is None else [{"parentRef": {"name": "inference-gateway"}, "conditions": [
        {"type": "Accepted", "status": "True", "reason": "Accepted", "observedGeneration": acked},
        {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "observedGeneration": acked}]}]
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "llama8b", "namespace": NAMESPACE, "generation": generation},
            "spec": {"parentRefs": [{"name": "inference-gateway"}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}], "backendRefs": refs}]},
            "status": {"parents": parents}}


def settled_with_a_leftover_canary() -> tuple[list[dict[str, Any]], str]:
    """The model's children after a canary ended: the stable set at the desired revision, and the canary
    Deployment that the ending pass no longer wants."""
    spec = canary_spec()
    first = evaluate(observed(spec), SETTINGS, T0)
    children = live_children(first)
    stable = next(c for c in children if c["kind"] == "Deployment")
    canary = copy.deepcopy(stable)
    canary["metadata"]["name"] = f"{stable['metadata']['name']}-canary"
    canary["metadata"]["labels"][contract.LABEL_TRACK] = "canary"
    canary["spec"]["template"]["metadata"]["labels"][contract.LABEL_TRACK] = "canary"
    return [*children, canary], canary["metadata"]["name"]


def deleted(plan: ReconcilePlan) -> set[str]:
    return {name for kind, name in plan.delete if kind == "Deployment"}


def evaluate_with(route_body: dict[str, Any] | None) -> tuple[ReconcilePlan, str]:
    children, canary = settled_with_a_leftover_canary()
    base = observed(canary_spec(), children=children)
    return evaluate(replace(base, route=route_body, route_read=True), SETTINGS, T1), canary


def test_the_canary_stays_while_the_route_as_read_still_sends_it_requests() -> None:
    plan, canary = evaluate_with(route(0, 100))
    assert canary not in deleted(plan)
    assert plan.route_weight == 0  # the same pass takes the weight away


def test_the_canary_stays_until_the_gateway_reports_on_the_route_without_it() -> None:
    plan, canary = evaluate_with(route(100, None, generation=4, acked=3))
    assert canary not in deleted(plan)


def test_the_canary_goes_once_the_route_gives_it_nothing_and_the_gateway_says_so() -> None:
    for body in (route(100, None), route(100, 0), route(100, None, acked=None), None):
        plan, canary = evaluate_with(body)
        assert canary in deleted(plan), body


def test_reaches_canary_reads_weights_and_the_gateways_generation() -> None:
    names = (NAMESPACE, "llama8b-stable", "llama8b-canary")
    assert reaches_canary(route(90, 10), *names)
    assert not reaches_canary(route(100, 0), *names)
    assert reaches_canary(route(100, 0, generation=5, acked=4), *names)
    assert not reaches_canary(route(100, 0, generation=5, acked=None), *names)  # no Gateway reports on it
    assert not reaches_canary({"metadata": {"name": "x", "namespace": NAMESPACE}, "spec": {"rules": []}}, *names)
