"""A tuner K change through a canary whose step advance cannot be recorded: nothing moves until it is.

The canary's step, weight and step clock live in status, and traffic and Deployments follow from there.
While status writes are refused (a policy, for longer than the step's pause) the operator must not shift
route weight or resize or roll any Deployment; once writes pass again the canary goes on from the step it
was in, each step once, and the pool rolls exactly once, at promotion. Counted in the audit log.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.audit import (
    AuditEntry,
    AuditLog,
    recorded_sequence,
    rollouts,
    route_weights,
    status_writes,
    written_status,
)
from tests.e2e.faults import INITIAL_K, AdmissionFault, decided_k, running_k, template, tuned_model
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.test_canary import canary_model, canary_status, route, route_weights_for
from tests.e2e.test_canary import settle as settle_canary

pytestmark = [pytest.mark.e2e, pytest.mark.long]

MODEL = "canaryheld"
DECISION_S = 180
STEP_PAUSE_S = 15
QUIET_PASSES = 3


def _steps(entries: list[AuditEntry]) -> list[tuple[Any, ...]]:
    def read(status: dict[str, Any]) -> tuple[Any, ...] | None:
        canary = status.get("canary")
        return (canary["step"], canary["weight"], canary["stepStartedAt"], canary["phase"]) if canary else None

    return recorded_sequence(status_writes(entries, MODEL), read)


def test_refused_step_advance_moves_nothing_then_the_canary_goes_on_from_its_step(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    namespace = str(kube.namespace)
    audit = AuditLog(cluster.paths.logs / "audit.log")
    stable, canary_deployment = f"{MODEL}-gfx942", f"{MODEL}-gfx942-canary"
    body = canary_model(MODEL, pause_s=STEP_PAUSE_S, autotune=True, profile="e2e-opt-k2")
    body["spec"]["speculation"] = tuned_model(MODEL)["spec"]["speculation"]
    kube.apply([route(MODEL), body])
    settle_canary(kube, MODEL)
    stable_baseline = template(kube, stable)
    in_step = wait_for("the tuner's canary in step 1 at 10%",
                       lambda: (c := canary_status(kube, MODEL)) and c["phase"] == "Progressing"
                       and c["weight"] == 10 and c, DECISION_S, 0.5)
    canary_k = int(in_step["canaryK"])
    canary_baseline = template(kube, canary_deployment)

    def refused_advances(entries: list[AuditEntry]) -> list[AuditEntry]:
        return [e for e in status_writes(entries, MODEL) if e.denied
                and (written_status(e).get("canary") or {}).get("step") == in_step["step"] + 1]

    refusal = AdmissionFault.refuse_status_writes(kube, MODEL)
    with refusal.installed():
        cursor = AuditLog(cluster.paths.logs / "audit.log")
        started = time.monotonic()
        # The step ends once its pause is over and the analysis has its finished requests: wait for the
        # operator to try to record the next step (and be refused), then a little longer while still refused.
        wait_for("a refused attempt to record the next step", lambda: refused_advances(cursor.entries(namespace)),
                 DECISION_S, 1, describe=lambda: canary_status(kube, MODEL))
        wait_for("a second refused attempt", lambda: len(refused_advances(cursor.entries(namespace))) >= 2,
                 DECISION_S, 1, describe=lambda: canary_status(kube, MODEL))
        held = cursor.entries(namespace)
        refused_for = time.monotonic() - started
        # Read while still refused: once the policy goes, the operator records the next step at once.
        weight_while_refused = canary_status(kube, MODEL)["weight"]
    refused = [entry for entry in status_writes(held, MODEL) if entry.denied]
    moved = [f"{e.verb} {e.resource}/{e.name}" for e in held if e.by_operator and e.ok
             and e.resource in ("deployments", "httproutes")]
    print(f"\nrefused step advance: {len(refused)} status writes refused in {refused_for:.0f}s "
          f"(step pause {STEP_PAUSE_S}s), {len(refused_advances(held))} of them the next step; "
          f"operator Deployment/HTTPRoute writes meanwhile: {moved}")
    assert moved == [], "traffic or Deployments moved while the step's status could not be written"
    assert weight_while_refused == 10

    wait_for("the canary promoted", lambda: (c := canary_status(kube, MODEL)) and c["phase"] == "Promoted",
             180, 1, describe=lambda: canary_status(kube, MODEL))
    wait_for("canary Deployment removed", lambda: kube.get("deployment", canary_deployment) is None, 60)
    wait_for(f"K={canary_k} on the promoted stable pool", lambda: running_k(kube, stable) == canary_k, 60, 1)
    operator.wait_passes(namespace, MODEL, QUIET_PASSES + 1)  # nothing more after promotion
    entries = audit.entries(namespace)
    steps = _steps(entries)
    weights = route_weights(entries, f"{MODEL}-route", f"{MODEL}-canary")
    recorded = recorded_sequence(status_writes(entries, MODEL), lambda s: decided_k(s, stable))
    stable_rollouts = rollouts(entries, stable, stable_baseline)
    canary_rollouts = rollouts(entries, canary_deployment, canary_baseline)
    print(f"K recorded {recorded}; steps {[(s[0], s[1], s[3]) for s in steps]}; route weights {weights}; "
          f"stable rollouts {[c.k for c in stable_rollouts]}; canary template changes after step 1 "
          f"{[c.k for c in canary_rollouts]}")

    assert recorded in ([INITIAL_K, canary_k], [canary_k]), f"K recorded in status: {recorded}"
    in_flight = [s for s in steps if s[3] in ("Progressing", "Paused") and s[1] > 0]
    step_starts = {(s[0], s[2]) for s in in_flight}
    assert len(step_starts) == len({s[0] for s in in_flight}), f"a step was restarted: {in_flight}"
    assert [s[0] for s in in_flight] == sorted({s[0] for s in in_flight}) == [0, 1, 2], (
        f"steps repeated or skipped: {in_flight}")
    assert (in_step["step"], in_step["stepStartedAt"]) in step_starts, f"step 1 was started again: {in_flight}"
    assert steps[-1][3] == "Promoted", steps
    assert [w for w in weights if w] == route_weights_for(body) and weights[-1] == 0, f"route weights: {weights}"
    assert canary_rollouts == [], f"the canary's pods were replaced mid-canary: {canary_rollouts}"
    assert [c.k for c in stable_rollouts] == [canary_k], f"stable Deployment rollouts: {stable_rollouts}"
