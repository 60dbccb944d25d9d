"""The control plane restarts in the middle of a K change and of a canary step: nothing is lost, no step
is repeated or skipped, and nothing rolls out more than once.

Two tuned models share the namespace, both moving K away from 5. One rolls its pool directly, and its
decision is recorded in status while a policy holds the Deployment rollout back; the other takes the
change through a canary and is in the canary's first step. Then kube-apiserver (or etcd,
keeping its data dir) is killed and started again, and only then does the policy go: the outage lands
between the recorded decision and its rollout, and inside the canary step. Counted in the API server's
audit log (the restarted API server appends to the same file) and cross-checked with the Deployment
controller's own revision counter.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.audit import AuditEntry, AuditLog, recorded_sequence, rollouts, route_weights, status_writes
from tests.e2e.faults import INITIAL_K, AdmissionFault, decided_k, running_k, settle, template, tuned_model
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.test_canary import canary_model, canary_status, route, route_weights_for, stable_revision
from tests.e2e.test_canary import settle as settle_canary

# Exclusive: restarts kube-apiserver and etcd under every lane.
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

TUNED = "kroll"
CANARY = "canaryroll"
DECISION_S = 180
# Each canary step lasts at least this long; the restart happens early in step 1.
STEP_PAUSE_S = 20
PROMOTION_S = 240
QUIET_PASSES = 3


def _deployment_revision(kube: Kube, name: str) -> str:
    """The Deployment controller's own count of pod templates this Deployment went through."""
    return str(kube.get("deployment", name)["metadata"]["annotations"]["deployment.kubernetes.io/revision"])


