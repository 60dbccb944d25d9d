"""Issue 22 item 2 on the local control plane: every pod failure is named, with the kubelet's message.

The local fleet has no kubelet: the fleet driver reports pod states as one would, from the same causes
(runtime/specdec_runtime/podstates.py). A missing hub token Secret, an image the fleet cannot pull, and a
simulator that is OOM-killed at start-up each show as the model's Ready/Degraded reason with the message,
as a Warning event, and as a specdec_model_condition series.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import condition, pinned_model, test_nodes  # noqa: F401 - fixture
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess

pytestmark = pytest.mark.e2e


def named_failure(kube: Kube, operator: OperatorProcess, model: str, reasons: tuple[str, ...],
                  words: str) -> dict[str, Any]:
    """Wait for Ready=False with one of `reasons` and `words` in its message; then check Degraded, the Warning
    event and the metric say the same."""
    def probe() -> dict[str, Any] | None:
        ready = condition(kube.get("sm", model), "Ready")
        return ready if ready and ready["status"] == "False" and ready["reason"] in reasons \
            and words in ready["message"] else None

    ready = wait_for(f"Ready=False {reasons} with {words!r}", probe, 120, 1,
                     describe=lambda: (kube.get("sm", model) or {}).get("status", {}).get("conditions"))
    degraded = condition(kube.get("sm", model), "Degraded")
    assert degraded is not None and degraded["status"] == "True" and degraded["reason"] in reasons, degraded
    assert words in degraded["message"]
    warnings = wait_for("a Warning event with the message", lambda: [
        e for e in kube.events(model) if e["type"] == "Warning" and e["reason"] in reasons and words in e["message"]],
        30, 1)
    assert warnings
    series = f'specdec_model_condition{{model={model},namespace={kube.namespace},reason={ready["reason"]},' \
             f'status=False,type=Ready}}'
    wait_for(f"{series} on /metrics", lambda: (operator.metrics() or {}).get(series) == 1.0, 30, 1)
    return ready


def test_a_missing_hub_token_secret_is_create_container_config_error(
    kube: Kube, namespace: str, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    test_nodes("hf", 1)
    spec = pinned_model("no-token", namespace)
    spec["spec"]["model"]["source"] = {"hubSecretRef": {"name": "hf-token", "key": "token"}}
    kube.apply(spec)
    named_failure(kube, operator, "no-token", ("CreateContainerConfigError",), 'secret "hf-token" not found')
    # The Secret appears: the pod starts (the driver retries as a kubelet does) and the model becomes Ready.
    kube.run("create", "secret", "generic", "hf-token", "--from-literal=token=t")
    wait_for("Ready once the Secret exists", lambda: (c := condition(kube.get("sm", "no-token"), "Ready"))
             and c["status"] == "True", 120, 1)


def test_an_image_that_cannot_be_pulled_is_image_pull_backoff(
    kube: Kube, namespace: str, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    test_nodes("pull", 1)
    typo = "ghcr.io/specdec/specdec-runtime:0.1.0-vllm0.33.0-cdnaa"
    kube.apply(pinned_model("bad-image", namespace, image=typo))
    named_failure(kube, operator, "bad-image", ("ErrImagePull", "ImagePullBackOff"), typo)


def test_a_simulator_killed_for_memory_is_oom_killed(
    kube: Kube, namespace: str, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    test_nodes("oom", 1)
    kube.apply(pinned_model("oom", namespace, env=[{"name": "SPECDEC_SIMULATE_OOM", "value": "true"}]))
    ready = named_failure(kube, operator, "oom", ("OOMKilled",), "last exit OOMKilled (exit code 137)")
    assert "restarts" in ready["message"]
