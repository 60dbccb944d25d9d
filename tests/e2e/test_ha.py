"""HA: two peered operator processes, only one acts; kill -9 it and the other takes over.

Both run as the chart runs them (peering on, not standalone) with the kopf peering CRDs from the chart,
each with a random priority: the lower one pauses while the higher one's keep-alive is fresh. A killed
operator cannot say goodbye, so the survivor resumes when the dead one's keep-alive expires, at most
kopf's peering lifetime after its last keep-alive.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.helm import Helm, Release, unique_name
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

# kopf's PeeringSettings.lifetime default: how long a keep-alive counts as a live peer.
PEERING_LIFETIME_S = 60
# Time for the survivor's pause to end and its first reconcile to finish once the lifetime ran out.
TAKEOVER_SLACK_S = 15
RECONCILES = "specdec_reconcile_total"
MODEL = "ha-draft"
POOLS = {f"{MODEL}-gfx942", f"{MODEL}-gfx90a"}


def two_pool_model(max_model_len: int) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": MODEL},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.3-70B-Instruct", "tensorParallelSize": 4,
                      "maxModelLen": max_model_len},
            "drafters": [{"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct"}],
            "speculation": {"initialK": 4, "minK": 0, "maxK": 8, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx942", "gfx90a"], "replicasPerPool": 1},
        },
    }


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


def _owned_deployments(kube: Kube) -> dict[str, str]:
    return {d["metadata"]["name"]: d["metadata"]["uid"] for d in kube.items("deployments", f"specdec.io/model={MODEL}")}


def _revisions(kube: Kube) -> set[str]:
    return {d["spec"]["template"]["metadata"]["labels"]["specdec.io/revision"]
            for d in kube.items("deployments", f"specdec.io/model={MODEL}")}


def _ready(kube: Kube) -> bool:
    status = kube.get("sm", MODEL).get("status", {})
    generation = kube.get("sm", MODEL)["metadata"]["generation"]
    return status.get("observedGeneration") == generation and any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def test_one_acts_and_the_other_takes_over_after_kill_9(kube: Kube, peered_pair: list[OperatorProcess]) -> None:
    wait_for("both operators' keep-alives in the peering object", lambda: _live_peers(kube) == 2, 30)
    kube.apply(two_pool_model(8192))
    wait_for(f"{MODEL} Ready", lambda: _ready(kube), 90)
    time.sleep(5)  # a standby that acted too would have reconciled by now: the loop ticks every 5 s
    totals = [process.total(RECONCILES) for process in peered_pair]
    assert sorted(total > 0 for total in totals) == [False, True], f"reconciles per operator: {totals}"
    active, standby = sorted(peered_pair, key=lambda process: process.total(RECONCILES), reverse=True)
    before = _owned_deployments(kube)
    assert set(before) == POOLS, before
    old_revisions = _revisions(kube)

    active.stop(signal.SIGKILL)
    killed = time.monotonic()
    # A change made while nobody leads must not be lost: the survivor picks it up when it takes over.
    kube.apply(two_pool_model(16384))
    wait_for("the standby's first reconcile", lambda: standby.total(RECONCILES) > 0,
             PEERING_LIFETIME_S + TAKEOVER_SLACK_S, 0.25)
    takeover_s = time.monotonic() - killed
    print(f"\nfailover: standby reconciled {takeover_s:.1f}s after kill -9 (peering lifetime {PEERING_LIFETIME_S}s)")

    wait_for("the change rolled out by the survivor", lambda: _ready(kube) and _revisions(kube).isdisjoint(
        old_revisions), 90)
    # The survivor adopted the pools rather than creating a second set: same objects, one per pool.
    assert _owned_deployments(kube) == before
