"""The Argo CD health check, run in a real Lua 5.1 interpreter (Argo CD embeds gopher-lua, a Lua 5.1).

Sample objects are built from the operator's own status models, so a renamed status field breaks
this test rather than the health check in production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa.lua51 as lua51
import pytest
import yaml

from specdec_operator.api.status import CanaryStatus, Condition, SpeculativeModelStatus
from specdec_operator.reconcile.plan import evaluate
from tests.unit.canary.canaryfactories import canary_status
from tests.unit.gpu.gpufactories import demo_fleet
from tests.unit.reconcile.reconcilefactories import SETTINGS, live_children, observed

SCRIPT = Path(__file__).parents[3] / "charts" / "specdec-operator" / "files" / "argocd-health.lua"
NOW = "2026-11-30T12:00:00Z"


def condition(kind: str, status: str, reason: str = "", message: str = "", generation: int = 0) -> Condition:
    return Condition.model_validate(
        {
            "type": kind,
            "status": status,
            "reason": reason or kind,
            "message": message,
            "lastTransitionTime": NOW,
            "observedGeneration": generation,
        }
    )


def speculative_model(
    *conditions: Condition, generation: int = 3, observed: int = 3, canary: CanaryStatus | None = None
) -> dict[str, Any]:
    status = SpeculativeModelStatus(observed_generation=observed, conditions=list(conditions), canary=canary)
    return {
        "apiVersion": "specdec.io/v1alpha1",
        "kind": "SpeculativeModel",
        "metadata": {"name": "llama", "namespace": "serving", "generation": generation},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B"}},
        "status": status.to_wire(),
    }


def _to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({key: _to_lua(runtime, item) for key, item in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, item) for item in value])
    return value


def run_health_check(obj: dict[str, Any]) -> dict[str, str]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    # Only what Argo CD's Lua VM offers a health script; any other global is nil here.
    sandbox = runtime.eval(
        "function(obj) return {obj = obj, ipairs = ipairs, string = string, tostring = tostring} end"
    )
    chunk = runtime.eval(
        "function(source, env) local f = assert(loadstring(source, 'argocd-health.lua')); "
        "setfenv(f, env); return f() end"
    )
    result = chunk(SCRIPT.read_text(), sandbox(_to_lua(runtime, obj)))
    return {key: result[key] for key in ("status", "message")}


READY = condition("Ready", "True", "AllPoolsReady", "2 pools, 8/8 replicas ready", generation=3)

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("ready", speculative_model(READY), "Healthy", "2 pools, 8/8 replicas ready"),
    (
        "ready-reason-when-no-message",
        speculative_model(condition("Ready", "True", "AllPoolsReady")),
        "Healthy",
        "AllPoolsReady",
    ),
    (
        "no-status-yet",
        {"metadata": {"generation": 1}, "spec": {}},
        "Progressing",
        "Waiting for the operator to observe this SpeculativeModel",
    ),
    (
        "stale-observed-generation",
        speculative_model(READY, generation=4, observed=3),
        "Progressing",
        "Waiting for the operator to observe generation 4 (observed 3)",
    ),
    (
        "stale-ready-condition",
        speculative_model(condition("Ready", "True", generation=2)),
        "Progressing",
        "Ready reflects generation 2, not 3 yet",
    ),
    (
        "degraded",
        speculative_model(
            condition("Ready", "False", "NoCompatibleNodes", "no gfx942 nodes"),
            condition("Degraded", "True", "NoCompatibleNodes", "no schedulable node has gfx942 or gfx950"),
        ),
        "Degraded",
        "no schedulable node has gfx942 or gfx950",
    ),
    (
        "degraded-after-rollback",
        speculative_model(
            READY,
            condition(
                "Degraded", "True", "CanaryRolledBack", "accepted length 1.42 vs stable 2.71 (ratio 0.52 < 0.90)"
            ),
            canary=canary_status(phase="RolledBack", weight=0),
        ),
        "Degraded",
        "accepted length 1.42 vs stable 2.71 (ratio 0.52 < 0.90)",
    ),
    (
        "canary-paused",
        speculative_model(READY, canary=canary_status(phase="Paused", step=1, weight=50)),
        "Suspended",
        "Paused: canary rev-new at step 2 with 50% of traffic",
    ),
    (
        "canary-progressing",
        speculative_model(READY, canary=canary_status(step=0, weight=10)),
        "Progressing",
        "Rolling out: canary rev-new at step 1 with 10% of traffic",
    ),
    (
        "degraded-wins-over-paused",
        speculative_model(
            condition("Degraded", "True", "PoolUnavailable", "pool gfx90a has 0/2 ready"),
            canary=canary_status(phase="Paused"),
        ),
        "Degraded",
        "pool gfx90a has 0/2 ready",
    ),
    (
        "progressing-condition",
        speculative_model(
            condition("Ready", "False", "PodsStarting", "0/2 ready"),
            condition("Progressing", "True", "RollingUpdate", "pool gfx942: 1/2 updated"),
        ),
        "Progressing",
        "pool gfx942: 1/2 updated",
    ),
    (
        "not-ready",
        speculative_model(condition("Ready", "False", "PodsStarting", "0/2 ready")),
        "Progressing",
        "0/2 ready",
    ),
    (
        "finished-canary-record-is-not-health",
        speculative_model(READY, canary=canary_status(phase="Promoted", step=2, weight=100)),
        "Healthy",
        "2 pools, 8/8 replicas ready",
    ),
    ("no-conditions-yet", speculative_model(), "Progressing", "Waiting for the Ready condition"),
]


@pytest.mark.parametrize(("obj", "status", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_health(obj: dict[str, Any], status: str, message: str) -> None:
    assert run_health_check(obj) == {"status": status, "message": message}


def test_every_argo_cd_status_is_covered() -> None:
    assert {case[2] for case in CASES} == {"Healthy", "Progressing", "Degraded", "Suspended"}


REDUCED = condition("Reduced", "True", "DrafterFallback", "llama-gfx1100: ngram, the draft model does not fit")


def test_reduced_is_healthy_with_its_message() -> None:
    result = run_health_check(speculative_model(READY, REDUCED))
    assert result == {
        "status": "Healthy",
        "message": "2 pools, 8/8 replicas ready; reduced (DrafterFallback): llama-gfx1100: ngram, the draft model "
        "does not fit",
    }


def test_the_70b_example_on_a_fleet_without_mi250x_is_healthy_with_the_skipped_target() -> None:
    """The status the operator really produces for examples/draft-70b-mi300x-mi250x.yaml, once its pods are ready,
    on a fleet whose gfx90a (MI250X) nodes are absent: Healthy, and the message names gfx90a."""
    example = yaml.safe_load((SCRIPT.parents[3] / "examples" / "draft-70b-mi300x-mi250x.yaml").read_text())
    fleet = [node for node in demo_fleet() if "gfx90a" not in node.gfx_targets]
    first = evaluate(observed(example["spec"], nodes=fleet), SETTINGS, "2026-11-29T10:00:00Z")
    assert first.status is not None
    settled = evaluate(observed(example["spec"], nodes=fleet, status=first.status.to_wire(),
                                children=live_children(first)), SETTINGS, "2026-11-29T10:01:00Z")
    assert settled.status is not None
    obj = {"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel",
           "metadata": {"name": "llama70b-draft", "namespace": "serving", "generation": 1},
           "spec": example["spec"], "status": settled.status.to_wire()}
    result = run_health_check(obj)
    assert result["status"] == "Healthy"
    assert "reduced (NoCompatibleNodes)" in result["message"] and "gfx90a" in result["message"]