def _utc_now() -> str:
    """Now, in the audit log's format (RFC 3339 with microseconds), so the two compare as text."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _canary_steps(entries: list[AuditEntry]) -> list[tuple[Any, ...]]:
    """(step, weight, stepStartedAt, phase) of the canary as each successful status write left it."""
    def read(status: dict[str, Any]) -> tuple[Any, ...] | None:
        canary = status.get("canary")
        if not canary:
            return None
        return canary["step"], canary["weight"], canary["stepStartedAt"], canary["phase"]

    return recorded_sequence(status_writes(entries, CANARY), read)


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_control_plane_restart_mid_k_rollout_and_mid_canary_step(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, component: str
) -> None:
    namespace = str(kube.namespace)
    audit = AuditLog(cluster.paths.logs / "audit.log")
    tuned_pool, stable, canary_deployment = f"{TUNED}-gfx942", f"{CANARY}-gfx942", f"{CANARY}-gfx942-canary"
    hold = AdmissionFault.refuse_rollouts(kube, tuned_pool)
    started = time.monotonic()
    with hold.installed(verify=False):
        body = canary_model(CANARY, pause_s=STEP_PAUSE_S, autotune=True, profile="e2e-opt-k2")
        body["spec"]["speculation"] = tuned_model(CANARY)["spec"]["speculation"]
        kube.apply([tuned_model(TUNED), route(CANARY), body])
        assert settle(kube, TUNED) == tuned_pool
        hold.verify()
        tuned_baseline = template(kube, tuned_pool)
        old_revision = settle_canary(kube, CANARY)
        stable_baseline = template(kube, stable)

        def recorded() -> int | None:
            k = decided_k(kube.get("sm", TUNED).get("status", {}), tuned_pool)
            return k if k not in (None, INITIAL_K) else None

        recorded_k = wait_for("a K decision recorded in status while its rollout is held", recorded, DECISION_S, 1)
        in_step = wait_for("the tuner's canary in step 1 at 10%",
                           lambda: (c := canary_status(kube, CANARY)) and c["phase"] == "Progressing"
                           and c["weight"] == 10 and c, DECISION_S, 0.5)
        canary_k = int(in_step["canaryK"])
        # The outage lands between the recorded decision and its rollout by construction: the policy (stored
        # in etcd) holds the rollout across the restart and goes only once the API server is back.
        outage_began = _utc_now()
        down_s = cluster.restart(component, kill=True)
        back = _utc_now()
        hold.remove()

    wait_for(f"K={recorded_k} rolled out after the restart", lambda: running_k(kube, tuned_pool) == recorded_k, 120, 1)
    wait_for("the canary promoted", lambda: (c := canary_status(kube, CANARY)) and c["phase"] == "Promoted",
             PROMOTION_S, 1, describe=lambda: canary_status(kube, CANARY))
    wait_for("canary Deployment removed", lambda: kube.get("deployment", canary_deployment) is None, 60)
    wait_for(f"K={canary_k} on the promoted stable pool", lambda: running_k(kube, stable) == canary_k, 60, 1)
    for model in (TUNED, CANARY):
        operator.wait_passes(namespace, model, QUIET_PASSES + 1)  # nothing more once both are done
    entries = audit.entries(namespace)

    k_rollouts = rollouts(entries, tuned_pool, tuned_baseline)
    k_recorded = recorded_sequence(status_writes(entries, TUNED), lambda s: decided_k(s, tuned_pool))
    steps = _canary_steps(entries)
    canary_recorded = recorded_sequence(status_writes(entries, CANARY), lambda s: decided_k(s, stable))
    weights = route_weights(entries, f"{CANARY}-route", f"{CANARY}-canary")
    canary_rollouts = rollouts(entries, canary_deployment)
    stable_rollouts = rollouts(entries, stable, stable_baseline)
    canary_deletes = [e for e in entries if e.is_write_of("deployments", canary_deployment) and e.verb == "delete"
                      and e.ok]
    print(f"\n{component} restart: down {down_s:.1f}s from {outage_began}; test {time.monotonic() - started:.0f}s. "
          f"K: recorded {k_recorded}, rollouts {[(c.k, c.received) for c in k_rollouts]}, Deployment revision "
          f"{_deployment_revision(kube, tuned_pool)}. Canary: K recorded {canary_recorded}, "
          f"steps {[(s[0], s[1], s[3]) for s in steps]}, "
          f"route weights {weights}, canary Deployment created {sum(c.created for c in canary_rollouts)}x and "
          f"deleted {len(canary_deletes)}x, stable rollouts {len(stable_rollouts)}")

    # The K change: recorded once, rolled out once (after the outage), never reverted.
    assert k_recorded in ([INITIAL_K, recorded_k], [recorded_k]), f"K recorded in status: {k_recorded}"
    assert [c.k for c in k_rollouts] == [recorded_k], f"exactly one rollout of the tuned pool: {k_rollouts}"
    assert k_rollouts[0].received > back, "the rollout was not held across the outage"
    assert _deployment_revision(kube, tuned_pool) == "2", "the Deployment controller saw more than one rollout"
    assert running_k(kube, tuned_pool) == recorded_k == decided_k(kube.get("sm", TUNED)["status"], tuned_pool)

    # The canary: one decision, each step started once, in order, none skipped; the step in flight kept its start time.
    # (Weight 0 at step 0 is the wait for the canary's pods; the step's clock starts with its traffic.)
    assert canary_recorded in ([INITIAL_K, canary_k], [canary_k]), f"canary model's K in status: {canary_recorded}"
    in_flight = [s for s in steps if s[3] in ("Progressing", "Paused") and s[1] > 0]
    step_starts = {(s[0], s[2]) for s in in_flight}
    assert len(step_starts) == len({s[0] for s in in_flight}), f"a step was restarted: {in_flight}"
    indices = [s[0] for s in in_flight]
    assert indices == sorted(indices) and sorted(set(indices)) == list(range(indices[0], indices[0] + 3)), (
        f"steps repeated or skipped: {in_flight}")
    assert (in_step["step"], in_step["stepStartedAt"]) in step_starts, f"step 1 was started again: {in_flight}"
    next_step = min(started_at for step, started_at in step_starts if step == in_step["step"] + 1)
    assert _at(in_step["stepStartedAt"]) <= _at(outage_began) <= _at(next_step), "the outage missed step 1"
    assert steps[-1][3] == "Promoted", steps
    # The route's weights in order, none out of turn. The outage starts as soon as status shows step 1, which is
    # when the operator writes that step's route weight (status first): a write the killed API server committed
    # but never audited is missing from the log (its answer was lost, and the route already carries it, so the
    # operator has nothing to write again). So the audited weights are the expected ones in order, with at most
    # that one missing, and end at 100 then 0.
    expected, audited = route_weights_for(body), [w for w in weights if w]
    assert audited and audited[-1] == 100 and weights[-1] == 0, f"route weights: {weights}"
    assert audited == expected or (component == "kube-apiserver" and len(audited) == len(expected) - 1
                                   and all(w in expected for w in audited)
                                   and audited == sorted(audited, key=expected.index)), f"route weights: {weights}"
    assert [(c.created, c.k) for c in canary_rollouts] == [(True, canary_k)], f"canary Deployment: {canary_rollouts}"
    assert len(canary_deletes) == 1
    assert [c.k for c in stable_rollouts] == [canary_k], f"stable Deployment rollouts: {stable_rollouts}"
    assert stable_rollouts[0].revision == stable_revision(kube, CANARY) != old_revision
    assert _deployment_revision(kube, stable) == "2", "the stable Deployment rolled more than once"
