"""Issue 22 item 3: one condition policy with a written priority; Degraded means not serving what it should."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import specdec_operator
from specdec_operator.conditions import ConditionFacts, ConditionUpdate, Finding, summarize
from specdec_operator.handlers.services.watches import runtime_pod_view
from specdec_operator.reconcile.observed import ObservedModel
from specdec_operator.reconcile.plan import evaluate
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.reconcile.reconcilefactories import (
    SETTINGS,
    T0,
    T1,
    T2,
    condition,
    live_children,
    observed,
    status_wire,
)


def by_type(updates: list[ConditionUpdate]) -> dict[str, tuple[bool | None, str]]:
    return {u.type: (u.status, u.reason) for u in updates}


FALLBACK = Finding("DrafterFallback", "llama-gfx1100: ngram")
PULL = Finding("ImagePullBackOff", "llama-gfx942: pod a: Back-off pulling image")


@pytest.mark.parametrize(("facts", "expected"), [
    (ConditionFacts(ready="all ready"),
     {"Ready": (True, "PoolsReady"), "Progressing": (False, "RolloutComplete"), "Degraded": (False, "AsExpected"),
      "Reduced": (False, "AsExpected")}),
    (ConditionFacts(ready="all ready", reduced=(FALLBACK,)),
     {"Ready": (True, "PoolsReady"), "Progressing": (False, "RolloutComplete"), "Degraded": (False, "AsExpected"),
      "Reduced": (True, "DrafterFallback")}),
    (ConditionFacts(pending="llama-gfx942 -> r2", pod_failures=(PULL,)),
     {"Ready": (False, "ImagePullBackOff"), "Progressing": (True, "NewRevision"),
      "Degraded": (True, "ImagePullBackOff"), "Reduced": (False, "AsExpected")}),
    (ConditionFacts(ready="all ready", refusals=("Deployment x: forbidden",), pod_failures=(PULL,),
                    nodes_missing=("n1 missing",), capacity=(Finding("InsufficientGpus", "held"),)),
     {"Ready": (True, "PoolsReady"), "Progressing": (False, "RolloutComplete"), "Degraded": (True, "WriteRefused"),
      "Reduced": (False, "AsExpected")}),
    (ConditionFacts(invalid_spec="spec.model.name: empty"),
     {"Ready": (False, "InvalidSpec"), "Degraded": (True, "InvalidSpec")}),
    (ConditionFacts(status_unreadable="status.pools: bad"), {"Degraded": (True, "StatusUnreadable")}),
    (ConditionFacts(held_waiting="llama-gfx942 (0 of 2 ready, held through missing nodes)",
                    nodes_missing=("llama-gfx942: nodes n1 missing",)),
     {"Ready": (False, "NodesMissing"), "Progressing": (False, "RolloutComplete"),
      "Degraded": (True, "NodesMissing"),
      "Reduced": (False, "AsExpected")}),
], ids=["ready", "reduced-is-not-degraded", "pod-failure-names-ready", "priority", "invalid", "unreadable",
        "held-pool-not-ready"])
def test_summary(facts: ConditionFacts, expected: dict[str, tuple[bool | None, str]]) -> None:
    assert by_type(summarize(facts)) == expected


def test_lower_priority_findings_ride_along_in_the_message() -> None:
    facts = ConditionFacts(ready="ok", nodes_missing=("llama-gfx942: nodes n1 missing",), pod_failures=(PULL,))
    degraded = next(u for u in summarize(facts) if u.type == "Degraded")
    assert degraded.reason == "ImagePullBackOff"
    assert degraded.message == f"{PULL.message}; also NodesMissing: llama-gfx942: nodes n1 missing"


def test_there_is_one_writer_of_conditions() -> None:
    """Every ConditionUpdate outside conditions.py is gone: the policy is the only place that decides."""
    root = Path(specdec_operator.__file__).parent
    writers = [str(path.relative_to(root)) for path in root.rglob("*.py")
               if "ConditionUpdate(" in path.read_text() and path.name != "conditions.py"]
    assert writers == []


EAGLE3 = drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
SPEC = spec_wire(drafters=[EAGLE3])


def failing_pod(pool: str, waiting: dict[str, str]) -> dict[str, Any]:
    return runtime_pod_view({
        "metadata": {"name": f"{pool}-7d9f-x1", "namespace": "inference",
                     "labels": {contract.LABEL_POOL: pool, contract.LABEL_MODEL: "llama8b"}},
        "status": {"phase": "Pending", "podIP": "127.0.0.9",
                   "containerStatuses": [{"name": "vllm", "restartCount": 0, "state": {"waiting": waiting}}]},
    })


def test_a_missing_secret_is_named_in_ready_and_degraded_and_warned_once() -> None:
    first = evaluate(observed(SPEC), SETTINGS, T0)
    pool = first.pools[0].name
    pods = [failing_pod(pool, {"reason": "CreateContainerConfigError",
                               "message": "couldn't find key token in Secret inference/hf-token"})]
    children = live_children(first, ready=False)
    second = evaluate(observed_with_pods(SPEC, status_wire(first), children, pods), SETTINGS, T1)
    state, reason, message = condition(second, "Ready")
    assert (state, reason) == ("False", "CreateContainerConfigError")
    assert "couldn't find key token in Secret inference/hf-token" in message and pool in message
    assert condition(second, "Degraded")[:2] == ("True", "CreateContainerConfigError")
    warnings = [e for e in second.events if e.type == "Warning"]
    assert [(e.reason, pool in e.message) for e in warnings] == [("CreateContainerConfigError", True)]
    third = evaluate(observed_with_pods(SPEC, status_wire(second), children, pods), SETTINGS, T2)
    assert [e for e in third.events if e.type == "Warning"] == []


def observed_with_pods(spec: dict[str, Any], status: dict[str, Any], children: list[dict[str, Any]],
                       pods: list[dict[str, Any]]) -> ObservedModel:
    return dataclasses.replace(observed(spec, status=status, children=children), pods=pods)
