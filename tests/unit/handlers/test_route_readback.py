"""One reconcile pass reads the HTTPRoute once and turns a Gateway's refusal into the model's condition."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import kopf

from specdec_operator.handlers.context import OperatorContext
from specdec_operator.handlers.reconciler import reconcile
from specdec_operator.handlers.services.scrapes import ScrapeScheduler
from specdec_operator.settings import DEFAULT_IMAGE_TARGETS, DEFAULT_IMAGES, OperatorEnvSettings
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.handlers.fakeapi import FakeKubeApi, PostedEvents, live_indices
from tests.unit.reconcile.reconcilefactories import FLEET, NAMESPACE

LOG = logging.getLogger("test")
MESSAGE = "Cannot reference Service other/llama8b-stable: missing ReferenceGrant"
SPEC = spec_wire(drafters=[drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")],
                 rollout={"strategy": "Canary", "canary": {"traffic": {"httpRouteRef": {"name": "llama8b"}}}})


def context(api: FakeKubeApi, http: aiohttp.ClientSession) -> OperatorContext:
    settings = OperatorEnvSettings(runtime_images=DEFAULT_IMAGES, image_targets=DEFAULT_IMAGE_TARGETS)
    ctx = OperatorContext(settings=settings, api=api, http=http)
    ctx.cache.bind(live_indices(api))
    ctx.scrapes = ScrapeScheduler(http, interval_s=15, timeout_s=5, concurrency=4, allow_non_loopback=False)
    return ctx


def http_route(resolved: str, message: str = "") -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "llama8b", "namespace": NAMESPACE, "generation": 1},
            "spec": {"parentRefs": [{"name": "inference-gateway"}],
                     "rules": [{"backendRefs": [{"name": "llama8b-stable", "port": 8000, "weight": 100}]}]},
            "status": {"parents": [{"parentRef": {"name": "inference-gateway"},
                                    "controllerName": "traefik.io/gateway-controller",
                                    "conditions": [
                                        {"type": "Accepted", "status": "True", "reason": "Accepted",
                                         "observedGeneration": 1},
                                        {"type": "ResolvedRefs", "status": resolved, "reason": "RefNotPermitted",
                                         "message": message, "observedGeneration": 1}]}]}}


async def test_a_refused_route_is_a_condition_after_one_pass_with_one_read(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    api.put(http_route("False", MESSAGE))
    stored = api.put({"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel",
                      "metadata": {"namespace": NAMESPACE, "name": "llama8b"}, "spec": SPEC})
    reads: list[str] = []
    real_get = api.get

    async def counting_get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        reads.append(kind)
        return await real_get(kind, namespace, name)

    api.get = counting_get  # type: ignore[method-assign]
    await reconcile(context(api, http), kopf.Body(stored), FLEET, LOG)
    status = api.objects[("SpeculativeModel", NAMESPACE, "llama8b")]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HTTPRouteRefsNotResolved")
    assert MESSAGE in degraded["message"]
    assert reads.count("HTTPRoute") == 1, reads


async def test_an_unreadable_route_holds_owned_writes_and_says_why(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    """Issue 34 (low): a route we may not read (403) holds the owned objects, as before, but the model says why
    instead of failing every pass silently."""
    from specdec_operator.kube.api import KubeApiError

    api = FakeKubeApi()
    api.put(http_route("True"))
    stored = api.put({"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel",
                      "metadata": {"namespace": NAMESPACE, "name": "llama8b"}, "spec": SPEC})
    real_get = api.get
    forbidden = 'httproutes.gateway.networking.k8s.io "llama8b" is forbidden: User cannot get resource'

    async def refusing_get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind == "HTTPRoute":
            raise KubeApiError(403, "Forbidden", forbidden)
        return await real_get(kind, namespace, name)

    api.get = refusing_get  # type: ignore[method-assign]
    await reconcile(context(api, http), kopf.Body(stored), FLEET, LOG)
    status = api.objects[("SpeculativeModel", NAMESPACE, "llama8b")]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HTTPRouteUnreadable")
    assert forbidden in degraded["message"] and f"{NAMESPACE}/llama8b" in degraded["message"]
    assert not api.writes("apply") and not api.writes("delete"), "owned objects wait for the route"


def grant(from_namespace: str, route_name: str | None = None, kind: str = "SpeculativeModel") -> dict[str, Any]:
    to: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}
    if route_name is not None:
        to["name"] = route_name
    return {"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": f"from-{from_namespace}", "namespace": "edge"},
            "spec": {"from": [{"group": "specdec.io", "kind": kind, "namespace": from_namespace}], "to": [to]}}


async def test_a_route_in_another_namespace_is_neither_read_nor_weighted_without_a_reference_grant_there(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    """Issue 34, item 12: `httpRouteRef.namespace` names a route another team owns. Without their ReferenceGrant
    the operator does not read it (its Gateway messages stay out of this tenant's status) and writes nothing; a
    grant for another kind, another namespace or another route does not count; the right grant lets it through."""
    api = FakeKubeApi()
    route = http_route("True")
    route["metadata"]["namespace"] = "edge"
    api.put(route)
    spec = spec_wire(drafters=[drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")],
                     rollout={"strategy": "Canary", "canary": {
                         "traffic": {"httpRouteRef": {"name": "llama8b", "namespace": "edge"}}}})
    stored = api.put({"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel",
                      "metadata": {"namespace": NAMESPACE, "name": "llama8b"}, "spec": spec})
    reads: list[tuple[str, str]] = []
    real_get = api.get

    async def counting_get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        reads.append((kind, namespace))
        return await real_get(kind, namespace, name)

    api.get = counting_get  # type: ignore[method-assign]
    for wrong in (grant("someone-else"), grant(NAMESPACE, kind="Gateway"), grant(NAMESPACE, route_name="other")):
        api.put(wrong)
    await reconcile(context(api, http), kopf.Body(stored), FLEET, LOG)
    status = api.objects[("SpeculativeModel", NAMESPACE, "llama8b")]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HTTPRouteNotPermitted"), degraded
    assert "edge/llama8b" in degraded["message"] and "ReferenceGrant" in degraded["message"]
    assert ("HTTPRoute", "edge") not in reads, "a route nobody granted is not read"
    assert not api.writes("apply") and not api.writes("delete"), "owned objects wait, as for an unreadable route"
    assert any(reason == "HTTPRouteNotPermitted" for _, reason, _ in events.drain()), events.posted

    api.put(grant(NAMESPACE, route_name="llama8b"))
    stored = api.objects[("SpeculativeModel", NAMESPACE, "llama8b")]
    await reconcile(context(api, http), kopf.Body(stored), FLEET, LOG)
    status = api.objects[("SpeculativeModel", NAMESPACE, "llama8b")]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] != "HTTPRouteNotPermitted", degraded
    assert ("HTTPRoute", "edge") in reads
    assert api.writes("apply"), "with the grant the model's objects are written"
