"""Status discipline on the local cluster: a hand-corrupted status holds everything and says which field;
an owned object the API server refuses becomes a condition with the server's words, retried with backoff."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.audit import operator_write_entries
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorFactory, OperatorProcess
from tests.e2e.tier import period, setting

pytestmark = pytest.mark.e2e

# Refused writes: first retry after BACKOFF_S, doubling up to BACKOFF_MAX_S, watched over a window of the first
# tries (at 0, 2, 6, 14 s in the fast tier) in which a loop retrying every reconcile period would send 20. The
# base stays 2 s: a gap is the backoff plus the request's latency, and on a loaded machine that latency would
# blur the doubling of a 1 s base.
RECONCILE_S = period(fast=1, thorough=5)
BACKOFF_S = 2
BACKOFF_MAX_S = period(fast=16, thorough=600)
REFUSED_WINDOW_S = period(fast=20, thorough=60)


def small_model(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            "speculation": {"initialK": 3, "minK": 1, "maxK": 8, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 1},
        },
    }


def condition(kube: Kube, name: str, kind: str) -> dict[str, Any] | None:
    conditions = (kube.get("sm", name) or {}).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), None)


def ready(kube: Kube, name: str) -> bool:
    found = condition(kube, name, "Ready")
    return found is not None and found["status"] == "True"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_hand_corrupted_status_field_is_named_and_nothing_acts_on_it(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess
) -> None:
    name = "corrupted"
    kube.apply(small_model(name))
    wait_for("model Ready", lambda: ready(kube, name), 90)
    operator.wait_passes(str(kube.namespace), name, 2)  # a whole pass after Ready: its writes have landed
    deployment = kube.get("deployment", f"{name}-gfx942")
    since = now_iso()
    # A human edits the decision record's time to something no clock can read; the API server stores it.
    bad = {"status": {"speculation": {"lastDecision": {
        "time": "last tuesday", "pool": f"{name}-gfx942", "fromK": 3, "toK": 5, "action": "Change",
        "reason": "edited by hand"}}}}
    kube.run("patch", "sm", name, "--subresource=status", "--type=merge", "-p", json.dumps(bad))
    # The spec changes too: a healthy operator would roll the pool; a held one must not.
    kube.run("patch", "sm", name, "--type=merge", "-p", json.dumps({"spec": {"placement": {"replicasPerPool": 2}}}))

    def degraded() -> dict[str, Any] | None:
        found = condition(kube, name, "Degraded")
        return found if found and found["reason"] == "StatusUnreadable" else None

    found = wait_for("Degraded=StatusUnreadable", degraded, 30)
    assert found["status"] == "True" and "status.speculation.lastDecision.time" in found["message"], found
    # The event is posted after the status write that carries the condition: wait for it, do not race it.
    warnings = wait_for("a StatusUnreadable event", lambda: [
        e for e in kube.events(name) if e["reason"] == "StatusUnreadable"], 30)
    assert warnings[0]["type"] == "Warning" and "lastDecision.time" in warnings[0]["message"]
    operator.wait_passes(str(kube.namespace), name, 4)  # three whole passes hold it
    held = kube.get("sm", name)["status"]
    assert held["speculation"]["lastDecision"]["time"] == "last tuesday"  # kept for the human to repair
    assert [p["effectiveK"] for p in held["pools"]] == [3]
    after = kube.get("deployment", f"{name}-gfx942")
    assert after["metadata"]["generation"] == deployment["metadata"]["generation"]
    writes = operator_write_entries(cluster.paths.logs / "audit.log", since)
    # A write refused with 409 (the hand edit landed between our read and our write) changed nothing.
    mine = [w for w in writes if w["name"].startswith(name) and w["resource"] != "events" and w["code"] != "409"]
    # Status only: the condition naming the field, written once for the hand edit and at most once more for the
    # spec change's generation (the two kubectl patches can land in one pass or in two).
    assert mine and all((w["resource"], w["subresource"]) == ("speculativemodels", "status") for w in mine), mine
    assert len(mine) <= 2, mine
    # Repaired (the field removed): the operator resumes and rolls out the spec change.
    repair = {"status": {"speculation": {"lastDecision": None}}}
    kube.run("patch", "sm", name, "--subresource=status", "--type=merge", "-p", json.dumps(repair))
    wait_for("Degraded cleared", lambda: (condition(kube, name, "Degraded") or {}).get("status") == "False", 30)
    wait_for("spec change rolled out", lambda: kube.get("deployment", f"{name}-gfx942")["spec"]["replicas"] == 2, 30)


def dry_run_deployment(cluster: LocalCluster, namespace: str) -> str:
    """kubectl's error for a server-side dry-run create of a Deployment (empty when admitted)."""
    result = subprocess.run(
        [str(cluster.binaries["kubectl"]), "--kubeconfig", str(cluster.paths.kubeconfig), "-n", namespace, "create",
         "deployment", "probe", "--image=x", "--dry-run=server"], capture_output=True, text=True, check=False)
    return result.stderr


