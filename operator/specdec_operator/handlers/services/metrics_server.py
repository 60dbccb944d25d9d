"""The operator's /metrics behind Kubernetes authentication, as controller-runtime's secure metrics serve it.

A scraper sends its ServiceAccount token (`Authorization: Bearer ...`). A TokenReview says whose it is and a
SubjectAccessReview whether that identity may `get` the non-resource URL `/metrics` (the chart's
`<release>-metrics-reader` ClusterRole grants it; docs/metrics.md). No token: 401; a token the API server
rejects: 401; an identity without the grant: 403. Verdicts are cached briefly per token so a scrape costs
no API request most of the time.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from specdec_operator.kube.api import KubeApi, KubeApiError

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
METRICS_PATH = "/metrics"
VERDICT_TTL_S = 60.0
MAX_CACHED_TOKENS = 256


@dataclass(frozen=True)
class Verdict:
    status: int  # 200, 401 or 403
    reason: str


Review = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class MetricsAuthorizer:
    """Token -> Verdict through the API server, cached for VERDICT_TTL_S (monotonic clock)."""

    def __init__(self, review: Review, clock: Callable[[], float] = time.monotonic) -> None:
        self._review = review
        self._clock = clock
        self._cache: dict[str, tuple[float, Verdict]] = {}

    async def verdict(self, authorization: str | None) -> Verdict:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Verdict(401, "a bearer token is required (Authorization: Bearer <ServiceAccount token>)")
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        verdict = await self._ask(token.strip())
        if len(self._cache) >= MAX_CACHED_TOKENS:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= MAX_CACHED_TOKENS:
                self._cache.clear()
        self._cache[key] = (now + VERDICT_TTL_S, verdict)
        return verdict

    async def _ask(self, token: str) -> Verdict:
        review = await self._review(TOKEN_REVIEWS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Verdict(401, f"token not authenticated: {status.get('error') or 'rejected by the API server'}")
        user = status.get("user") or {}
        access = await self._review(ACCESS_REVIEWS, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user.get("username", ""), "uid": user.get("uid", ""), "groups": user.get("groups", []),
                     "extra": user.get("extra", {}),
                     "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"}}})
        if (access.get("status") or {}).get("allowed"):
            return Verdict(200, "")
        return Verdict(403, f"{user.get('username', '?')} may not get {METRICS_PATH}: bind it to the "
                            "<release>-metrics-reader ClusterRole (docs/metrics.md)")


def metrics_app(registry: CollectorRegistry, authorizer: MetricsAuthorizer) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        try:
            verdict = await authorizer.verdict(request.headers.get("Authorization"))
        except KubeApiError as error:
            log.warning("metrics authentication could not ask the API server: %s", error)
            return web.Response(status=503, text="cannot authenticate now: the API server did not answer\n")
        if verdict.status != 200:
            return web.Response(status=verdict.status, text=verdict.reason + "\n")
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get(METRICS_PATH, metrics)
    return app


async def serve_authenticated_metrics(
    api: KubeApi, registry: CollectorRegistry, port: int, host: str = "0.0.0.0",
    clock: Callable[[], float] = time.monotonic,
) -> web.AppRunner:
    """Starts the server on the running loop; the caller keeps the runner and cleans it up on stop. `clock` ages
    cached verdicts (the operator passes OperatorContext.clock)."""
    runner = web.AppRunner(metrics_app(registry, MetricsAuthorizer(api.review, clock)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
