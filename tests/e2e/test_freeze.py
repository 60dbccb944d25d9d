"""A change freeze on the local cluster (issue 32, item 3): with spec.rollout.freeze on, a spec change and the
tuner's K change both wait, with Progressing=False (RolloutsFrozen) naming them; off again, both roll out."""

from __future__ import annotations

from typing import Any

import pytest

from specdec_runtime import contract
from tests.e2e.faults import INITIAL_K, decided_k, running_k, settle, tuned_model
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import condition
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess

pytestmark = pytest.mark.e2e


def revision(kube: Kube, deployment: str) -> str:
    return str(kube.get("deployment", deployment)["spec"]["template"]["metadata"]["labels"][contract.LABEL_REVISION])


def test_a_frozen_model_holds_a_spec_change_and_a_k_change_with_a_condition_and_rolls_both_out_once_thawed(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    name = "frozen"
    body: dict[str, Any] = tuned_model(name)  # its profile's best K is 2: the tuner wants to leave K=5
    body["spec"]["rollout"] = {"freeze": True}
    kube.apply(body)
    pool = settle(kube, name)  # a new pool is placed under a freeze: nothing runs yet that a freeze could keep
    before = revision(kube, pool)
    body["spec"]["model"]["maxModelLen"] = 4096  # a change of the pod template
    kube.apply(body)

    def both_waiting() -> dict[str, Any] | None:
        found = condition(kube.get("sm", name), "Progressing")
        if not found or (found["status"], found["reason"]) != ("False", "RolloutsFrozen"):
            return None
        message = found["message"]
        return found if f"pool {pool} keeps revision {before}" in message and "K change of pool" in message \
            else None

    frozen = wait_for("Progressing=False RolloutsFrozen naming the held revision and the waiting K change",
                      both_waiting, 240, 1, describe=lambda: condition(kube.get("sm", name), "Progressing"))
    print(f"while frozen: {frozen['message']}")
    status = kube.get("sm", name)["status"]
    assert revision(kube, pool) == before and running_k(kube, pool) == INITIAL_K
    assert decided_k(status, pool) == INITIAL_K and not (status.get("speculation") or {}).get("lastDecision")
    assert not [e for e in kube.events(name) if e["reason"] in ("KChanged", "KExplore", "RevisionChanged")]

    body["spec"]["rollout"]["freeze"] = False
    kube.apply(body)

    def rolled_out() -> bool:
        status = kube.get("sm", name)["status"]
        decision = (status.get("speculation") or {}).get("lastDecision")
        return bool(decision and decision["fromK"] == INITIAL_K and revision(kube, pool) != before
                    and running_k(kube, pool) == decided_k(status, pool) != INITIAL_K)

    wait_for("the spec change and the K change rolled out", rolled_out, 300, 1,
             describe=lambda: (kube.get("sm", name).get("status"), revision(kube, pool)))
    progressing = condition(kube.get("sm", name), "Progressing")
    assert progressing is not None and progressing["reason"] != "RolloutsFrozen", progressing