def deny_deployments(namespace: str, message: str) -> list[dict[str, Any]]:
    name = f"deny-deployments-{namespace}"
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                          "operations": ["CREATE", "UPDATE"],
                                                          "resources": ["deployments"]}]},
                  "validations": [{"expression": "false", "message": message}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": namespace}}}}},
    ]


def test_a_refused_deployment_is_a_condition_with_the_servers_message_and_retries_back_off(
    cluster: LocalCluster, kube: Kube, namespace: str, scoped_operator: OperatorFactory
) -> None:
    operator = scoped_operator(SPECDEC_RECONCILE_INTERVAL_SECONDS=setting(RECONCILE_S),
                               SPECDEC_REFUSED_WRITE_BACKOFF_SECONDS=setting(BACKOFF_S),
                               SPECDEC_REFUSED_WRITE_BACKOFF_MAX_SECONDS=setting(BACKOFF_MAX_S))
    name = "refused"
    message = "resources.limits.memory: 2Gibibytes is not a quantity (injected refusal)"
    policy = deny_deployments(namespace, message)
    cluster_kube = Kube(cluster)
    cluster_kube.apply(policy)
    try:
        wait_for("the policy enforced", lambda: "injected refusal" in dry_run_deployment(cluster, namespace), 30, 1)
        since = now_iso()
        started = time.monotonic()
        kube.apply(small_model(name))

        def refused() -> dict[str, Any] | None:
            found = condition(kube, name, "Degraded")
            return found if found and found["reason"] == "WriteRefused" else None

        found = wait_for("Degraded=WriteRefused", refused, 20)
        seen_after = time.monotonic() - started
        assert message in found["message"] and f"Deployment/{name}-gfx942" in found["message"], found
        # How often a refused object is retried over the model's passes is the property: the window is as many
        # passes as its length holds reconcile periods (a refused write does not end a pass early), so a loop
        # retrying at every pass would show one attempt per pass.
        operator.wait_passes(namespace, name, math.ceil(REFUSED_WINDOW_S / RECONCILE_S),
                             timeout_s=REFUSED_WINDOW_S + 120)
        window_s = time.monotonic() - started
        attempts = [w for w in operator_write_entries(cluster.paths.logs / "audit.log", since, namespace)
                    if w["resource"] == "deployments" and w["name"] == f"{name}-gfx942"]
        times = [datetime.fromisoformat(w["at"].replace("Z", "+00:00")) for w in attempts]
        gaps = [round((b - a).total_seconds(), 1) for a, b in itertools.pairwise(times)]
        warnings = [e for e in kube.events(name) if e["reason"] == "WriteRefused"]
        print(f"\ncondition after {seen_after:.1f}s; {len(attempts)} refused applies in {window_s:.0f}s "
              f"(backoff {BACKOFF_S:g}s doubling, reconcile period {RECONCILE_S:g}s), gaps {gaps}s; "
              f"Warning events {sum(int(e.get('count', 1)) for e in warnings)}")
        assert warnings and message in warnings[0]["message"]
        assert all(w["code"] == "422" or w["code"].startswith("4") for w in attempts), attempts
        assert 2 <= len(attempts) <= 7, gaps  # a loop retrying every reconcile period would have sent 12 or more
        # Backed off: no retry before its wait (2 s, 4 s, 8 s ... from the refusal), as the server saw the requests.
        # A late retry is the machine being busy; only an early one is a defect (gaps are rounded to 0.1 s).
        waits = [min(BACKOFF_MAX_S, BACKOFF_S * 2 ** i) for i in range(len(gaps))]
        assert all(gap >= wait - 0.1 for gap, wait in zip(gaps, waits, strict=True)), (gaps, waits)
    finally:
        for obj in reversed(policy):
            cluster_kube.run("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found")
    wait_for("the Deployment created once the refusal is gone",
             lambda: kube.get("deployment", f"{name}-gfx942") is not None, 2 * BACKOFF_MAX_S + 60, 1)
    wait_for("Degraded cleared", lambda: (condition(kube, name, "Degraded") or {}).get("reason") != "WriteRefused",
             30)
