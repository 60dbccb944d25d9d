"""The local cluster's data path: a loopback Gateway and kube-proxy stand-in in front of the fake pods.

Dev tooling like the fleet driver. It watches Services, Pods, HTTPRoutes, ReferenceGrants and Gateways and
forwards each request it receives on a loopback address to a fake pod's loopback IP, as routing.py decides: a
request for a Service DNS name spreads over the Service's ready pods; any other request goes through the
HTTPRoutes attached to a Gateway it stands in for, by their weights. It stands in for the Gateways named
--gateway-name whose gatewayClassName is --gateway-class (in the route's namespace, or the one its parentRef
names), and like a Gateway controller it writes each attached route's status.parents entry (Accepted,
ResolvedRefs with the Gateway API's reasons) and leaves every other route alone. Why this exists instead of a
real data plane, and how far a real Gateway (Traefik) got here, is in docs/local-traffic.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from specdec_runtime.fleet_kube import require_loopback_server
from specdec_runtime.routing import (
    GATEWAY_GROUP,
    STANDIN_CONTROLLER,
    STANDIN_GATEWAY_CLASS,
    ClusterView,
    Router,
    route_parent_status,
)

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
RETRY_S = 1.0
# Hop-by-hop headers a proxy must not forward (RFC 9110 7.6.1), plus what aiohttp sets itself.
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                         "upgrade", "host", "content-length"})
# The client would send a dict as a JSON patch (the first type the endpoint lists); ours is a merge patch.
MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
# Idle upstream connections are closed after this, below vLLM's keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s; the
# simulator's HTTP_KEEP_ALIVE_S): reusing a connection the engine is closing at that very moment fails the request
# ("Server disconnected", a 502), as an upstream idle timeout longer than the backend's does behind any proxy.
# aiohttp's default is 15 s.
UPSTREAM_IDLE_S = 2.0
ROUTED_BY = "x-specdec-standin-backend"  # which Service a request went to, for logs and debugging
LOGGED_ENDPOINTS = 8  # endpoints named per change in the log (a fleet's first list has thousands)


class KindCache:
    """One kind's objects, kept current by list + watch, as plain dicts in the API's own field names."""

    def __init__(self, name: str, list_fn: Callable[..., Awaitable[Any]], api: client.ApiClient,
                 changed: asyncio.Event) -> None:
        self.name = name
        self._list = list_fn
        self._api = api
        self._changed = changed
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()

    def _plain(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self._api.sanitize_for_serialization(obj)

    async def run(self) -> None:
        version: str | None = None
        while True:
            try:
                if version is None:
                    listed = self._plain(await self._list())
                    self.objects = {item["metadata"]["uid"]: item for item in listed.get("items") or []}
                    version = listed["metadata"]["resourceVersion"]
                    self.synced.set()
                    self._changed.set()
                async with watch.Watch() as stream:
                    async for event in stream.stream(self._list, resource_version=version,
                                                     timeout_seconds=WATCH_TIMEOUT_S, allow_watch_bookmarks=True):
                        raw = event["raw_object"]
                        version = raw["metadata"]["resourceVersion"]
                        if event["type"] == "BOOKMARK":
                            continue
                        if event["type"] == "DELETED":
                            self.objects.pop(raw["metadata"]["uid"], None)
                        else:
                            self.objects[raw["metadata"]["uid"]] = raw
                        self._changed.set()
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status == 410:
                    version = None
                    continue
                if err.status == 404:  # the Gateway API CRDs are not installed (yet): nothing to route by
                    self.objects = {}
                    self.synced.set()
                logger.warning("%s watch failed (%s %s); retrying", self.name, err.status, err.reason)
                await asyncio.sleep(RETRY_S)
            except Exception as err:  # a dropped stream, a restarting API server
                logger.warning("%s watch interrupted: %s; retrying", self.name, err)
                await asyncio.sleep(RETRY_S)


def upstream_session() -> ClientSession:
    """The client the stand-in forwards with: no total timeout (completions stream for as long as they take), and
    idle connections dropped before the engine drops them (UPSTREAM_IDLE_S)."""
    return ClientSession(timeout=ClientTimeout(total=None, sock_connect=5),
                         connector=TCPConnector(keepalive_timeout=UPSTREAM_IDLE_S))


class GatewayStandIn:
    def __init__(self, router: Router, session: ClientSession) -> None:
        self.router = router
        self.session = session

    async def handle(self, request: web.Request) -> web.StreamResponse:
        decision = self.router.route(request.host, request.path)
        if decision.endpoint is None:
            return web.json_response({"error": {"message": decision.reason, "code": decision.status}},
                                     status=decision.status)
        endpoint = decision.endpoint
        url = f"http://{endpoint.ip}:{endpoint.port}{request.path_qs}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        response: web.StreamResponse | None = None
        try:
            async with self.session.request(request.method, url, headers=headers, data=body) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
                if decision.backend is not None:
                    response.headers[ROUTED_BY] = f"{decision.backend.namespace}/{decision.backend.service}"
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (ClientError, OSError) as err:
            if response is not None and response.prepared:
                return response  # the backend dropped a stream we had begun to relay: the client sees it cut
            # A Gateway answers 502 when the backend refuses or drops the connection.
            logger.warning("502 for %s %s%s: upstream %s:%s: %s", request.method, request.host, request.path,
                           endpoint.ip, endpoint.port, err)
            return web.json_response({"error": {"message": f"upstream {endpoint.ip}:{endpoint.port}: {err}",
                                                 "code": 502}}, status=502)


def _status_differs(route: Mapping[str, Any], conditions: list[dict[str, Any]]) -> bool:
    ours = next((p for p in (route.get("status") or {}).get("parents") or []
                 if p.get("controllerName") == STANDIN_CONTROLLER), None)
    if ours is None:
        return True
    keys = ("type", "status", "reason", "message", "observedGeneration")
    have = {c.get("type"): tuple(c.get(k) for k in keys) for c in ours.get("conditions") or []}
    return any(have.get(c["type"]) != tuple(c.get(k) for k in keys) for c in conditions)


async def _write_route_status(custom: client.CustomObjectsApi, view: ClusterView, router: Router) -> None:
    """As a Gateway controller does: our entry in status.parents of every route attached to our Gateway."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for route in view.routes:
        parent = view.attached(route, router.gateway)
        if parent is None:
            continue
        conditions = route_parent_status(view, route, router.gateway)
        if not _status_differs(route, conditions):
            continue
        for condition in conditions:
            condition["lastTransitionTime"] = stamp
        others = [p for p in (route.get("status") or {}).get("parents") or []
                  if p.get("controllerName") != STANDIN_CONTROLLER]
        body = {"status": {"parents": [*others, {"parentRef": parent, "controllerName": STANDIN_CONTROLLER,
                                                  "conditions": conditions}]}}
        meta = route["metadata"]
        try:
            await custom.patch_namespaced_custom_object_status(
                GATEWAY_GROUP, "v1", meta["namespace"], "httproutes", meta["name"], body, **MERGE_PATCH)
        except ApiException as err:
            # Deleted meanwhile, or a conflict: the watch brings the route back and we write again.
            logger.info("HTTPRoute %s/%s status not written: %s %s", meta["namespace"], meta["name"], err.status,
                        err.reason)


