"""Restart and steady state: no duplicate objects, no churn, and no writes while nothing changes."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.cluster import LocalCluster
from tests.e2e.audit import operator_writes_since
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MODELS = ("llama8b-eagle3", "llama70b-draft", "qwen-coder-ngram")
STEADY_WINDOW_S = 120


def snapshot(kube: Kube) -> dict[str, Any]:
    """Name -> (uid, generation) of every owned object; controllers' status updates do not count."""
    objects = {}
    for kind in ("deployments", "configmaps", "services", "poddisruptionbudgets"):
        for item in kube.items(kind, "app.kubernetes.io/managed-by=specdec-operator"):
            meta = item["metadata"]
            objects[f"{kind}/{meta['name']}"] = (meta["uid"], meta.get("generation"))
    return objects


def all_ready(kube: Kube) -> bool:
    for name in MODELS:
        conditions = kube.get("sm", name).get("status", {}).get("conditions", [])
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return False
    return True


def other_test_namespaces_gone(cluster: LocalCluster, mine: str) -> bool:
    """Deleting namespaces make kopf drop finalizers, which are writes; wait until none is left."""
    namespaces = json.loads(cluster.kubectl("get", "namespaces", "-o", "json"))["items"]
    return not [
        ns for ns in namespaces
        if ns["metadata"]["name"] != mine
        and (ns["metadata"]["name"].startswith("e2e-") or ns["status"].get("phase") == "Terminating")
    ]


def test_restart_then_two_quiet_minutes(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    for example in ("eagle3-mi300x.yaml", "draft-70b-mi300x-mi250x.yaml", "ngram-w7900.yaml"):
        docs = list(yaml.safe_load_all((REPO / "examples" / example).read_text()))
        for doc in docs:
            # Live acceptance and tokens/s change whenever simulators serve (the fleet driver may run in this
            # session), and status reports them: that is change, not steady state. Without tuning the
            # operator observes only its own objects and the nodes.
            doc["spec"].setdefault("speculation", {}).setdefault("autotune", {})["enabled"] = False
        kube.apply(docs)
    wait_for("all models Ready", lambda: all_ready(kube), 90)
    wait_for("other tests' namespaces gone", lambda: other_test_namespaces_gone(cluster, namespace), 120, 2)
    time.sleep(3)  # let the last Ready status write land
    before = snapshot(kube)

    restarted_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    operator.restart()
    time.sleep(3 * 5 + 2)  # three reconcile intervals of the e2e settings
    after_restart = snapshot(kube)
    assert after_restart == before, "restart changed or duplicated owned objects"
    assert operator_writes_since(cluster.paths.logs / "audit.log", restarted_at) == [], operator.log_tail()
    assert operator.total("specdec_api_writes_total") == 0

    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    reconciles_before = operator.total("specdec_reconcile_total")
    time.sleep(STEADY_WINDOW_S)
    writes = operator_writes_since(cluster.paths.logs / "audit.log", since)
    reconciles = operator.total("specdec_reconcile_total") - reconciles_before
    print(f"\nsteady state: {len(writes)} operator write requests in {STEADY_WINDOW_S}s "
          f"(audit log), {reconciles:.0f} reconciles, operator-counted writes "
          f"{operator.total('specdec_api_writes_total'):.0f}")
    assert writes == []
    assert reconciles > 0, "the operator must keep reconciling (level-triggered) while writing nothing"
    assert snapshot(kube) == before
