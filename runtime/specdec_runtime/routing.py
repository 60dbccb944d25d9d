"""Where a request goes: an HTTPRoute's weighted backendRefs, then a Service's ready pods. Pure: no I/O.

The local cluster has no kube-proxy and the API server refuses loopback addresses in EndpointSlices, so
nothing can publish the fake pods' IPs as endpoints (see docs/local-traffic.md). The gateway stand-in
(gateway_standin.py) routes with this module as a Gateway API implementation and kube-proxy would:

- A request for a Service (Host `<service>.<namespace>.svc[.cluster.local]`) goes to one of the ready pods its
  selector picks, in turn (kube-proxy's IPVS round robin; iptables picks at random with the same mean).
- A request for a Gateway matches the attached HTTPRoutes' hostnames and path matches (longest path first),
  then picks a backendRef by weight with smooth weighted round robin (Traefik's and nginx's algorithm: the
  share of any window of requests is within one request of the weights), then a ready pod of that Service.
- A backendRef that does not resolve (no such Service, or a Service in another namespace with no
  ReferenceGrant allowing it) still takes its share, which is answered 500, as the Gateway API requires.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GATEWAY_GROUP = "gateway.networking.k8s.io"
SERVICE_DOMAIN_SUFFIXES = (".svc", ".svc.cluster.local")


@dataclass(frozen=True)
class Endpoint:
    ip: str
    port: int


@dataclass(frozen=True)
class Backend:
    """One weighted backendRef. `endpoints` is empty when the Service has no ready pods; `unresolved` says why
    the ref cannot be used at all (the Gateway answers its share with 500)."""

    namespace: str
    service: str
    weight: int
    endpoints: tuple[Endpoint, ...] = ()
    unresolved: str | None = None


@dataclass(frozen=True)
class Decision:
    """Where one request goes: an endpoint, or a status and reason the stand-in answers itself."""

    endpoint: Endpoint | None
    status: int = 200
    reason: str = ""
    backend: Backend | None = None


@dataclass
class _SmoothWeights:
    """nginx's smooth weighted round robin over a fixed list of weights."""

    current: list[int] = field(default_factory=list)

    def pick(self, weights: list[int]) -> int | None:
        total = sum(weights)
        if total <= 0:
            return None
        if len(self.current) != len(weights):
            self.current = [0] * len(weights)
        for index, weight in enumerate(weights):
            self.current[index] += weight
        best = max(range(len(weights)), key=lambda i: (self.current[i], -i))
        self.current[best] -= total
        return best


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _ready(pod: Mapping[str, Any]) -> bool:
    if _meta(pod).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    return bool(status.get("podIP")) and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def _selects(selector: Mapping[str, str], pod: Mapping[str, Any]) -> bool:
    labels = _meta(pod).get("labels") or {}
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def _target_port(service_port: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    target = service_port.get("targetPort", service_port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return int(port["containerPort"])
    return None


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


class ClusterView:
    """Services, ready pods, HTTPRoutes, ReferenceGrants and the Gateways of the stand-in's class as the
    stand-in last saw them."""

    def __init__(
        self,
        services: Iterable[Mapping[str, Any]] = (),
        pods: Iterable[Mapping[str, Any]] = (),
        routes: Iterable[Mapping[str, Any]] = (),
        grants: Iterable[Mapping[str, Any]] = (),
        gateways: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        self.services = {(_meta(s).get("namespace"), _meta(s).get("name")): s for s in services}
        self.pods = [p for p in pods if _ready(p)]
        self.routes = list(routes)
        self.grants = list(grants)
        # Only Gateways the caller implements (their gatewayClassName is its class): a Gateway controller
        # attaches routes to its own Gateways and leaves every other route, and its status, alone.
        self.gateways = {(_meta(g).get("namespace"), _meta(g).get("name")) for g in gateways}

    def attached(self, route: Mapping[str, Any], gateway: str) -> Mapping[str, Any] | None:
        """The route's parentRef to our Gateway `gateway` when that Gateway exists (in the parentRef's namespace,
        by default the route's); None when the route is not ours to route or to report on."""
        route_namespace = _meta(route).get("namespace")
        for ref in (route.get("spec") or {}).get("parentRefs") or []:
            if (ref.get("name") == gateway and (ref.get("kind") or "Gateway") == "Gateway"
                    and (ref.get("group") or GATEWAY_GROUP) == GATEWAY_GROUP
                    and (ref.get("namespace") or route_namespace, gateway) in self.gateways):
                return dict(ref)
        return None

    def endpoints(self, namespace: str, service: str, port: int | None) -> tuple[Endpoint, ...] | None:
        """Ready pods behind a Service port (sorted, so turns are stable); None when there is no such Service.

        Only loopback pod IPs are ever returned: the stand-in must never dial anything else.
        """
        svc = self.services.get((namespace, service))
        if svc is None:
            return None
        spec = svc.get("spec") or {}
        ports = spec.get("ports") or []
        chosen = next((p for p in ports if port is None or p.get("port") == port), None)
        if chosen is None:
            return ()
        selector = spec.get("selector") or {}
        found = []
        for pod in self.pods:
            if _meta(pod).get("namespace") != namespace or not _selects(selector, pod):
                continue
            ip, target = pod["status"]["podIP"], _target_port(chosen, pod)
            if target is not None and _loopback(ip):
                found.append(Endpoint(ip, target))
        return tuple(sorted(found, key=lambda e: (ipaddress.ip_address(e.ip), e.port)))

    def reference_allowed(self, from_namespace: str, to_namespace: str, service: str) -> bool:
        """Gateway API ReferenceGrant: HTTPRoutes in from_namespace may reference this Service."""
        if from_namespace == to_namespace:
            return True
        for grant in self.grants:
            if _meta(grant).get("namespace") != to_namespace:
                continue
            spec = grant.get("spec") or {}
            froms = any(f.get("group") == GATEWAY_GROUP and f.get("kind") == "HTTPRoute"
                        and f.get("namespace") == from_namespace for f in spec.get("from") or [])
            tos = any((t.get("group") or "") == "" and t.get("kind") == "Service"
                      and t.get("name") in (None, "", service) for t in spec.get("to") or [])
            if froms and tos:
                return True
        return False

    def backend(self, route_namespace: str, ref: Mapping[str, Any]) -> Backend:
        weight = 1 if ref.get("weight") is None else int(ref["weight"])
        namespace = ref.get("namespace") or route_namespace
        name = str(ref.get("name"))
        if (ref.get("group") or "") != "" or (ref.get("kind") or "Service") != "Service":
            return Backend(namespace, name, weight, unresolved=f"unsupported backend kind {ref.get('kind')}")
        if not self.reference_allowed(route_namespace, namespace, name):
            return Backend(namespace, name, weight,
                           unresolved=f"no ReferenceGrant in {namespace} allows HTTPRoutes from {route_namespace}")
        endpoints = self.endpoints(namespace, name, ref.get("port"))
        if endpoints is None:
            return Backend(namespace, name, weight, unresolved=f"Service {namespace}/{name} not found")
        return Backend(namespace, name, weight, endpoints)


def service_host(host: str) -> tuple[str, str] | None:
    """(namespace, service) for a cluster DNS name such as `llama-stable.team-a.svc.cluster.local`."""
    name = host.split(":", 1)[0].lower()
    for suffix in SERVICE_DOMAIN_SUFFIXES[::-1]:
        if name.endswith(suffix):
            parts = name[: -len(suffix)].split(".")
            if len(parts) == 2 and all(parts):
                return parts[1], parts[0]
    return None


def _hostname_rank(patterns: list[str], host: str) -> tuple[int, int] | None:
    """How specifically a route's hostnames match the request's Host, None when they do not: the Gateway API's
    first two precedence criteria, characters in a matching non-wildcard hostname, then in a matching hostname.
    A route without hostnames matches every Host, least specifically."""
    if not patterns:
        return (0, 0)
    name = host.split(":", 1)[0].lower()
    best: tuple[int, int] | None = None
    for pattern in patterns:
        pattern = pattern.lower()
        rank = None
        if pattern == name:
            rank = (len(pattern), len(pattern))
        elif pattern.startswith("*.") and name.endswith(pattern[1:]) and name != pattern[2:]:
            rank = (0, len(pattern))
        if rank is not None and (best is None or rank > best):
            best = rank
    return best


def _path_match_length(match: Mapping[str, Any], path: str) -> int | None:
    """How specific the match is for this path (longer wins), None when it does not match."""
    spec = match.get("path") or {"type": "PathPrefix", "value": "/"}
    kind, value = spec.get("type", "PathPrefix"), spec.get("value", "/")
    if kind == "Exact":
        return len(value) + 1 if path == value else None
    if kind == "PathPrefix":
        prefix = value.rstrip("/")
        if path == prefix or path.startswith(prefix + "/") or prefix == "":
            return len(prefix)
    return None


class Router:
    """Per-request decisions over a ClusterView; keeps the round-robin state between views."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.view = ClusterView()
        self._rule_turns: dict[tuple[str, str, int], _SmoothWeights] = {}
        self._pod_turns: dict[tuple[str, str], int] = {}

    def update(self, view: ClusterView) -> None:
        self.view = view

    def route(self, host: str, path: str) -> Decision:
        target = service_host(host)
        if target is not None:
            namespace, service = target
            endpoints = self.view.endpoints(namespace, service, None)
            if endpoints is None:
                return Decision(None, 503, f"no Service {namespace}/{service}")
            return self._to_pod(Backend(namespace, service, 1, endpoints))
        # Precedence: hostname specificity, then path specificity (Gateway API HTTPRoute rule precedence).
        best: tuple[tuple[int, int, int], str, str, int] | None = None
        for route in self.view.routes:
            if self.view.attached(route, self.gateway) is None:
                continue
            spec = route.get("spec") or {}
            host_rank = _hostname_rank(spec.get("hostnames") or [], host)
            if host_rank is None:
                continue
            for index, rule in enumerate(spec.get("rules") or []):
                for match in rule.get("matches") or [{}]:
                    length = _path_match_length(match, path)
                    if length is None:
                        continue
                    rank = (*host_rank, length)
                    if best is None or rank > best[0]:
                        best = (rank, str(_meta(route).get("namespace")), str(_meta(route).get("name")), index)
        if best is None:
            return Decision(None, 404, "no HTTPRoute matches")
        _, namespace, name, index = best
        route = next(r for r in self.view.routes
                     if (_meta(r).get("namespace"), _meta(r).get("name")) == (namespace, name))
        refs = (route["spec"]["rules"][index]).get("backendRefs") or []
        backends = [self.view.backend(namespace, ref) for ref in refs]
        turns = self._rule_turns.setdefault((namespace, name, index), _SmoothWeights())
        chosen = turns.pick([b.weight for b in backends])
        if chosen is None:
            return Decision(None, 500, "every backendRef weighs 0")
        backend = backends[chosen]
        if backend.unresolved is not None:
            return Decision(None, 500, backend.unresolved, backend)
        return self._to_pod(backend)

    def _to_pod(self, backend: Backend) -> Decision:
        if not backend.endpoints:
            return Decision(None, 503, f"Service {backend.namespace}/{backend.service} has no ready pods", backend)
        key = (backend.namespace, backend.service)
        turn = self._pod_turns.get(key, 0)
        self._pod_turns[key] = turn + 1
        return Decision(backend.endpoints[turn % len(backend.endpoints)], backend=backend)


STANDIN_CONTROLLER = "specdec.io/gateway-standin"
# The GatewayClass name a Gateway names to be served by the stand-in (`specdec-runtime gateway --gateway-class`).
STANDIN_GATEWAY_CLASS = "specdec-standin"


def route_parent_status(view: ClusterView, route: Mapping[str, Any], gateway: str) -> list[dict[str, Any]]:
    """The Gateway API conditions a Gateway controller writes for one attached route: Accepted (the stand-in
    takes every HTTPRoute attached to its Gateway) and ResolvedRefs with the spec's reasons (RefNotPermitted,
    BackendNotFound, InvalidKind) and a message naming the backendRef. lastTransitionTime is the caller's."""
    meta = _meta(route)
    namespace, generation = str(meta.get("namespace")), meta.get("generation")
    problems: list[tuple[str, str]] = []
    for rule in (route.get("spec") or {}).get("rules") or []:
        for ref in rule.get("backendRefs") or []:
            target_ns, name = ref.get("namespace") or namespace, ref.get("name")
            if (ref.get("group") or "") != "" or (ref.get("kind") or "Service") != "Service":
                problems.append(("InvalidKind", f"backendRef {name}: kind {ref.get('kind')} is not supported"))
            elif not view.reference_allowed(namespace, target_ns, str(name)):
                problems.append(("RefNotPermitted", f"backendRef to Service {target_ns}/{name} is not permitted: "
                                                    f"no ReferenceGrant in {target_ns} allows HTTPRoutes from "
                                                    f"{namespace}"))
            elif (target_ns, name) not in view.services:
                problems.append(("BackendNotFound", f"backendRef to Service {target_ns}/{name}: not found"))
    resolved: dict[str, Any] = {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs",
                                "message": "every backendRef resolves"}
    if problems:
        resolved = {"type": "ResolvedRefs", "status": "False", "reason": problems[0][0],
                    "message": "; ".join(message for _, message in problems)}
    accepted = {"type": "Accepted", "status": "True", "reason": "Accepted",
                "message": f"attached to Gateway {gateway}"}
    for condition in (accepted, resolved):
        if generation is not None:
            condition["observedGeneration"] = generation
    return [accepted, resolved]