def _serving(view: ClusterView) -> set[str]:
    """The ready pods the view routes to, as `namespace/name ip`, for the log."""
    return {f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')} "
            f"{(p.get('status') or {}).get('podIP')}" for p in view.pods}


async def _keep_router_current(router: Router, caches: dict[str, KindCache], changed: asyncio.Event,
                               status_due: asyncio.Event, gateway_class: str) -> None:
    """Route by every change at once. Route status is written by `_keep_route_status_current`, so a slow status
    write never holds the router on a pod that is being deleted (its preStop wait is all the time there is)."""
    before = _serving(router.view)  # the endpoints routed to, kept from one change to the next for the log
    while True:
        await changed.wait()
        changed.clear()
        view = ClusterView(
            services=caches["services"].objects.values(), pods=caches["pods"].objects.values(),
            routes=caches["httproutes"].objects.values(), grants=caches["referencegrants"].objects.values(),
            gateways=[g for g in caches["gateways"].objects.values()
                      if (g.get("spec") or {}).get("gatewayClassName") == gateway_class],
        )
        after = _serving(view)
        router.update(view)
        if before != after:
            added, removed = sorted(after - before), sorted(before - after)
            logger.info("endpoints: %d added %s, %d removed %s", len(added), added[:LOGGED_ENDPOINTS], len(removed),
                        removed[:LOGGED_ENDPOINTS])
        before = after
        status_due.set()


async def _keep_route_status_current(router: Router, custom: client.CustomObjectsApi, status_due: asyncio.Event
                                     ) -> None:
    """As a Gateway controller does, beside the data path: the routes' status from the router's latest view."""
    while True:
        await status_due.wait()
        status_due.clear()
        await _write_route_status(custom, router.view, router)


async def run_gateway_standin(kubeconfig: str | None, host: str, port: int, gateway: str,
                              stop: asyncio.Event, ready: Callable[[], None] | None = None,
                              gateway_class: str = STANDIN_GATEWAY_CLASS) -> None:
    """Serve until stop is set, for the Gateways named `gateway` whose gatewayClassName is `gateway_class`.
    Binds only loopback addresses."""
    require_loopback_server(f"http://{host}")  # the listener, too, is loopback only
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    require_loopback_server(configuration.host)
    async with client.ApiClient(configuration) as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        changed = asyncio.Event()

        def custom_list(plural: str, version: str) -> Callable[..., Awaitable[Any]]:
            async def list_fn(**kwargs: Any) -> Any:
                return await custom.list_cluster_custom_object("gateway.networking.k8s.io", version, plural,
                                                               **kwargs)
            return list_fn

        caches = {
            "services": KindCache("services", core.list_service_for_all_namespaces, api, changed),
            "pods": KindCache("pods", core.list_pod_for_all_namespaces, api, changed),
            "httproutes": KindCache("httproutes", custom_list("httproutes", "v1"), api, changed),
            "referencegrants": KindCache("referencegrants", custom_list("referencegrants", "v1beta1"), api, changed),
            "gateways": KindCache("gateways", custom_list("gateways", "v1"), api, changed),
        }
        router = Router(gateway)
        tasks = [asyncio.create_task(cache.run()) for cache in caches.values()]
        status_due = asyncio.Event()
        tasks.append(asyncio.create_task(_keep_router_current(router, caches, changed, status_due, gateway_class)))
        tasks.append(asyncio.create_task(_keep_route_status_current(router, custom, status_due)))
        for cache in caches.values():
            await cache.synced.wait()
        async with upstream_session() as session:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", GatewayStandIn(router, session).handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            logger.info("gateway stand-in for Gateway %r serving on %s:%d", gateway, host, port)
            if ready is not None:
                ready()
            try:
                await stop.wait()
            finally:
                await runner.cleanup()
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
