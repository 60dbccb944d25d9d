"""The gateway stand-in's routing: a route's weights reach the Services, a Service spreads over ready pods."""

from __future__ import annotations

from collections import Counter
from typing import Any

from specdec_runtime.routing import ClusterView, Endpoint, Router, service_host


def pod(name: str, ip: str, labels: dict[str, str], namespace: str = "ns", ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def service(name: str, selector: dict[str, str], namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": selector, "ports": [{"port": 8000, "targetPort": 8000}]}}


def http_route(refs: list[dict[str, Any]], namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": "r", "namespace": namespace},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}], "backendRefs": refs},
                               {"matches": [{"path": {"type": "PathPrefix", "value": "/other"}}],
                                "backendRefs": [{"name": "other", "port": 8000}]}]}}


# The Gateway the routes attach to, of the stand-in's class (the stand-in passes only such Gateways).
GATEWAY = {"metadata": {"name": "gw", "namespace": "ns"}, "spec": {"gatewayClassName": "specdec-standin"}}


def fleet(stable_pods: int, canary_pods: int, weights: tuple[int, int]) -> Router:
    pods = [pod(f"s{i}", f"127.0.1.{i + 1}", {"track": "stable"}) for i in range(stable_pods)]
    pods += [pod(f"c{i}", f"127.0.2.{i + 1}", {"track": "canary"}) for i in range(canary_pods)]
    refs = [{"name": "m-stable", "port": 8000, "weight": weights[0]},
            {"name": "m-canary", "port": 8000, "weight": weights[1]}]
    router = Router("gw")
    router.update(ClusterView(
        services=[service("m-stable", {"track": "stable"}), service("m-canary", {"track": "canary"})],
        pods=pods, routes=[http_route(refs)], gateways=[GATEWAY]))
    return router


def test_route_weights_are_the_share_each_service_receives() -> None:
    for weights in ((90, 10), (50, 50), (0, 100), (73, 27)):
        router = fleet(4, 1, weights)
        served = Counter(router.route("gateway.local", "/v1/completions").backend.service for _ in range(1000))
        assert served["m-stable"] == 10 * weights[0] and served["m-canary"] == 10 * weights[1]
        # Any window of requests is within one request of the weights (smooth weighted round robin).
        window = Counter(router.route("gateway.local", "/v1/completions").backend.service for _ in range(20))
        assert abs(window["m-canary"] - 20 * weights[1] / 100) <= 1


def test_a_service_spreads_evenly_over_its_ready_pods_only() -> None:
    router = fleet(3, 0, (100, 0))
    view = router.view
    router.update(ClusterView(services=view.services.values(),
                              pods=[*view.pods, pod("late", "127.0.1.9", {"track": "stable"}, ready=False)],
                              routes=view.routes, gateways=[GATEWAY]))
    served = Counter(router.route("m-stable.ns.svc.cluster.local", "/v1/completions").endpoint for _ in range(300))
    assert served == {Endpoint(f"127.0.1.{i}", 8000): 100 for i in (1, 2, 3)}


def test_unresolvable_backends_take_their_share_as_500_and_unmatched_paths_404() -> None:
    router = Router("gw")
    refs = [{"name": "m-stable", "port": 8000, "weight": 50},
            {"name": "elsewhere", "namespace": "other", "port": 8000, "weight": 50}]
    grant_free = ClusterView(services=[service("m-stable", {"a": "b"}), service("elsewhere", {"a": "b"}, "other")],
                             pods=[pod("p", "127.0.1.1", {"a": "b"}), pod("q", "127.0.3.1", {"a": "b"}, "other")],
                             routes=[http_route(refs)], gateways=[GATEWAY])
    router.update(grant_free)
    statuses = Counter(router.route("h", "/v1/x").status for _ in range(100))
    assert statuses == {200: 50, 500: 50}
    denied = next(d for d in (router.route("h", "/v1/x") for _ in range(2)) if d.status == 500)
    assert "ReferenceGrant" in denied.reason
    grant = {"metadata": {"name": "g", "namespace": "other"},
             "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "ns"}],
                      "to": [{"group": "", "kind": "Service"}]}}
    router.update(ClusterView(services=grant_free.services.values(), pods=grant_free.pods,
                              routes=grant_free.routes, grants=[grant], gateways=[GATEWAY]))
    assert {router.route("h", "/v1/x").status for _ in range(10)} == {200}
    assert router.route("h", "/nothing").status == 404


