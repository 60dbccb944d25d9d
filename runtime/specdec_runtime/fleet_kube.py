"""The fleet driver's only contact with Kubernetes: list our runtime pods on kwok nodes with their config.

Dev tooling for the local cluster, kept in one module so the rest of the runtime stays free of the
Kubernetes client.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from specdec_runtime import contract
from specdec_runtime.config import RuntimeConfig

logger = logging.getLogger(__name__)

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
RUNTIME_SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY},{contract.LABEL_NAME}={contract.RUNTIME_NAME}"


@dataclass(frozen=True)
class RuntimePod:
    """A Running runtime pod on a kwok node, with what the simulator standing in for it needs."""

    uid: str
    namespace: str
    name: str
    pod_ip: str
    config: RuntimeConfig
    profile: str | None  # the pod's simulator-profile annotation, if any


class KubePodSource:
    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)
        self._bad_configs: set[str] = set()

    async def runtime_pods(self) -> list[RuntimePod]:
        nodes = await self._core.list_node()
        kwok_nodes = {
            node.metadata.name
            for node in nodes.items
            if (node.metadata.annotations or {}).get(KWOK_NODE_ANNOTATION) == KWOK_NODE_VALUE
        }
        pods = await self._core.list_pod_for_all_namespaces(label_selector=RUNTIME_SELECTOR)
        found: list[RuntimePod] = []
        for pod in pods.items:
            # A terminating pod is gone as far as its process is concerned.
            if pod.metadata.deletion_timestamp is not None or pod.status.phase != "Running":
                continue
            if pod.spec.node_name not in kwok_nodes or not pod.status.pod_ip:
                continue
            runtime_config = await self._config_of(pod)
            if runtime_config is not None:
                annotations = pod.metadata.annotations or {}
                found.append(
                    RuntimePod(
                        uid=pod.metadata.uid,
                        namespace=pod.metadata.namespace,
                        name=pod.metadata.name,
                        pod_ip=pod.status.pod_ip,
                        config=runtime_config,
                        profile=annotations.get(contract.ANNOTATION_SIMULATOR_PROFILE),
                    )
                )
        return found

    async def _config_of(self, pod: Any) -> RuntimeConfig | None:
        where = f"pod {pod.metadata.namespace}/{pod.metadata.name}"
        volume = next((v for v in pod.spec.volumes or [] if v.name == contract.CONFIG_VOLUME), None)
        if volume is None or volume.config_map is None:
            self._skip(pod.metadata.uid, f"{where}: no ConfigMap volume {contract.CONFIG_VOLUME!r}")
            return None
        try:
            config_map = await self._core.read_namespaced_config_map(volume.config_map.name, pod.metadata.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            # The pod can be Running before its ConfigMap exists; try again on the next resync.
            return None
        text = (config_map.data or {}).get(contract.CONFIG_KEY)
        if text is None:
            self._skip(pod.metadata.uid, f"{where}: ConfigMap has no key {contract.CONFIG_KEY!r}")
            return None
        try:
            return RuntimeConfig.from_json(text)
        except (ValueError, ValidationError) as err:
            self._skip(pod.metadata.uid, f"{where}: bad {contract.CONFIG_KEY}: {err}")
            return None

    def _skip(self, uid: str, reason: str) -> None:
        # Logged once per pod: the driver re-lists every second.
        if uid not in self._bad_configs:
            self._bad_configs.add(uid)
            logger.error("not simulating %s", reason)


def require_loopback_server(host_url: str | None) -> None:
    """The fleet driver is for the local control plane only; never talk to a remote API server."""
    host = urlsplit(host_url or "").hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise RuntimeError(f"refusing API server {host_url}: the fleet driver only talks to a loopback control plane")


@asynccontextmanager
async def kube_pod_source(kubeconfig: str | None) -> AsyncIterator[KubePodSource]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    require_loopback_server(configuration.host)
    async with client.ApiClient(configuration) as api:
        yield KubePodSource(api)
