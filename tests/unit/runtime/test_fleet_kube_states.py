"""KubePodSource as the kubelet stand-in, against a fake CoreV1Api: the status patches it sends, and when."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from specdec_runtime import contract
from specdec_runtime.fleet_kube import KubePodSource
from specdec_runtime.podstates import Terminated
from tests.unit.api.specfactories import spec
from tests.unit.render.renderfactories import rendered_pool

CONFIG = '{"model": "org/target", "served_model_name": "target", "port": 8000}'


class FakeCore:
    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, str]] = {}
        self.patches: list[dict[str, Any]] = []
        self.deletes: list[tuple[str, int, str]] = []

    async def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        if name not in self.secrets:
            raise ApiException(status=404)
        return client.V1Secret(data=self.secrets[name])

    async def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        if name != "cfg":
            raise ApiException(status=404)
        return client.V1ConfigMap(data={contract.CONFIG_KEY: CONFIG})

    async def read_node(self, name: str) -> Any:
        return client.V1Node(metadata=client.V1ObjectMeta(name=name, annotations={"kwok.x-k8s.io/node": "fake"}))

    async def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.patches.append(body["status"])

    async def delete_namespaced_pod(self, name: str, namespace: str, body: Any) -> None:
        self.deletes.append((name, body.grace_period_seconds, body.preconditions.uid))


def pod(image: str = "ghcr.io/specdec/specdec-runtime:0.1.0-simulator", env: list[Any] | None = None) -> Any:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="p", namespace="ns", uid="u1", labels={}),
        spec=client.V1PodSpec(node_name="n1", containers=[client.V1Container(name="vllm", image=image, env=env)],
                              volumes=[client.V1Volume(name=contract.CONFIG_VOLUME,
                                                       config_map=client.V1ConfigMapVolumeSource(name="cfg"))]),
        status=client.V1PodStatus(phase="Running", pod_ip="127.0.0.9"),
    )


@pytest.fixture
async def source() -> Any:
    async with client.ApiClient(client.Configuration()) as api:
        made = KubePodSource(api)
        made._core = FakeCore()  # the one seam: everything else is the real source
        made._synced.set()
        made._watcher = _Forever()
        yield made


class _Forever:
    def done(self) -> bool:
        return False

    def cancel(self) -> None:
        return None


HF = client.V1EnvVar(name="HF_TOKEN", value_from=client.V1EnvVarSource(
    secret_key_ref=client.V1SecretKeySelector(name="hf-token", key="token")))


async def test_a_missing_secret_holds_the_pod_until_it_exists(source: Any) -> None:
    source._pods = {"u1": pod(env=[HF])}
    assert await source.runtime_pods() == []
    [patch] = source._core.patches
    waiting = patch["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}
    assert patch["phase"] == "Pending"
    # The Secret appears; past the retry time the pod starts and is marked running and ready again.
    source._core.secrets["hf-token"] = {"token": "dA=="}
    source._blocked["u1"] = (0.0, 1)
    source._pods["u1"].status.phase = "Pending"
    source._pods["u1"].status.container_statuses = [client.V1ContainerStatus(
        name="vllm", image="x", image_id="", ready=False, restart_count=0,
        state=client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason="CreateContainerConfigError")))]
    pods = await source.runtime_pods()
    assert [p.name for p in pods] == ["p"]
    # It may start now, but nothing listens yet: no status says it runs or is ready until the simulator does.
    assert len(source._core.patches) == 1
    await source.report_running(pods[0], 0, None)
    assert source._core.patches[-1]["phase"] == "Running"
    assert source._core.patches[-1]["containerStatuses"][0]["ready"] is True
    assert {c["type"]: c["status"] for c in source._core.patches[-1]["conditions"]} == {
        "Ready": "True", "ContainersReady": "True"}


async def test_an_image_outside_the_local_registry_is_err_image_pull(source: Any) -> None:
    source._pods = {"u1": pod(image="ghcr.io/specdec/specdec-runtime:0.1.0-typo")}
    assert await source.runtime_pods() == []
    assert source._core.patches[0]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
    assert await source.runtime_pods() == []  # within the retry interval: nothing more is sent
    assert len(source._core.patches) == 1


async def test_a_pod_is_reported_ready_once_and_not_again_after_a_driver_restart(source: Any) -> None:
    source._pods = {"u1": pod()}
    source._pods["u1"].status.phase = "Pending"  # as KWOK's runtime-pod-start stage leaves it: an IP, not ready
    [served] = await source.runtime_pods()
    assert source._core.patches == []
    await source.report_running(served, 0, None)
    [patch] = source._core.patches
    assert patch["phase"] == "Running" and patch["containerStatuses"][0]["restartCount"] == 0
    # The API server now says so; a restarted driver starting the simulator again writes nothing.
    source._pods["u1"].status = client.V1PodStatus(
        phase="Running", pod_ip="127.0.0.9",
        conditions=[client.V1PodCondition(type="Ready", status="True")],
        container_statuses=[client.V1ContainerStatus(
            name="vllm", image="x", image_id="", ready=True, restart_count=0,
            state=client.V1ContainerState(running=client.V1ContainerStateRunning()))])
    await source.report_running(served, 0, None)
    assert len(source._core.patches) == 1
    await source.report_running(served, 1, Terminated("Error", 1))  # a restart is news
    assert len(source._core.patches) == 2 and source._core.patches[-1]["containerStatuses"][0]["restartCount"] == 1


async def test_a_healthy_pod_is_served_without_a_status_write(source: Any) -> None:
    source._pods = {"u1": pod(env=[client.V1EnvVar(name="SPECDEC_SIMULATE_OOM", value="true")])}
    [served] = await source.runtime_pods()
    assert served.simulate_oom and source._core.patches == []
    await source.report_crash(served, 1, Terminated("OOMKilled", 137))
    [patch] = source._core.patches
    status = patch["containerStatuses"][0]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["reason"] == "OOMKilled" and status["restartCount"] == 1
    assert patch["phase"] == "Running"


class _Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body)


async def test_a_pod_the_operator_renders_is_served_with_every_field_it_sets(source: Any) -> None:
    """The stand-in reads pods through the client's models: the rendered pod's fields, the shared process namespace
    and the termination message policy among them, survive the round trip, and the pod is served as it is."""
    template = rendered_pool(spec()).template
    pod_spec = {**template["spec"], "nodeName": "n1"}
    pod_spec["volumes"] = [{**v, "configMap": {"name": "cfg"}} if v["name"] == contract.CONFIG_VOLUME else v
                           for v in pod_spec["volumes"]]
    body = {"apiVersion": "v1", "kind": "Pod", "spec": pod_spec, "status": {"phase": "Running", "podIP": "127.0.0.9"},
            "metadata": {**template["metadata"], "name": "p", "namespace": "ns", "uid": "u1"}}
    source._pods = {"u1": source._api.deserialize(_Response(body), "V1Pod")}
    [served] = await source.runtime_pods()
    assert served.command == (*pod_spec["containers"][0]["command"], *pod_spec["containers"][0]["args"])
    assert source._core.patches == []
    plain = source._plain(source._pods["u1"])
    assert plain["spec"]["shareProcessNamespace"] is True
    assert plain["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def deleted(body: Any, seconds_left: float, pre_stop_s: int | None) -> Any:
    """`body` being deleted, its grace period ending in `seconds_left`, its container's preStop sleep `pre_stop_s`."""
    body.metadata.deletion_timestamp = datetime.now(UTC) + timedelta(seconds=seconds_left)
    if pre_stop_s is not None:
        body.spec.containers[0].lifecycle = client.V1Lifecycle(
            pre_stop=client.V1LifecycleHandler(sleep=client.V1SleepAction(seconds=pre_stop_s)))
    return body