def test_never_routes_to_a_non_loopback_pod_ip() -> None:
    router = Router("gw")
    router.update(ClusterView(services=[service("m", {"a": "b"})], pods=[pod("p", "10.0.0.5", {"a": "b"})]))
    decision = router.route("m.ns.svc", "/v1/completions")
    assert decision.endpoint is None and decision.status == 503


def test_service_host_names() -> None:
    assert service_host("llama-stable.team-a.svc.cluster.local:8000") == ("team-a", "llama-stable")
    assert service_host("llama-stable.team-a.svc") == ("team-a", "llama-stable")
    assert service_host("gateway.example.com") is None


def test_the_standin_reports_route_status_as_a_gateway_controller_would() -> None:
    from specdec_runtime.routing import route_parent_status

    refs = [{"name": "m-stable", "port": 8000, "weight": 90},
            {"name": "away", "namespace": "other", "port": 8000, "weight": 10}]
    route = http_route(refs)
    route["metadata"]["generation"] = 3
    view = ClusterView(services=[service("m-stable", {"a": "b"}), service("away", {"a": "b"}, "other"),
                                 service("other", {"a": "b"})], routes=[route], gateways=[GATEWAY])
    accepted, resolved = route_parent_status(view, route, "gw")
    assert (accepted["type"], accepted["status"], accepted["observedGeneration"]) == ("Accepted", "True", 3)
    assert (resolved["status"], resolved["reason"]) == ("False", "RefNotPermitted")
    assert "Service other/away" in resolved["message"] and "ReferenceGrant" in resolved["message"]
    route["spec"]["rules"][0]["backendRefs"] = refs[:1]
    assert route_parent_status(view, route, "gw")[1]["status"] == "True"
    route["spec"]["rules"][0]["backendRefs"] = [{"name": "missing", "port": 8000}]
    assert route_parent_status(view, route, "gw")[1]["reason"] == "BackendNotFound"


def test_routes_attach_only_to_an_existing_gateway_of_the_standins_class() -> None:
    """A Gateway controller serves its own Gateways: a route naming a Gateway that does not exist, or one in
    another namespace, gets no traffic and no status from the stand-in (another test's or team's routes stay
    untouched on a shared cluster)."""
    refs = [{"name": "m-stable", "port": 8000, "weight": 100}]
    view = ClusterView(services=[service("m-stable", {"a": "b"})], pods=[pod("p", "127.0.1.1", {"a": "b"})],
                       routes=[http_route(refs)])
    router = Router("gw")
    router.update(view)
    assert view.attached(http_route(refs), "gw") is None
    assert router.route("h", "/v1/completions").status == 404
    elsewhere = {"metadata": {"name": "gw", "namespace": "other"}, "spec": {}}
    assert ClusterView(routes=[http_route(refs)], gateways=[elsewhere]).attached(http_route(refs), "gw") is None
    across = http_route(refs)
    across["spec"]["parentRefs"] = [{"name": "gw", "namespace": "other"}]
    assert ClusterView(gateways=[elsewhere]).attached(across, "gw") == {"name": "gw", "namespace": "other"}
    router.update(ClusterView(services=view.services.values(), pods=view.pods, routes=view.routes,
                              gateways=[GATEWAY]))
    assert router.route("h", "/v1/completions").status == 200


def test_a_route_for_the_requests_hostname_wins_over_a_catch_all_route() -> None:
    """Gateway API precedence: a matching non-wildcard hostname beats a wildcard one, which beats a route with no
    hostnames, whatever their paths; another team's catch-all route on the same Gateway takes none of it."""
    def named(name: str, hostnames: list[str], service_name: str, prefix: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns"},
                "spec": {"parentRefs": [{"name": "gw"}], "hostnames": hostnames,
                         "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
                                    "backendRefs": [{"name": service_name, "port": 8000}]}]}}

    services = [service(n, {"app": n}) for n in ("exact", "wild", "any")]
    pods = [pod(n, f"127.0.1.{i + 1}", {"app": n}) for i, n in enumerate(("exact", "wild", "any"))]
    routes = [named("catch-all", [], "any", "/v1/completions"), named("wild", ["*.models.test"], "wild", "/v1"),
              named("exact", ["llama.models.test"], "exact", "/")]
    router = Router("gw")
    router.update(ClusterView(services=services, pods=pods, routes=routes, gateways=[GATEWAY]))
    assert router.route("llama.models.test", "/v1/completions").backend.service == "exact"
    assert router.route("qwen.models.test:80", "/v1/completions").backend.service == "wild"
    assert router.route("elsewhere.example", "/v1/completions").backend.service == "any"
