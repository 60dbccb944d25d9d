"""Issue 22 item 2: the fleet driver reports pod states as a kubelet would, from the same causes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specdec_runtime import podstates
from specdec_runtime.fleet_driver import FleetSupervisor
from specdec_runtime.fleet_kube import RuntimePod
from specdec_runtime.podstates import Terminated
from specdec_runtime.simulator.hosted import HostExit, parse_options
from tests.unit.runtime.test_fleet_driver import fast_profiles, make_pod  # noqa: F401 - the fixture

HF = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}


def container(*env: dict[str, Any], env_from: list[dict[str, Any]] | None = None,
              image: str = "ghcr.io/specdec/specdec-runtime:0.1.0-simulator") -> dict[str, Any]:
    return {"name": "vllm", "image": image, "env": list(env), "envFrom": env_from or []}


@pytest.mark.parametrize(("spec", "secrets", "config_maps", "message"), [
    (container(HF), {}, {}, 'secret "hf-token" not found'),
    (container(HF), {"hf-token": {"other": "x"}}, {}, "couldn't find key token in Secret serving/hf-token"),
    (container({"name": "T", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "p"}}}), {}, {},
     'configmap "tuning" not found'),
    (container(env_from=[{"secretRef": {"name": "bundle"}}]), {}, {}, 'secret "bundle" not found'),
], ids=["secret-missing", "key-missing", "configmap-missing", "envfrom-secret-missing"])
def test_missing_references_are_create_container_config_errors(spec: dict[str, Any], secrets: dict[str, Any],
                                                               config_maps: dict[str, Any], message: str) -> None:
    assert podstates.config_failure(spec, "serving", secrets, config_maps) == podstates.Waiting(
        "CreateContainerConfigError", message)


def test_present_or_optional_references_start() -> None:
    optional = {"name": "T", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "p", "optional": True}}}
    assert podstates.config_failure(container(HF, optional), "serving", {"hf-token": {"token": "x"}}, {}) is None
    assert podstates.referenced_objects(container(HF, optional)) == ({"hf-token"}, {"tuning"})


@pytest.mark.parametrize("image", ["ghcr.io/specdec/specdec-runtime:0.1.0-simulator",
                                   "ghcr.io/specdec/specdec-runtime:0.1.0-vllm0.33.0-cdna",
                                   "ghcr.io/specdec/specdec-runtime:0.1.0-vllm0.33.0-rdna4"])
def test_the_projects_images_pull(image: str) -> None:
    assert podstates.pull_failure(image) is None


def test_other_images_fail_to_pull_then_back_off_unless_listed() -> None:
    typo = "ghcr.io/specdec/specdec-runtime:0.1.0-simulatr"
    first = podstates.pull_failure(typo)
    assert first is not None and first.reason == "ErrImagePull" and typo in first.message
    assert podstates.pull_failure(typo, attempts=1) == podstates.Waiting("ImagePullBackOff",
                                                                         f'Back-off pulling image "{typo}"')
    assert podstates.pull_failure(typo, extra={typo}) is None
    assert podstates.pullable_images({podstates.PULLABLE_ENV: f" {typo} ,x:1"}) == {typo, "x:1"}
    invalid = podstates.pull_failure("ghcr.io/Team/vllm:1")
    assert invalid is not None and invalid.reason == "InvalidImageName"


def test_waiting_and_crash_statuses_read_like_the_kubelets() -> None:
    pod = {"metadata": {"name": "p", "namespace": "serving", "uid": "u1"}, "spec": {"containers": [container()]}}
    crash = podstates.waiting_status(pod, podstates.crash_waiting(pod, 2), 2, Terminated("OOMKilled", 137), "t",
                                     phase="Running")
    [status] = crash["containerStatuses"]
    assert status["state"]["waiting"] == {
        "reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container=vllm pod=p_serving(u1)"}
    assert status["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert (status["restartCount"], status["ready"], crash["phase"]) == (2, False, "Running")
    assert {c["type"]: c["status"] for c in crash["conditions"]} == {"Ready": "False", "ContainersReady": "False"}
    assert podstates.simulates_oom(container({"name": podstates.SIMULATE_OOM_ENV, "value": "true"}))
    assert [podstates.backoff_s(n) for n in (1, 2, 3, 10)] == [10, 20, 40, 300]


def test_a_refused_start_exits_with_its_last_stderr_line() -> None:
    with pytest.raises(HostExit) as caught:
        parse_options(["serve", "org/target", "--speculative-config", '{"method": "nonsense"}'])
    assert caught.value.exit_code == 2
    assert "error:" in caught.value.last_line and "\n" not in caught.value.last_line


class Recorder:
    def __init__(self) -> None:
        self.crashes: list[tuple[str, int, Terminated]] = []
        self.running: list[tuple[str, int]] = []
        self.deleted: list[str] = []

    async def report_crash(self, pod: RuntimePod, restarts: int, last: Terminated) -> None:
        self.crashes.append((pod.name, restarts, last))

    async def report_running(self, pod: RuntimePod, restarts: int, last: Terminated | None) -> None:
        self.running.append((pod.name, restarts))

    async def finish_deletion(self, pod: RuntimePod) -> None:
        self.deleted.append(pod.name)


async def test_a_pod_is_reported_ready_once_its_model_has_loaded(fast_profiles: Path) -> None:  # noqa: F811
    recorder = Recorder()
    supervisor = FleetSupervisor(fast_profiles, reporter=recorder)
    pod = RuntimePod(**{**make_pod("slow", "u-slow").__dict__, "profile": "default"})  # loads for 120 s
    await supervisor.reconcile([pod])
    [hosted] = supervisor.simulators.values()
    assert recorder.running == []  # it listens, but answers 503 while loading: not Ready
    await supervisor.reconcile([pod])
    assert recorder.running == []
    loaded_at = hosted.simulator.replica.ready_at
    hosted.simulator.clock = lambda: loaded_at  # the wall clock reaches the end of loading
    await supervisor.reconcile([pod])
    assert recorder.running == [("slow", 0)]
    await supervisor.reconcile([pod])
    assert recorder.running == [("slow", 0)]  # reported once
    await supervisor.stop_all()


async def test_a_simulated_oom_crash_loops_with_back_off(fast_profiles: Path) -> None:  # noqa: F811
    recorder = Recorder()
    supervisor = FleetSupervisor(fast_profiles, reporter=recorder)
    pod = make_pod("oom", "u-oom")
    oom = RuntimePod(**{**pod.__dict__, "simulate_oom": True})
    await supervisor.reconcile([oom])
    await supervisor.reconcile([oom])  # within the back-off: no second start
    assert recorder.crashes == [("oom", 1, Terminated("OOMKilled", 137))]
    assert supervisor.simulators == {} and recorder.running == []  # never ready
    await supervisor.stop_all()


async def test_a_refused_config_crash_loops_with_the_message(fast_profiles: Path) -> None:  # noqa: F811
    recorder = Recorder()
    supervisor = FleetSupervisor(fast_profiles, reporter=recorder)
    pod = make_pod("bad", "u-bad")
    assert pod.config.speculative is not None
    # model_copy does not validate: a method vLLM refuses reaches the simulator's command line as it would vLLM's.
    refused = pod.config.speculative.model_copy(update={"model": None})  # eagle without its drafter
    bad = RuntimePod(**{**pod.__dict__, "config": pod.config.model_copy(update={"speculative": refused})})
    await supervisor.reconcile([bad])
    assert len(recorder.crashes) == 1
    name, restarts, last = recorder.crashes[0]
    assert (name, restarts, last.reason, last.exit_code) == ("bad", 1, "Error", 1)
    assert "num_speculative_tokens was provided but without speculative model." in last.message
    await supervisor.stop_all()
