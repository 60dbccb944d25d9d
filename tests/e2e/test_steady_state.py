"""Restart and steady state: no duplicate objects, no churn, and no writes while nothing changes.

Each test runs an operator of its own (watching only its namespace) whose periods come from tests/e2e/tier.py:
short in the fast tier, so a quiet window spans many reconcile and status periods in seconds; production
lengths in the thorough tier (hack/test --thorough), where the autotune window is the 10-minute measurement."""

from __future__ import annotations

import itertools
import math
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.audit import operator_write_entries, operator_writes_since
from tests.e2e.kube import Kube, example_docs, wait_for
from tests.e2e.lanes import DEMO_FLEET_EXAMPLES
from tests.e2e.operator_process import FleetDriverProcess, OperatorFactory, OperatorProcess
from tests.e2e.tier import THOROUGH, period, setting

# The lane of the tests that apply the shipped examples (tests/e2e/lanes.py).
pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.xdist_group(DEMO_FLEET_EXAMPLES)]

REPO = Path(__file__).resolve().parents[2]
MODELS = ("llama8b-eagle3", "llama70b-draft", "qwen-coder-ngram")
# Restart then quiet: the operator's periods, and the window in reconcile periods (thorough: 24 x 5 s = 2 min).
RECONCILE_S = period(fast=2, thorough=5)
QUIET_STATS_PERIOD_S = period(fast=5, thorough=300)
QUIET_RECONCILES = 12 if not THOROUGH else 24
# Passes of each model over which nothing may be written: many reconcile periods, and three status statistics
# periods at least.
QUIET_PASSES = max(QUIET_RECONCILES, math.ceil(3 * QUIET_STATS_PERIOD_S / RECONCILE_S)) if not THOROUGH \
    else QUIET_RECONCILES
# Autotune on: status statistics at most once per STATS_PERIOD_S. The window is three periods in the fast tier and
# the acceptance measurement's 10 minutes (two periods) in the thorough one; SPECDEC_E2E_AUTOTUNE_WINDOW_S
# overrides it (the bounds below scale with the window).
STATS_PERIOD_S = period(fast=20, thorough=300)
AUTOTUNE_WINDOW_S = float(os.environ.get("SPECDEC_E2E_AUTOTUNE_WINDOW_S", 3 * STATS_PERIOD_S if not THOROUGH else 600))
TUNE_INTERVAL_S = int(period(fast=5, thorough=15))
COOLDOWN_S = int(period(fast=15, thorough=60))


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