@pytest.mark.parametrize(("pre_stop_s", "cap", "waits"), [(10, None, 10.0), (10, 1.0, 1.0), (None, 1.0, 0.0)])
async def test_a_deleted_pod_it_served_is_handed_back_terminating_with_its_pre_stop_wait_and_deadline(
    source: Any, pre_stop_s: int | None, cap: float | None, waits: float,
) -> None:
    """The supervisor terminates it (termination.py): the container's preStop sleep (capped by the driver's
    --max-pre-stop-seconds), and the deletionTimestamp as the monotonic time of the SIGKILL."""
    source._max_pre_stop_s = cap
    source._pods = {"u1": pod()}
    [served] = await source.runtime_pods()
    assert served.terminating is None
    source._pods = {"u1": deleted(pod(), 70, pre_stop_s)}
    [leaving] = await source.runtime_pods()
    assert leaving.terminating is not None and leaving.uid == "u1" and leaving.config == served.config
    assert leaving.terminating.pre_stop_s == waits
    assert 69 < leaving.terminating.deadline - time.monotonic() <= 70
    assert source._core.deletes == [], "the supervisor deletes it once its container stopped"
    await source.finish_deletion(leaving)
    assert source._core.deletes == [("p", 0, "u1")], "at once, and only this pod (not a new one under its name)"


async def test_a_deleted_pod_nothing_ran_for_is_deleted_at_once_and_once(source: Any) -> None:
    source._pods = {"u1": deleted(pod(env=[HF]), 70, 10)}  # held by its missing Secret: never handed out
    assert await source.runtime_pods() == []
    assert await source.runtime_pods() == []
    assert source._core.deletes == [("p", 0, "u1")]
