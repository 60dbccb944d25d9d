"""Faults between a K decision and its rollout: one decision, one Deployment rollout, never a revert.

A decision is written to status first and only then rendered into the Deployment. Two faults in that path:
- the status write that records the decision is refused for a while: the Deployment must not change
  until the decision is in status, then roll exactly once;
- the operator is SIGKILLed after the status write and before the Deployment apply (held there by a policy
  refusing the rollout): the next process applies the recorded K, exactly once.
Rollouts and decisions are counted in the API server's audit log (tests/e2e/audit.py).
"""

from __future__ import annotations

import signal
import time

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.audit import (
    AuditEntry,
    AuditLog,
    deployment_writes,
    recorded_sequence,
    rollouts,
    status_writes,
    written_status,
)
from tests.e2e.faults import INITIAL_K, AdmissionFault, decided_k, running_k, settle, template, tuned_model
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.long]

# The tuner's first decision: pods up, 2000 drafts at K=5 and an evaluation every 10 s.
DECISION_S = 180
# How long a refusal lasts: this many refused writes of the decision, each a pass that could have rolled the
# Deployment on a K that status does not hold.
REFUSED_WRITES = 3
# Passes after the rollout in which a revert or a second rollout would show.
QUIET_PASSES = 4


def _decisions(entries: list[AuditEntry], model: str, pool: str) -> list[int]:
    """K values the status recorded for the pool, in order, starting from INITIAL_K."""
    recorded = recorded_sequence(status_writes(entries, model), lambda status: decided_k(status, pool))
    return recorded if recorded[:1] == [INITIAL_K] else [INITIAL_K, *recorded]


def _first_recorded(entries: list[AuditEntry], model: str, pool: str, k: int) -> str:
    return next(entry.received for entry in status_writes(entries, model)
                if entry.ok and decided_k(written_status(entry), pool) == k)


def test_refused_status_write_holds_the_deployment_then_it_rolls_once(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    model = "refused-status"
    audit = AuditLog(cluster.paths.logs / "audit.log")
    # Only status writes that change a recorded K are refused, so the policy is in force before the model
    # exists (its first status, and later ones without a decision, pass) and no decision slips past it.
    refusal = AdmissionFault.refuse_k_decisions(kube, model)
    with refusal.installed(verify=False):
        kube.apply(tuned_model(model))
        pool = settle(kube, model)
        refusal.verify()
        baseline = template(kube, pool)
        namespace = str(kube.namespace)

        def refused_decisions() -> list[AuditEntry]:
            return [entry for entry in status_writes(audit.entries(namespace), model)
                    if entry.denied and decided_k(written_status(entry), pool) not in (None, INITIAL_K)]

        first = wait_for("a refused status write carrying a K decision", refused_decisions, DECISION_S, 1)[0]
        wait_for(f"{REFUSED_WRITES} refused writes of the decision", lambda: len(refused_decisions()) >= REFUSED_WRITES,
                 DECISION_S, 1, describe=lambda: len(refused_decisions()))
        held = audit.entries(namespace)
    refused = [entry for entry in status_writes(held, model) if entry.denied]
    early = rollouts(held, pool, baseline)
    assert early == [], (f"the Deployment rolled to K={[c.k for c in early]} while status still said "
                         f"K={INITIAL_K} (decision K={decided_k(written_status(first), pool)} refused)")

    def running_as_recorded() -> int | None:
        recorded = decided_k(kube.get("sm", model).get("status", {}), pool)
        return recorded if recorded not in (None, INITIAL_K) and running_k(kube, pool) == recorded else None

    final_k = wait_for("the decision in status and running", running_as_recorded, DECISION_S, 1)
    operator.wait_passes(namespace, model, QUIET_PASSES + 1)
    entries = audit.entries(namespace)
    changes = rollouts(entries, pool, baseline)
    decisions = _decisions(entries, model, pool)
    print(f"\nrefused decision write: {len(refused)} status writes refused while the policy held, from the first "
          f"refused decision (K {INITIAL_K}->{decided_k(written_status(first), pool)}); then decisions recorded "
          f"{decisions}, rollouts {[c.k for c in changes]}, operator Deployment write requests "
          f"{len(deployment_writes(entries, pool))}")
    assert decisions == [INITIAL_K, final_k], f"one decision recorded, never reverted: {decisions}"
    assert [c.k for c in changes] == [final_k], f"exactly one rollout, to the recorded K: {changes}"
    assert _first_recorded(entries, model, pool, final_k) <= changes[0].received, "rolled before it was recorded"
    assert running_k(kube, pool) == final_k == decided_k(kube.get("sm", model)["status"], pool)


def test_operator_killed_between_status_write_and_rollout_applies_the_recorded_k_once(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    model = "killed-mid-k"
    audit = AuditLog(cluster.paths.logs / "audit.log")
    # Creating the Deployment passes the policy (it refuses template changes only), so it can be in force
    # before the model exists, and the tuner's first decision cannot slip past it.
    fault = AdmissionFault.refuse_rollouts(kube, f"{model}-gfx942")
    with fault.installed(verify=False):
        kube.apply(tuned_model(model))
        pool = settle(kube, model)
        assert pool == f"{model}-gfx942"
        fault.verify()
        baseline = template(kube, pool)
        namespace = str(kube.namespace)
        def recorded() -> int | None:
            k = decided_k(kube.get("sm", model).get("status", {}), pool)
            return k if k not in (None, INITIAL_K) else None

        recorded_k = wait_for("a K decision recorded in status while its rollout is refused", recorded,
                              DECISION_S, 1, describe=lambda: [
                                  f"{e.verb} {e.code} {e.message}" for e in deployment_writes(
                                      audit.entries(namespace), pool)][-3:])
        operator.stop(signal.SIGKILL)
        killed_at = time.monotonic()
        fault.remove()
    held = audit.entries(namespace)
    try:
        operator.start()
        restarted_s = time.monotonic() - killed_at
        wait_for(f"the new operator rolling K={recorded_k}", lambda: running_k(kube, pool) == recorded_k, 120, 1)
        operator.wait_passes(namespace, model, QUIET_PASSES + 1)
    finally:
        if operator.process is None or operator.process.poll() is not None:
            operator.start()  # the session's other tests need it
    entries = audit.entries(namespace)
    changes = rollouts(entries, pool, baseline)
    refused = [entry for entry in deployment_writes(held, pool) if entry.denied]
    decisions = _decisions(entries, model, pool)
    print(f"\nkill -9 between status and rollout: {len(refused)} rollout writes refused before the kill; "
          f"new operator up {restarted_s:.1f}s after the kill; decisions recorded {decisions}, rollouts "
          f"{[c.k for c in changes]}, operator Deployment write requests {len(deployment_writes(entries, pool))}")
    assert rollouts(held, pool, baseline) == [], "the rollout happened although it was refused"
    assert decisions == [INITIAL_K, recorded_k], f"the recorded decision was kept, not re-made: {decisions}"
    assert [c.k for c in changes] == [recorded_k], f"exactly one rollout, to the recorded K: {changes}"
    assert running_k(kube, pool) == recorded_k == decided_k(kube.get("sm", model)["status"], pool)
