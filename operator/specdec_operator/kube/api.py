"""Server-side apply, status patches, reads and deletes, over kubernetes_asyncio's ApiClient.

Every write goes through here, under one field manager, and is counted in specdec_api_writes_total.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client, config

from specdec_operator.metrics import API_WRITES

USER_AGENT = "specdec-operator"

# kind -> (API path prefix, plural). Only kinds the operator owns or reads.
RESOURCES: dict[str, tuple[str, str]] = {
    "Deployment": ("apis/apps/v1", "deployments"),
    "ConfigMap": ("api/v1", "configmaps"),
    "Service": ("api/v1", "services"),
    "PodDisruptionBudget": ("apis/policy/v1", "poddisruptionbudgets"),
    "Pod": ("api/v1", "pods"),
    "HTTPRoute": ("apis/gateway.networking.k8s.io/v1", "httproutes"),
    "SpeculativeModel": ("apis/specdec.io/v1alpha1", "speculativemodels"),
    "KopfPeering": ("apis/kopf.dev/v1", "kopfpeerings"),
    "ClusterKopfPeering": ("apis/kopf.dev/v1", "clusterkopfpeerings"),
}
CLUSTER_SCOPED = frozenset({"ClusterKopfPeering"})


class KubeApiError(Exception):
    """A non-2xx answer, with the API server's own message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class KubeApi:
    def __init__(self, api_client: client.ApiClient, field_manager: str) -> None:
        self._client = api_client
        self.field_manager = field_manager

    @classmethod
    async def connect(cls, field_manager: str) -> KubeApi:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            await config.load_kube_config()
        api_client = client.ApiClient()
        # Lets the audit log tell the operator's own writes apart from kopf's and from humans'.
        api_client.user_agent = USER_AGENT
        return cls(api_client, field_manager)

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
        response = await self._client.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        text = await response.read()
        data = json.loads(text) if text else None
        if response.status >= 400:
            info = data if isinstance(data, dict) else {}
            raise KubeApiError(response.status, str(info.get("reason", "")), str(info.get("message", text[:200])))
        return data

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", self._path(kind, namespace, name))
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise
        return result

    async def list(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        result = await self._call(
            "GET", self._path(kind, namespace), query=[("labelSelector", label_selector)]
        )
        # List responses omit apiVersion and kind on items; restore them so items compare like single GETs.
        api_version = RESOURCES[kind][0].split("/", 1)[1]
        return [{"apiVersion": api_version, "kind": kind, **item} for item in result.get("items", [])]

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

    async def patch_status(self, kind: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the status subresource; lists in status are replaced whole, as we compute them whole."""
        API_WRITES.labels(kind=kind, verb="patch-status").inc()
        await self._call(
            "PATCH",
            self._path(kind, namespace, name, "status"),
            body={"status": dict(status)},
            content_type="application/merge-patch+json",
        )
