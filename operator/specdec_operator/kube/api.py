"""Server-side apply, status patches, reads and deletes, over kubernetes_asyncio's ApiClient.

Every write goes through here, under one field manager, and is counted in specdec_api_writes_total.
Every call has a timeout; throttling (429), server errors (5xx) and broken connections are retried with
exponential backoff and full jitter, honouring Retry-After (kube/retry.py). Refusals (4xx) are not
retried here: they carry the server's message up to the reconcile, which reports them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from specdec_operator.kube.retry import RETRIABLE_STATUSES, Backoff, parse_error_body, retry_after_seconds
from specdec_operator.metrics import API_WRITES

USER_AGENT = "specdec-operator"
# A stuck connection must never hang a model's loop: every request ends within this many seconds.
REQUEST_TIMEOUT_S = 20.0
DEFAULT_BACKOFF = Backoff()
log = logging.getLogger(__name__)

# kind -> (API path prefix, plural). Only kinds the operator owns or reads.
RESOURCES: dict[str, tuple[str, str]] = {
    "Deployment": ("apis/apps/v1", "deployments"),
    "ConfigMap": ("api/v1", "configmaps"),
    "Service": ("api/v1", "services"),
    "PodDisruptionBudget": ("apis/policy/v1", "poddisruptionbudgets"),
    "Pod": ("api/v1", "pods"),
    "Node": ("api/v1", "nodes"),
    "HTTPRoute": ("apis/gateway.networking.k8s.io/v1", "httproutes"),
    "ReferenceGrant": ("apis/gateway.networking.k8s.io/v1beta1", "referencegrants"),
    "SpeculativeModel": ("apis/specdec.io/v1alpha1", "speculativemodels"),
    "KopfPeering": ("apis/kopf.dev/v1", "kopfpeerings"),
    "ClusterKopfPeering": ("apis/kopf.dev/v1", "clusterkopfpeerings"),
}
CLUSTER_SCOPED = frozenset({"ClusterKopfPeering", "Node"})


class KubeApiError(Exception):
    """A non-2xx answer, with the API server's own message."""

    def __init__(self, status: int, reason: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status  # 0 when no answer arrived (timeout, connection refused)
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def refused(self) -> bool:
        """The server understood the request and said no (bad input, forbidden, conflict): retrying the
        same request will not help until something changes."""
        return 400 <= self.status < 500 and self.status != 429


class NotOwnedError(Exception):
    """An object under a name we compute exists and does not carry our owner reference: never taken over."""

    def __init__(self, kind: str, name: str, holders: str) -> None:
        super().__init__(f"{kind}/{name} exists and is not owned by this SpeculativeModel ({holders}); left "
                         "alone: delete or rename it, or rename the model")
        self.kind = kind
        self.name = name


def owned_by(body: Mapping[str, Any], owner_uid: str) -> bool:
    return any(str(ref.get("uid", "")) == owner_uid for ref in (body.get("metadata") or {}).get("ownerReferences")
               or [])


def _holders(body: Mapping[str, Any]) -> str:
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    if not refs:
        return "no owner reference"
    return "owned by " + ", ".join(f"{ref.get('kind')}/{ref.get('name')}" for ref in refs)


class KubeApi:
    def __init__(
        self,
        api_client: client.ApiClient,
        field_manager: str,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        backoff: Backoff = DEFAULT_BACKOFF,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = api_client
        self.field_manager = field_manager
        self._timeout_s = timeout_s
        self._backoff = backoff
        self._sleep = sleep

    @classmethod
    async def connect(cls, field_manager: str, timeout_s: float = REQUEST_TIMEOUT_S) -> KubeApi:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            await config.load_kube_config()
        api_client = client.ApiClient()
        # Lets the audit log tell the operator's own writes apart from kopf's and from humans'.
        api_client.user_agent = USER_AGENT
        return cls(api_client, field_manager, timeout_s=timeout_s)

    async def close(self) -> None:
        await self._client.close()

    @staticmethod
    def _path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        prefix, plural = RESOURCES[kind]
        path = f"/{prefix}/{plural}" if kind in CLUSTER_SCOPED else f"/{prefix}/namespaces/{namespace}/{plural}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request, retried on 429/5xx/connection errors; every request we send is idempotent."""
        attempt = 0
        while True:
            try:
                return await self._call_once(method, path, query=query, body=body, content_type=content_type)
            except KubeApiError as error:
                if error.status not in RETRIABLE_STATUSES and error.status != 0:
                    raise
                if attempt >= self._backoff.attempts:
                    raise
                delay = self._backoff.delay(attempt, error.retry_after_s)
                log.info("%s %s answered %s; retry %d in %.2fs", method, path, error, attempt + 1, delay)
                await self._sleep(delay)
                attempt += 1

    async def _call_once(
        self, method: str, path: str, *, query: list[tuple[str, str]] | None, body: Any, content_type: str
    ) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._client.call_api(
                    path,
                    method,
                    query_params=query or [],
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    body=body,
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=self._timeout_s,
                )
                try:
                    text: bytes = await response.read()
                finally:
                    response.release()
        except (TimeoutError, aiohttp.ClientError) as error:
            # No answer at all: status 0, retried like a 503.
            raise KubeApiError(0, "Unreachable", f"{method} {path}: {type(error).__name__}: {error}") from error
        if response.status >= 400:
            reason, message = parse_error_body(response.status, text)
            retry_after = retry_after_seconds(dict(response.headers), time.time())
            raise KubeApiError(response.status, reason, message, retry_after)
        return json.loads(text) if text else None

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", self._path(kind, namespace, name))
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise
        return result

    async def list_versioned(
        self, kind: str, namespace: str, label_selector: str
    ) -> tuple[list[dict[str, Any]], str]:
        """The items, and the list's own resourceVersion: the point in the API server's history they are from."""
        result = await self._call(
            "GET", self._path(kind, namespace), query=[("labelSelector", label_selector)]
        )
        # List responses omit apiVersion and kind on items; restore them so items compare like single GETs.
        api_version = RESOURCES[kind][0].split("/", 1)[1]
        items = [{"apiVersion": api_version, "kind": kind, **item} for item in result.get("items", [])]
        return items, str((result.get("metadata") or {}).get("resourceVersion", ""))

    async def list(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return (await self.list_versioned(kind, namespace, label_selector))[0]

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with force: we are the only writer of the fields we declare."""
        meta = obj["metadata"]
        API_WRITES.labels(kind=obj["kind"], verb="apply").inc()
        result: dict[str, Any] = await self._call(
            "PATCH",
            self._path(obj["kind"], meta["namespace"], meta["name"]),
            query=[("fieldManager", self.field_manager), ("force", "true")],
            body=dict(obj),
            content_type="application/apply-patch+yaml",
        )
        return result

    async def apply_owned(self, obj: Mapping[str, Any], owner_uid: str, known_owned: bool) -> dict[str, Any]:
        """Server-side apply with force, but only over an object that is ours (issue 34, item 8).

        `known_owned`: the watch cache holds the object with our owner reference. Otherwise it is read first:
        absent, it is created by the apply; present without our owner reference (a Service someone made under
        the model's name, a colliding name), NotOwnedError, and nothing is written over it.
        """
        if not known_owned:
            meta = obj["metadata"]
            existing = await self.get(obj["kind"], meta.get("namespace", ""), meta["name"])
            if existing is not None and not owned_by(existing, owner_uid):
                raise NotOwnedError(obj["kind"], meta["name"], _holders(existing))
        return await self.apply(obj)

    async def create_if_absent(self, obj: Mapping[str, Any]) -> bool:
        """Create an object nobody else owns the content of; True if we created it, False if it existed."""
        meta = obj["metadata"]
        namespace = meta.get("namespace", "")
        if await self.get(obj["kind"], namespace, meta["name"]) is not None:
            return False
        API_WRITES.labels(kind=obj["kind"], verb="create").inc()
        try:
            await self._call("POST", self._path(obj["kind"], namespace), body=dict(obj))
        except KubeApiError as error:
            if error.status != 409:  # another replica created it between our GET and POST: same outcome
                raise
            return False
        return True

    async def review(self, api_path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a review (TokenReview, SubjectAccessReview): the API server answers in status, stores nothing."""
        result: dict[str, Any] = await self._call("POST", api_path, body=dict(body))
        return result

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        API_WRITES.labels(kind=kind, verb="delete").inc()
        try:
            await self._call(
                "DELETE", self._path(kind, namespace, name), body={"propagationPolicy": "Background"}
            )
        except KubeApiError as error:
            if error.status != 404:
                raise

    async def patch_merge(self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """JSON merge patch of the object itself (metadata only: the operator never writes a spec)."""
        API_WRITES.labels(kind=kind, verb="patch").inc()
        await self._call(
            "PATCH", self._path(kind, namespace, name), body=dict(patch), content_type="application/merge-patch+json"
        )

    async def patch_status(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Merge-patch the status subresource and return the object the server stored.

        `patch` is the status diff (None removes a key; lists are replaced whole, as we compute them whole).
        With `resource_version` the write is conditional: a 409 means someone wrote in between, and the
        caller must re-read and re-evaluate instead of overwriting.
        """
        API_WRITES.labels(kind=kind, verb="patch-status").inc()
        body: dict[str, Any] = {"status": dict(patch)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        result: dict[str, Any] = await self._call(
            "PATCH",
            self._path(kind, namespace, name, "status"),
            body=body,
            content_type="application/merge-patch+json",
        )
        return result
