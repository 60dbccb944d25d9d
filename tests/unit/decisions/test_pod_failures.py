"""Issue 22 item 2: each way a runtime pod fails is named, with the kubelet's (or scheduler's) message."""

from __future__ import annotations

from typing import Any

import pytest

from specdec_operator.decisions.pod_failures import failure_summaries, pod_failure, pod_failures
from specdec_operator.handlers.services.watches import runtime_pod_view
from specdec_runtime import contract

POOL = "llama-gfx942"


def pod(name: str = "llama-gfx942-abc", container: dict[str, Any] | None = None,
        conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A pod as the API server returns it, then as the watch cache keeps it."""
    body = {
        "metadata": {"name": name, "namespace": "serving", "uid": f"uid-{name}",
                     "labels": {contract.LABEL_POOL: POOL, contract.LABEL_MODEL: "llama"}},
        "spec": {"containers": [{"name": "vllm", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.9", "conditions": conditions or [],
                   "containerStatuses": [{"name": "vllm", "ready": False, "restartCount": 0, "image": "x",
                                          "imageID": "", "state": {"running": {"startedAt": "t"}},
                                          **(container or {})}]},
    }
    return runtime_pod_view(body)


MISSING_KEY = 'couldn\'t find key token in Secret serving/hf-token'
CASES = [
    ("missing-secret", {"state": {"waiting": {"reason": "CreateContainerConfigError",
                                              "message": 'secret "hf-token" not found'}}},
     "CreateContainerConfigError", 'secret "hf-token" not found'),
    ("missing-key", {"state": {"waiting": {"reason": "CreateContainerConfigError", "message": MISSING_KEY}}},
     "CreateContainerConfigError", MISSING_KEY),
    ("err-image-pull", {"state": {"waiting": {"reason": "ErrImagePull", "message": "manifest unknown"}}},
     "ErrImagePull", "manifest unknown"),
    ("image-pull-backoff", {"state": {"waiting": {"reason": "ImagePullBackOff",
                                                  "message": 'Back-off pulling image "x:typo"'}}},
     "ImagePullBackOff", 'Back-off pulling image "x:typo"'),
    ("oom", {"restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
             "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}},
     "OOMKilled", "last exit OOMKilled (exit code 137) (3 restarts)"),
    ("crash-with-message", {"restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                            "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                                         "message": "ValueError: method not supported"}}},
     "CrashLoopBackOff", "last exit Error (exit code 1): ValueError: method not supported (1 restarts)"),
    ("startup-probe", {"restartCount": 2, "started": False,
                       "lastState": {"terminated": {"reason": "Error", "exitCode": 137}}},
     "StartupProbeFailed", "startup probe has not passed after 2 restarts; last exit Error (exit code 137)"),
]


@pytest.mark.parametrize(("container", "reason", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_failure_is_named_with_the_kubelets_message(container: dict[str, Any], reason: str,
                                                         message: str) -> None:
    failure = pod_failure(pod(container=container), contract.LABEL_POOL)
    assert failure is not None
    assert (failure.pool, failure.reason) == (POOL, reason)
    assert failure.message == f"container vllm: {message}"


def test_unschedulable_reads_the_scheduler_message() -> None:
    unschedulable = pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/5 nodes are available: 5 Insufficient amd.com/gpu."}],
                        container={"state": {"waiting": {"reason": "ContainerCreating"}}})
    failure = pod_failure(unschedulable, contract.LABEL_POOL)
    assert failure is not None and failure.reason == "Unschedulable"
    assert failure.message == "0/5 nodes are available: 5 Insufficient amd.com/gpu."


@pytest.mark.parametrize("container", [
    {"ready": True, "started": True},
    {"state": {"waiting": {"reason": "ContainerCreating"}}},
    {"started": False},  # starting for the first time: not a failure yet
], ids=["serving", "creating", "first-start"])
def test_healthy_or_starting_pods_are_not_failures(container: dict[str, Any]) -> None:
    assert pod_failure(pod(container=container), contract.LABEL_POOL) is None


def test_a_healthy_pod_view_carries_no_failure_fields() -> None:
    view = pod(container={"ready": True, "started": True})
    assert view["status"]["containerStatuses"] == [{"name": "vllm", "restartCount": 0}]


def test_one_summary_per_pool_and_cause_with_a_count() -> None:
    pull = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off"}}}
    found = pod_failures([pod("a", pull), pod("b", pull), pod("c")], contract.LABEL_POOL)
    assert failure_summaries(found) == [("ImagePullBackOff",
                                         f"{POOL}: pod a: container vllm: Back-off (and 1 more pod(s))")]
