"""A runtime pod that starts or stops failing wakes its model at once; other pod changes wake nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from specdec_operator.handlers.services.watches import runtime_pod_failing
from specdec_runtime import contract


class Context:
    def __init__(self) -> None:
        self.failing_pods: dict[str, str] = {}
        self.nudged: list[tuple[str, str]] = []

    def nudge_by_label(self, namespace: str, model_label: str) -> None:
        self.nudged.append((namespace, model_label))


def pod(waiting: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"waiting": {"reason": waiting, "message": "m"}} if waiting else {"running": {}}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "labels": {contract.LABEL_MODEL: "llama", contract.LABEL_POOL: "llama-gfx942"}},
            "status": {"containerStatuses": [{"name": "vllm", "restartCount": 0, "state": state}]}}


async def test_only_changes_of_the_failure_wake_the_model() -> None:
    context = Context()
    memo = SimpleNamespace(context=context)
    await runtime_pod_failing(type="MODIFIED", body=pod(), memo=memo)
    assert context.nudged == []
    await runtime_pod_failing(type="MODIFIED", body=pod("ErrImagePull"), memo=memo)
    await runtime_pod_failing(type="MODIFIED", body=pod("ErrImagePull"), memo=memo)  # unchanged: quiet
    await runtime_pod_failing(type="MODIFIED", body=pod("ImagePullBackOff"), memo=memo)
    await runtime_pod_failing(type="MODIFIED", body=pod(), memo=memo)  # recovered
    assert context.nudged == [("ns", "llama")] * 3
    assert context.failing_pods == {}
