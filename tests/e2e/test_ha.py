"""HA: two peered operator processes, only one acts; kill -9 it and the other takes over.

Both run as the chart runs them (peering on, not standalone) with the kopf peering CRDs from the chart,
each with a random priority: the lower one pauses while the higher one's keep-alive is fresh. A killed
operator cannot say goodbye, so the survivor resumes when the dead one's keep-alive expires, at most
kopf's peering lifetime after its last keep-alive. The leader dies mid-canary: the canary's step and
timers live in the model's status, so the survivor carries on from there instead of starting over.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.helm import Helm, Release, unique_name
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.test_canary import canary_model, canary_status, change, route, settle, stable_revision, weights

# Exclusive: it times a takeover after kill -9 against the peering lifetime; under the other lanes' load the
# survivor's keep-alives and its canary analysis slow down past the bound (a fresh-clone run failed so).
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

# kopf's PeeringSettings.lifetime default: how long a keep-alive counts as a live peer.
PEERING_LIFETIME_S = 60
# Time for the survivor's pause to end and its first reconcile to finish once the lifetime ran out.
TAKEOVER_SLACK_S = 15
RECONCILES = "specdec_reconcile_total"
MODEL = "ha"
STABLE = f"{MODEL}-gfx942"


@pytest.fixture
def peered_pair(cluster: LocalCluster, crds: None, operator: OperatorProcess,
                namespace: str) -> Iterator[list[OperatorProcess]]:
    """Two peered operators watching `namespace`; the session's standalone operator is paused meanwhile."""
    # The chart brings kopf's peering CRDs; its own (single, KWOK-faked) replica never runs.
    release = Release(Helm(cluster), unique_name("ha"), unique_name("e2e-ha-sys"),
                      {"watchNamespaces": [namespace], "replicaCount": 1})
    # A standalone operator ignores peering altogether and would act next to whichever replica leads.
    operator.stop()
    pair: list[OperatorProcess] = []
    try:
        release.install()
        pair = [OperatorProcess(cluster, name=f"operator-{release.name}-{replica}", SPECDEC_STANDALONE="false",
                                SPECDEC_NAMESPACES=json.dumps([namespace]))
                for replica in ("a", "b")]
        for process in pair:
            process.start()
        yield pair
    finally:
        for process in pair:
            process.stop()
        operator.start()
        release.cleanup()


def _live_peers(kube: Kube) -> int:
    peering = kube.run("get", "kopfpeering", "specdec-operator", "-o", "json", check=False)
    return len(json.loads(peering).get("status", {})) if peering else 0


def _deployments(kube: Kube) -> dict[str, str]:
    return {d["metadata"]["name"]: d["metadata"]["uid"] for d in kube.items("deployments", f"specdec.io/model={MODEL}")}


def test_one_acts_and_the_other_takes_over_mid_canary_after_kill_9(
    kube: Kube, peered_pair: list[OperatorProcess], fleet_driver: FleetDriverProcess
) -> None:
    wait_for("both operators' keep-alives in the peering object", lambda: _live_peers(kube) == 2, 30)
    body = canary_model(MODEL, pause_s=10)
    # The survivor analyses from fresh counter windows of a few seconds; this test is about who acts, not
    # about how tight the tokens/s threshold can be on such short windows.
    body["spec"]["rollout"]["canary"]["analysis"]["minTokensPerSecondRatio"] = 0.5
    kube.apply([route(MODEL), body])
    old_revision = settle(kube, MODEL)

    def passes() -> float:
        return sum(process.model_passes(str(kube.namespace), MODEL) for process in peered_pair)

    # A standby that acted too would have reconciled the model by the time the active one has twice more.
    before = passes()
    wait_for("two more passes of the model", lambda: passes() >= before + 2, 60, 0.5)
    totals = [process.total(RECONCILES) for process in peered_pair]
    assert sorted(total > 0 for total in totals) == [False, True], f"reconciles per operator: {totals}"
    active, standby = sorted(peered_pair, key=lambda process: process.total(RECONCILES), reverse=True)
    stable_uid = _deployments(kube)[STABLE]

    change(kube, body)
    before = wait_for("canary step 1 at 10%", lambda: (c := canary_status(kube, MODEL)) and c["weight"] == 10 and c,
                      90, 0.5)
    # kopf posts events from a queue after the status write: a kill -9 in that instant loses the event but never
    # the step, which lives in status (docs/canary.md, "Failover"). The chosen point is after both, so the
    # survivor's events can be checked for repeats; the status checks below cover the step itself.
    kube.events_once(MODEL, "CanaryStepStarted")
    active.stop(signal.SIGKILL)
    killed = time.monotonic()
    wait_for("the standby's first reconcile", lambda: standby.total(RECONCILES) > 0,
             PEERING_LIFETIME_S + TAKEOVER_SLACK_S, 0.25)
    takeover_s = time.monotonic() - killed
    print(f"\nfailover: standby reconciled {takeover_s:.1f}s after kill -9 (peering lifetime {PEERING_LIFETIME_S}s)")

    resumed = canary_status(kube, MODEL)
    assert resumed is not None and resumed["canaryRevision"] == before["canaryRevision"], resumed
    # Where the dead leader left it, or further on: never back to an earlier step or a restarted timer.
    assert (resumed["step"], resumed["stepStartedAt"]) >= (before["step"], before["stepStartedAt"]), (before, resumed)
    wait_for("the canary promoted by the survivor",
             lambda: (c := canary_status(kube, MODEL)) and c["phase"] == "Promoted", 240, 1,
             describe=lambda: (canary_status(kube, MODEL),
                               [f"{e['reason']}: {e['message']}" for e in kube.events(MODEL)][-6:]))
    # One canary, each step passed once, in order: nothing repeated or skipped across the failover.
    in_order = sorted(kube.events_once(MODEL, "CanaryPromoted"),
                      key=lambda e: e.get("eventTime") or e.get("firstTimestamp") or "")
    events = [(e["reason"], e["message"]) for e in in_order if e["reason"].startswith("Canary")]
    assert [r for r, _ in events if r in ("CanaryStarted", "CanaryPromoted")] == ["CanaryStarted", "CanaryPromoted"]
    assert [m.split(" ")[1] for r, m in events if r == "CanaryStepStarted"] == ["1/3"], events
    assert [m.split(" ")[1] for r, m in events if r == "CanaryStepPassed"] == ["1/3", "2/3"], events
    # No duplicates: after promotion the pool is its one stable Deployment again, the same object as before.
    wait_for("canary Deployment removed", lambda: set(_deployments(kube)) == {STABLE}, 60)
    assert _deployments(kube)[STABLE] == stable_uid
    assert stable_revision(kube, MODEL) != old_revision
    assert weights(kube, MODEL) == (100, 0)