def last_write_at_least(cluster: LocalCluster, namespace: str, seconds: float) -> bool:
    """Whether the operator's last write in `namespace` is `seconds` old (the Ready status write has landed)."""
    since = datetime.fromtimestamp(time.time() - seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return not operator_writes_since(cluster.paths.logs / "audit.log", since, namespace)


def test_restart_then_quiet_for_many_reconcile_periods(
    cluster: LocalCluster, kube: Kube, namespace: str, scoped_operator: OperatorFactory
) -> None:
    settings = {"SPECDEC_RECONCILE_INTERVAL_SECONDS": setting(RECONCILE_S),
                "SPECDEC_STATUS_STATS_PERIOD_SECONDS": setting(QUIET_STATS_PERIOD_S)}
    operator = scoped_operator(**settings)
    for example in ("eagle3-mi300x.yaml", "draft-70b-mi300x-mi250x.yaml", "ngram-w7900.yaml"):
        docs = example_docs(example)
        for doc in docs:
            # Live acceptance and tokens/s change whenever simulators serve (the fleet driver may run in this
            # session), and status reports them: that is change, not steady state. Without tuning the
            # operator observes only its own objects and the nodes.
            doc["spec"].setdefault("speculation", {}).setdefault("autotune", {})["enabled"] = False
        kube.apply_with_secrets(docs)
    wait_for("all models Ready", lambda: all_ready(kube), 90)
    wait_for("no operator write for two reconcile periods",
             lambda: last_write_at_least(cluster, namespace, 2 * RECONCILE_S), 60, 0.5)
    before = snapshot(kube)

    restarted_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    operator.restart()
    # Three full reconciles of every model by the restarted operator (a fresh metrics registry counts them).
    wait_for("three reconciles per model after the restart",
             lambda: operator.total("specdec_reconcile_total") >= 3 * len(MODELS), 10 * RECONCILE_S + 30, 0.5)
    after_restart = snapshot(kube)
    assert after_restart == before, "restart changed or duplicated owned objects"
    assert operator_writes_since(cluster.paths.logs / "audit.log", restarted_at, namespace) == [], operator.log_tail()
    assert operator.total("specdec_api_writes_total") == 0

    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    started = time.monotonic()
    reconciles_before = operator.total("specdec_reconcile_total")
    # The property is an absence over many passes: each model's passes, counted (the interval's, level-triggered;
    # a model that stopped reconciling fails the wait), not a clock. The count spans the status statistics'
    # refresh period three times over, so a statistics write that should not happen has its chances.
    operator.wait_passes(namespace, MODELS, QUIET_PASSES, timeout_s=4 * QUIET_PASSES * RECONCILE_S + 30)
    elapsed = time.monotonic() - started
    writes = operator_writes_since(cluster.paths.logs / "audit.log", since, namespace)
    reconciles = operator.total("specdec_reconcile_total") - reconciles_before
    print(f"\nsteady state: {len(writes)} operator write requests over {QUIET_PASSES} passes of each model in "
          f"{elapsed:.0f}s ({elapsed / RECONCILE_S:.0f} reconcile periods of {RECONCILE_S:g}s; audit log), "
          f"{reconciles:.0f} reconciles, operator-counted writes {operator.total('specdec_api_writes_total'):.0f}")
    assert writes == []
    # Level-triggered at the configured period (not just now and then): at least half the periods show up.
    assert reconciles >= len(MODELS) * elapsed / RECONCILE_S / 2, reconciles
    assert snapshot(kube) == before


def decided_within(kube: Kube, name: str, seconds: float) -> bool:
    decision = kube.get("sm", name).get("status", {}).get("speculation", {}).get("lastDecision")
    if not decision:
        return False
    at = datetime.fromisoformat(decision["time"].replace("Z", "+00:00"))
    return (datetime.now(UTC) - at).total_seconds() < seconds


def deployment_generations(kube: Kube) -> dict[str, int]:
    return {item["metadata"]["name"]: int(item["metadata"]["generation"])
            for item in kube.items("deployments", "app.kubernetes.io/managed-by=specdec-operator")}


# Ready (up to 3 min), settled (up to 20 min), then the window: more than the suite's 600 s default.
@pytest.mark.timeout(int(AUTOTUNE_WINDOW_S) + 1800)
def test_autotune_on_with_live_traffic_writes_status_at_a_bounded_rate_and_no_deployment(
    cluster: LocalCluster, kube: Kube, namespace: str, scoped_operator: OperatorFactory,
    fleet_driver: FleetDriverProcess
) -> None:
    """The demo fleet with autotune on, simulators serving: live statistics change all the time, yet a model's
    status is written at most once per statusStatsPeriodSeconds and no Deployment is touched once K settled.

    The shipped examples wait 600 s between K changes; here the tuner evaluates every 5 s with a 15 s cooldown
    (thorough: 15 s, 60 s), so K settles in minutes and the window then shows what a settled fleet costs,
    evaluations included."""
    operator: OperatorProcess = scoped_operator(SPECDEC_STATUS_STATS_PERIOD_SECONDS=setting(STATS_PERIOD_S))
    for example in ("eagle3-mi300x.yaml", "draft-70b-mi300x-mi250x.yaml", "ngram-w7900.yaml"):
        docs = example_docs(example)
        for doc in docs:
            autotune = doc["spec"].setdefault("speculation", {}).setdefault("autotune", {})
            autotune.update({"enabled": True, "intervalSeconds": TUNE_INTERVAL_S, "cooldownSeconds": COOLDOWN_S})
        kube.apply_with_secrets(docs)
    wait_for("all models Ready", lambda: all_ready(kube), 180, 2)
    # Settled: every tuner has had several evaluations since its last change and the Deployments are quiet.
    quiet_for = COOLDOWN_S + 3 * TUNE_INTERVAL_S
    quiet_since = [time.monotonic(), deployment_generations(kube)]

    def settled() -> bool:
        generations = deployment_generations(kube)
        if generations != quiet_since[1] or not all_ready(kube):
            quiet_since[:] = [time.monotonic(), generations]
        recent = [name for name in MODELS if decided_within(kube, name, quiet_for)]
        return not recent and time.monotonic() - quiet_since[0] >= quiet_for
    wait_for(f"no K decision and no Deployment change for {quiet_for} s", settled, 1200, 5)
    before = snapshot(kube)
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    started = time.monotonic()
    # The window is the tuner's work, not a clock: every model evaluated as many times as the window's length
    # holds evaluation intervals (each evaluation counts one decision per pool, Hold included).
    operator.wait_tuner_evaluations(namespace, MODELS, math.ceil(AUTOTUNE_WINDOW_S / TUNE_INTERVAL_S),
                                    timeout_s=AUTOTUNE_WINDOW_S + 600)
    elapsed = time.monotonic() - started
    writes = operator_write_entries(cluster.paths.logs / "audit.log", since, namespace)
    status_writes: dict[str, list[datetime]] = {name: [] for name in MODELS}
    for write in writes:
        if write["resource"] == "speculativemodels" and write["subresource"] == "status":
            status_writes.setdefault(write["name"], []).append(
                datetime.fromisoformat(write["at"].replace("Z", "+00:00")))
    deployment_writes = [w for w in writes if w["resource"] == "deployments"]
    others = [w for w in writes if w["resource"] not in ("deployments", "speculativemodels")]
    gaps = {name: [round((b - a).total_seconds()) for a, b in itertools.pairwise(times)]
            for name, times in status_writes.items()}
    print(f"\nautotune on, {elapsed:.0f}s window: status writes per model "
          f"{ {name: len(times) for name, times in status_writes.items()} }, gaps (s) {gaps}, "
          f"Deployment writes {len(deployment_writes)}, other writes {len(others)}; "
          f"scrapes ok {operator.total('specdec_scrapes_total'):.0f}, "
          f"reconciles {operator.total('specdec_reconcile_total'):.0f}")
    for name in MODELS:
        decision = kube.get("sm", name).get("status", {}).get("speculation", {}).get("lastDecision")
        print(f"  {name}: last decision {decision and (decision['time'], decision['fromK'], decision['toK'])}")
    assert deployment_writes == [], deployment_writes
    for name, times in status_writes.items():
        assert len(times) <= int(elapsed // STATS_PERIOD_S) + 1, (name, times)
        assert all(gap >= STATS_PERIOD_S - 5 for gap in gaps[name]), (name, gaps[name])
    assert snapshot(kube) == before
