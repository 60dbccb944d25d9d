"""What a pass does to the HTTPRoute it owns weights in (reconcile/route_status.py route_step), and which
Gateway rejection of the route the canary step holds on (gathered_rejection). Pure: the route as read in, the
change out."""

from __future__ import annotations

from typing import Any

from specdec_operator.canary.traffic import route_weights
from specdec_operator.reconcile.route_status import gathered_rejection, route_step

NS = "serving"
MODEL = "llama"
STABLE, CANARY = "llama-stable", "llama-canary"
WHERE = f"{NS}/llm"
REFUSED = ("HTTPRouteNotAccepted", "Gateway gw/public reports Accepted=False (NotAllowedByListeners): no")


def route(canary_weight: int | None = None, refused: bool = False, **backend: Any) -> dict[str, Any]:
    backends: list[dict[str, Any]] = [{"name": STABLE, "port": 8000, **backend}]
    if canary_weight is not None:
        backends[0]["weight"] = 100 - canary_weight
        backends.append({"name": CANARY, "port": 8000, "weight": canary_weight})
    body: dict[str, Any] = {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "llm", "namespace": NS, "generation": 3},
        "spec": {"parentRefs": [{"name": "public"}], "rules": [{"backendRefs": backends}]},
    }
    if refused:
        body["status"] = {"parents": [{"parentRef": {"name": "public", "namespace": "gw"}, "conditions": [
            {"type": "Accepted", "status": "False", "reason": "NotAllowedByListeners", "observedGeneration": 3,
             "message": "no"}]}]}
    return body


def test_a_missing_route_is_reported_and_nothing_is_applied() -> None:
    step = route_step(None, MODEL, NS, WHERE, 10)
    assert step.apply is None and not step.accepted
    assert step.problem == ("HTTPRouteNotFound", f"HTTPRoute {WHERE} not found")


def test_a_new_weight_is_applied_to_an_accepted_route() -> None:
    step = route_step(route(), MODEL, NS, WHERE, 10)
    assert step.problem is None and step.accepted and step.current == 0
    assert step.apply is not None
    assert [w.canary for w in route_weights(step.apply, NS, STABLE, CANARY)] == [10]


def test_an_unchanged_weight_writes_nothing() -> None:
    step = route_step(route(canary_weight=10), MODEL, NS, WHERE, 10)
    assert step.apply is None and step.problem is None and step.accepted and step.current == 10


def test_more_traffic_is_held_where_a_gateway_refuses_the_route() -> None:
    step = route_step(route(canary_weight=10, refused=True), MODEL, NS, WHERE, 25)
    assert step.apply is None and not step.accepted
    assert step.problem is not None and step.problem[0] == "HTTPRouteNotAccepted"
    assert step.problem[1].startswith("canary weight held at 10% instead of 25%: ")


def test_less_traffic_goes_through_a_refused_route() -> None:
    step = route_step(route(canary_weight=25, refused=True), MODEL, NS, WHERE, 0)
    assert step.problem is None and not step.accepted and step.apply is not None


def test_gathered_rejection_follows_the_route_read_this_pass() -> None:
    refused = route(refused=True)
    assert gathered_rejection(None, refused, True, None) is not None
    assert gathered_rejection(REFUSED, route(), True, None) is None  # read and accepted: no longer refused
    assert gathered_rejection(REFUSED, None, True, None) is None  # read and absent: nothing refused


def test_gathered_rejection_keeps_the_last_read_when_the_route_could_not_be_read() -> None:
    assert gathered_rejection(REFUSED, None, False, "HTTPRoute serving/llm cannot be read: 503") == REFUSED
    assert gathered_rejection(REFUSED, None, False, None) is None  # no route named: nothing refused
