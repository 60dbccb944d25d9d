"""The fleet driver's only contact with Kubernetes: our runtime pods on kwok nodes, with their config.

Dev tooling for the local cluster, kept in one module so the rest of the runtime stays free of the
Kubernetes client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from specdec_runtime import contract, podstates
from specdec_runtime.config import RuntimeConfig
from specdec_runtime.podstates import Terminated, Waiting

logger = logging.getLogger(__name__)

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
RUNTIME_SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY},{contract.LABEL_NAME}={contract.RUNTIME_NAME}"


@dataclass(frozen=True)
class Termination:
    """A pod being deleted, as its kubelet reads it: the preStop wait before SIGTERM, and the end of the grace
    period (its deletionTimestamp, as a monotonic time), when whatever still runs is killed."""

    pre_stop_s: float
    deadline: float


@dataclass(frozen=True)
class RuntimePod:
    """A Running runtime pod on a kwok node, with what the simulator standing in for it needs."""

    uid: str
    namespace: str
    name: str
    pod_ip: str
    config: RuntimeConfig
    profile: str | None  # the pod's simulator-profile annotation, if any
    simulate_oom: bool = False  # the pod env asks for a simulated OOM kill (podstates.SIMULATE_OOM_ENV)
    command: tuple[str, ...] = ()  # the runtime container's command + args, as a kubelet would run them
    terminating: Termination | None = None  # set once the pod is being deleted (termination.py)


LIST_PAGE = 500
# How often a pod held by a missing Secret or an unpullable image is looked at again (the kubelet retries too).
START_RETRY_S = 10.0
WATCH_TIMEOUT_S = 300
WATCH_RETRY_S = 1.0


class KubePodSource:
    """Runtime pods from a watch cache; each pod's ConfigMap is read once, when the pod is first seen.

    A 2,000-pod fleet must not cost the API server a LIST of every pod and a GET of every ConfigMap
    each second: the pods come from one paginated LIST and then a watch, nodes are looked up once each,
    and a pod's config is fixed for its life (a new config means a new pod).
    """

    def __init__(self, api: client.ApiClient, max_pre_stop_s: float | None = None) -> None:
        self._core = client.CoreV1Api(api)
        # The preStop wait is the pod's; a test cluster sets a shorter one (its Gateway learns of a deletion by watch).
        self._max_pre_stop_s = max_pre_stop_s
        self._handed: dict[str, RuntimePod] = {}  # uid -> the pod as last handed to the supervisor
        self._finished: set[str] = set()  # terminating pods nothing ran for, deleted (or being deleted) at once
        self._bad_configs: set[str] = set()
        self._pods: dict[str, Any] = {}  # uid -> pod, maintained by the watch
        self._configs: dict[str, RuntimeConfig] = {}  # uid -> its config, read once
        self._kwok_nodes: dict[str, bool] = {}
        self._synced = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._api = api
        # Start-up checks (Secrets, ConfigMaps, image) of each pod: passed once, or failing and retried later.
        self._started: set[str] = set()
        self._blocked: dict[str, tuple[float, int]] = {}  # uid -> (monotonic retry time, attempts)
        self._pullable = podstates.pullable_images()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    async def runtime_pods(self) -> list[RuntimePod]:
        if self._watcher is None or self._watcher.done():
            if self._watcher is not None and not self._watcher.cancelled() and self._watcher.exception():
                logger.error("pod watch stopped: %s; restarting it", self._watcher.exception())
            self._synced.clear()
            self._watcher = asyncio.create_task(self._watch_pods())
        await self._synced.wait()
        found: list[RuntimePod] = []
        for uid, pod in list(self._pods.items()):
            if pod.metadata.deletion_timestamp is not None:
                terminating = await self._terminating(pod)
                if terminating is not None:
                    found.append(terminating)
                continue
            if uid in self._bad_configs:
                continue
            # Pending: one we hold (a missing Secret, an image it cannot pull), looked at again by _may_start.
            if pod.status.phase not in ("Running", "Pending"):
                continue
            if not pod.status.pod_ip or not await self._on_kwok_node(pod.spec.node_name):
                continue
            if not await self._may_start(pod):
                continue
            runtime_config = self._configs.get(uid) or await self._config_of(pod)
            if runtime_config is None:
                continue
            self._configs[uid] = runtime_config
            annotations = pod.metadata.annotations or {}
            container = podstates.runtime_container(self._plain(pod))
            found.append(handed := RuntimePod(
                uid=uid, namespace=pod.metadata.namespace, name=pod.metadata.name, pod_ip=pod.status.pod_ip,
                config=runtime_config, profile=annotations.get(contract.ANNOTATION_SIMULATOR_PROFILE),
                simulate_oom=podstates.simulates_oom(container),
                command=(*container.get("command", []), *container.get("args", [])),
            ))
            self._handed[uid] = handed
        return found

    async def _terminating(self, pod: Any) -> RuntimePod | None:
        """A pod being deleted, for its supervisor to terminate (termination.py), if it was handed one; else
        nothing ever ran for it, and its deletion is finished at once, as the kubelet does."""
        uid = pod.metadata.uid
        handed = self._handed.get(uid)
        if handed is None:
            if uid not in self._finished and pod.spec.node_name and await self._on_kwok_node(pod.spec.node_name):
                self._finished.add(uid)
                try:
                    await self._delete_now(pod.metadata.namespace, pod.metadata.name, uid)
                except ApiException as err:
                    logger.warning("deleting pod %s/%s failed (%s %s); trying again", pod.metadata.namespace,
                                   pod.metadata.name, err.status, err.reason)
            return None
        pre_stop_s = podstates.pre_stop_sleep_s(podstates.runtime_container(self._plain(pod)))
        if self._max_pre_stop_s is not None:
            pre_stop_s = min(pre_stop_s, self._max_pre_stop_s)
        # The deletionTimestamp is when the grace period ends; the one wall-clock reading here turns it into a
        # monotonic deadline.
        left = (pod.metadata.deletion_timestamp - datetime.now(UTC)).total_seconds()
        return dataclasses.replace(handed, terminating=Termination(pre_stop_s, time.monotonic() + left))

    async def finish_deletion(self, pod: RuntimePod) -> None:
        """Its container stopped: delete the pod object now (grace 0, this very pod), as the kubelet does last."""
        await self._delete_now(pod.namespace, pod.name, pod.uid)

    async def _delete_now(self, namespace: str, name: str, uid: str) -> None:
        body = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        try:
            await self._core.delete_namespaced_pod(name, namespace, body=body)
        except ApiException as err:
            if err.status not in (404, 409):  # gone already, or a new pod under its name
                self._finished.discard(uid)
                raise

    def _plain(self, pod: Any) -> dict[str, Any]:
        """The pod as the API server's JSON (camelCase dicts), for the pure podstates functions."""
        return dict(self._api.sanitize_for_serialization(pod))

    async def _may_start(self, pod: Any) -> bool:
        """Whether the runtime container could start, as a kubelet would find: every Secret and ConfigMap key
        its env reads exists, and its image can be pulled. If not, the pod shows the kubelet's waiting state."""
        uid = pod.metadata.uid
        if uid in self._started:
            return True
        retry_at, attempts = self._blocked.get(uid, (0.0, 0))
        if time.monotonic() < retry_at:
            return False
        plain = self._plain(pod)
        container = podstates.runtime_container(plain)
        waiting = podstates.pull_failure(str(container.get("image", "")), self._pullable, attempts)
        if waiting is None:
            waiting = await self._config_problem(plain, container)
        if waiting is None:
            # It may start; it runs (and is Ready) once its simulator listens: FleetSupervisor reports that.
            self._started.add(uid)
            self._blocked.pop(uid, None)
            return True
        self._blocked[uid] = (time.monotonic() + START_RETRY_S, attempts + 1)
        if podstates.current_waiting(plain) != waiting.reason or attempts == 0:
            await self._patch_status(pod, podstates.waiting_status(plain, waiting, 0, None, _now()))
            logger.info("pod %s/%s cannot start: %s: %s", pod.metadata.namespace, pod.metadata.name,
                        waiting.reason, waiting.message)
        return False

    async def _config_problem(self, plain: dict[str, Any], container: Any) -> Waiting | None:
        namespace = plain["metadata"]["namespace"]
        secret_names, config_map_names = podstates.referenced_objects(container)
        secrets: dict[str, dict[str, Any]] = {}
        for name in sorted(secret_names):
            try:
                found = await self._core.read_namespaced_secret(name, namespace)
            except ApiException as err:
                if err.status != 404:
                    raise
                continue
            secrets[name] = dict(found.data or {})
        config_maps: dict[str, dict[str, Any]] = {}
        for name in sorted(config_map_names):
            try:
                config_map = await self._core.read_namespaced_config_map(name, namespace)
            except ApiException as err:
                if err.status != 404:
                    raise
                continue
            config_maps[name] = {**(config_map.data or {}), **(config_map.binary_data or {})}
        return podstates.config_failure(container, namespace, secrets, config_maps)

    async def _patch_status(self, pod: Any, status: dict[str, Any]) -> None:
        try:
            await self._core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace,
                                                         {"status": status})
        except ApiException as err:
            if err.status != 404:  # a pod deleted meanwhile has no status to report
                raise

    async def report_crash(self, pod: RuntimePod, restarts: int, last: Terminated) -> None:
        """CrashLoopBackOff with the exit as lastState.terminated, as the kubelet writes it."""
        body = self._pods.get(pod.uid)
        if body is None:
            return
        plain = self._plain(body)
        waiting = podstates.crash_waiting(plain, restarts)
        await self._patch_status(body, podstates.waiting_status(plain, waiting, restarts, last, _now(),
                                                                phase="Running"))

    async def report_running(self, pod: RuntimePod, restarts: int, last: Terminated | None) -> None:
        body = self._pods.get(pod.uid)
        if body is None:
            return
        plain = self._plain(body)
        if podstates.reports_running(plain, restarts):
            return  # already says so (the driver restarted): a kubelet writes no status that is not news
        await self._patch_status(body, podstates.running_status(plain, restarts, last, _now()))

    async def _list_pods(self) -> str:
        pods: dict[str, Any] = {}
        token: str | None = None
        while True:
            if token:
                page = await self._core.list_pod_for_all_namespaces(
                    label_selector=RUNTIME_SELECTOR, limit=LIST_PAGE, _continue=token)
            else:
                page = await self._core.list_pod_for_all_namespaces(label_selector=RUNTIME_SELECTOR, limit=LIST_PAGE)
            pods.update({pod.metadata.uid: pod for pod in page.items})
            token = page.metadata._continue
            if not token:
                self._pods = pods
                for uid in [uid for uid in self._configs if uid not in pods]:
                    del self._configs[uid]
                for uid in [uid for uid in self._handed if uid not in pods]:
                    del self._handed[uid]
                return str(page.metadata.resource_version)

    async def _watch_pods(self) -> None:
        """List, then watch from there, for as long as the driver runs.

        An API server that restarts or drops the stream is the normal case here (the fault-injection tests
        restart it on purpose): any failure retries after a pause, resuming from the last resource version,
        and a 410 (too old) lists afresh. The cache stays usable meanwhile, so callers never wait on a
        watcher that has died.
        """
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    resource_version = await self._list_pods()
                    self._synced.set()
                async with watch.Watch() as stream:
                    async for event in stream.stream(
                        self._core.list_pod_for_all_namespaces, label_selector=RUNTIME_SELECTOR,
                        resource_version=resource_version, timeout_seconds=WATCH_TIMEOUT_S,
                        allow_watch_bookmarks=True,
                    ):
                        if event["type"] == "BOOKMARK":
                            # Bookmarks carry only a resource version, as a raw dict.
                            resource_version = event["raw_object"]["metadata"]["resourceVersion"]
                            continue
                        pod = event["object"]
                        resource_version = pod.metadata.resource_version
                        if event["type"] == "DELETED":
                            self._pods.pop(pod.metadata.uid, None)
                            self._configs.pop(pod.metadata.uid, None)
                            self._started.discard(pod.metadata.uid)
                            self._blocked.pop(pod.metadata.uid, None)
                            self._handed.pop(pod.metadata.uid, None)
                            self._finished.discard(pod.metadata.uid)
                        elif event["type"] in ("ADDED", "MODIFIED"):
                            self._pods[pod.metadata.uid] = pod
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status == 410:
                    resource_version = None  # our version is too old: start over
                    continue
                logger.warning("pod watch failed (%s %s); retrying in %.0fs", err.status, err.reason, WATCH_RETRY_S)
                await asyncio.sleep(WATCH_RETRY_S)
            except Exception as err:  # a dropped connection, a restarting API server
                logger.warning("pod watch interrupted: %s; retrying in %.0fs", err, WATCH_RETRY_S)
                await asyncio.sleep(WATCH_RETRY_S)

    async def _on_kwok_node(self, node_name: str | None) -> bool:
        if not node_name:
            return False
        if node_name not in self._kwok_nodes:
            try:
                node = await self._core.read_node(node_name)
            except ApiException as err:
                if err.status != 404:
                    raise
                return False
            annotations = node.metadata.annotations or {}
            self._kwok_nodes[node_name] = annotations.get(KWOK_NODE_ANNOTATION) == KWOK_NODE_VALUE
        return self._kwok_nodes[node_name]

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
        # Logged once per pod: the driver resyncs every second.
        if uid not in self._bad_configs:
            self._bad_configs.add(uid)
            logger.error("not simulating %s", reason)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
async def kube_pod_source(kubeconfig: str | None, max_pre_stop_s: float | None = None
                          ) -> AsyncIterator[KubePodSource]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    require_loopback_server(configuration.host)
    async with client.ApiClient(configuration) as api:
        source = KubePodSource(api, max_pre_stop_s)
        try:
            yield source
        finally:
            await source.close()
