"""Canary rollouts on the local cluster: HTTPRoute weights, LLM-aware analysis, rollback, restarts."""

from __future__ import annotations

import re
import signal
from datetime import UTC, datetime
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from specdec_operator.canary.plan import equal_load_percent
from tests.e2e.audit import AuditLog, recorded_sequence, route_weights, status_writes
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.long]

EAGLE_A = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE_B = "example-org/EAGLE3-LLaMA3.1-Instruct-8B-v2"


def canary_model(name: str, pause_s: int = 20, autotune: bool = False, profile: str = "quick") -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "drafters": [{"method": "eagle3", "model": EAGLE_A}],
            "speculation": {"initialK": 3, "minK": 1, "maxK": 8, "autotune": {"enabled": autotune}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 2},
            "runtime": {"simulatorProfile": profile},
            "rollout": {
                "strategy": "Canary",
                "canary": {
                    "steps": [{"weight": 10, "pauseSeconds": pause_s}, {"weight": 50, "pauseSeconds": pause_s},
                              {"weight": 100, "pauseSeconds": 5}],
                    # The simulators finish about one request per second per pod: samples are finished requests.
                    "analysis": {"minDrafts": 200, "minRequests": 20, "timeoutSeconds": 90,
                                 "minAcceptedLengthRatio": 0.9, "minTokensPerSecondRatio": 0.8},
                    "traffic": {"httpRouteRef": {"name": f"{name}-route"}},
                },
            },
        },
    }


def route_weights_for(body: dict[str, Any]) -> list[int]:
    """The canary's route weights a model's steps write, consecutive repeats collapsed: each step's route weight
    follows its replica split (`equal_load_percent`), so a canary pod and a stable pod carry the same load."""
    replicas = body["spec"]["placement"]["replicasPerPool"]
    expected: list[int] = []
    for step in body["spec"]["rollout"]["canary"]["steps"]:
        weight = equal_load_percent(replicas, step["weight"])
        if not expected or expected[-1] != weight:
            expected.append(weight)
    return expected


def route(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": f"{name}-route"},
        "spec": {
            "parentRefs": [{"name": "inference-gateway"}],
            "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                 "backendRefs": [{"name": f"{name}-stable", "port": 8000, "weight": 100}]},
                # Another team's rule: must survive every weight change untouched.
                {"matches": [{"path": {"type": "PathPrefix", "value": "/other"}}],
                 "backendRefs": [{"name": "someone-else", "port": 80, "weight": 1}]},
            ],
        },
    }


def weights(kube: Kube, name: str) -> tuple[int, int]:
    refs = kube.get("httproute", f"{name}-route")["spec"]["rules"][0]["backendRefs"]
    by_name = {ref["name"]: ref.get("weight", 1) for ref in refs}
    return by_name.get(f"{name}-stable", 0), by_name.get(f"{name}-canary", 0)


def canary_status(kube: Kube, name: str) -> dict[str, Any] | None:
    return kube.get("sm", name).get("status", {}).get("canary")


def stable_revision(kube: Kube, name: str) -> str:
    return str(kube.get("deployment", f"{name}-gfx942")["spec"]["template"]["metadata"]["labels"][
        "specdec.io/revision"])


def settle(kube: Kube, name: str) -> str:
    """Create the model and route, wait until the stable pool is Ready; returns the stable revision."""
    def ready() -> bool:
        conditions = kube.get("sm", name).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def describe() -> object:
        conditions = kube.get("sm", name).get("status", {}).get("conditions", [])
        return ([f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message')}" for c in conditions],
                [f"{p['metadata']['name']} {p['status'].get('phase')} on {p['spec'].get('nodeName')}"
                 for p in kube.items("pods", f"specdec.io/model={name}")],
                [f"{e['reason']}: {e['message']}" for e in kube.events(name)][-5:])

    # A bound, not a wait: at the start of a lane pass every lane starts pods at once.
    wait_for(f"{name} Ready", ready, 180, describe=describe)
    return stable_revision(kube, name)


def change(kube: Kube, body: dict[str, Any], **runtime: Any) -> None:
    body["spec"]["drafters"][0]["model"] = EAGLE_B
    body["spec"]["runtime"].update(runtime)
    kube.apply(body)


def test_drafter_change_is_promoted_through_10_50_100_with_route_weights(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    body = canary_model("promo")
    kube.apply([route("promo"), body])
    old = settle(kube, "promo")
    assert weights(kube, "promo") == (100, 0)
    change(kube, body)
    seen: list[int] = []
    steps_seen: list[int] = []
    stable_during: set[str] = set()

    def promoted() -> bool:
        status = canary_status(kube, "promo")
        stable_weight, canary_weight = weights(kube, "promo")
        if canary_weight and (not seen or seen[-1] != canary_weight):
            seen.append(canary_weight)
            assert stable_weight + canary_weight == 100
        if status and status["phase"] in ("Progressing", "Promoted") and status["weight"] and (
                not steps_seen or steps_seen[-1] != status["weight"]):
            steps_seen.append(status["weight"])
        if status and status["phase"] == "Progressing" and 0 < status["weight"] < 100:
            # While the canary shares traffic, the stable Deployment keeps serving its own revision.
            stable_during.add(stable_revision(kube, "promo"))
        return bool(status and status["phase"] == "Promoted")

    wait_for("canary promoted", promoted, 180, 1, describe=lambda: canary_status(kube, "promo"))
    # The route carries each step's replica split (2 replicas: 50% at the 10% and 50% steps), the status the step.
    assert seen == route_weights_for(body), seen
    assert steps_seen == [10, 50, 100], steps_seen
    assert stable_during == {old}, "stable must keep serving its revision until promotion"
    wait_for("canary Deployment removed and stable on the new revision",
             lambda: not kube.items("deployments", "specdec.io/track=canary,specdec.io/model=promo")
             and stable_revision(kube, "promo") != old, 90)
    wait_for("weights back to 100/0", lambda: weights(kube, "promo") == (100, 0), 30)
    other = kube.get("httproute", "promo-route")["spec"]["rules"][1]["backendRefs"]
    assert other == [{"group": "", "kind": "Service", "name": "someone-else", "port": 80, "weight": 1}]
    reasons = [e["reason"] for e in kube.events_once("promo", "CanaryPromoted")]
    for reason in ("CanaryStarted", "CanaryStepStarted", "CanaryStepPassed", "CanaryPromoted"):
        assert reason in reasons, reasons


@pytest.mark.parametrize(("stable_profile", "profile", "analysis", "reason"), [
    ("quick", "e2e-poor-drafter", {}, "accepted length"),
    ("quick", "e2e-unhealthy", {}, "/health failed"),
    # 5% of the canary's requests finish with finished_reason="error".
    # Proving 5% > 1% beyond chance (p < 0.01) takes about a hundred finished canary requests; at ~1 request/s
    # per pod under the lanes' load. A fresh-clone run rolled it back with no CanaryFailed event: most likely the
    # 90 s timeout ended the step while the excess was "not yet significant" (CanaryTimedOut).
    ("quick", "e2e-erroring", {"timeoutSeconds": 240}, "canary error rate"),
    # Every canary engine step 1.5x as long at equal acceptance; speed is gated loosely so that the
    # latency gate alone has to catch it.
    ("e2e-tpot-stable", "e2e-tpot-slow", {"minTokensPerSecondRatio": 0.5}, "TPOT p90"),
], ids=["poor-drafter", "unhealthy", "erroring", "slow-tpot"])
def test_bad_canary_is_rolled_back_with_its_numbers(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, stable_profile: str, profile: str,
    analysis: dict[str, Any], reason: str,
) -> None:
    body = canary_model("bad", pause_s=60, profile=stable_profile)
    body["spec"]["rollout"]["canary"]["analysis"].update(analysis)
    kube.apply([route("bad"), body])
    old = settle(kube, "bad")
    template = kube.get("deployment", "bad-gfx942")["spec"]["template"]
    change(kube, body, simulatorProfile=profile)
    status = wait_for("rolled back", lambda: (s := canary_status(kube, "bad")) and s["phase"] == "RolledBack" and s,
                      300, 1, describe=lambda: canary_status(kube, "bad"))
    assert reason in status["message"], status["message"]
    wait_for("weights 100/0", lambda: weights(kube, "bad") == (100, 0), 30)
    wait_for("canary Deployment deleted",
             lambda: not kube.items("deployments", "specdec.io/track=canary,specdec.io/model=bad"), 60)
    # Each step runs the step's replica split, so the stable gives up a replica while its canary serves and takes it
    # back at the rollback; its pod template (the revision it serves) is never touched.
    wait_for("stable back to its replicas", lambda: kube.get("deployment", "bad-gfx942")["spec"]["replicas"] == 2, 60)
    stable = kube.get("deployment", "bad-gfx942")
    assert stable_revision(kube, "bad") == old
    assert stable["spec"]["template"] == template, "the stable Deployment's pod template must be untouched"
    degraded = next(c for c in kube.get("sm", "bad")["status"]["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CanaryRolledBack")
    events = kube.events_once("bad", "CanaryFailed")
    failed = [e for e in events if e["reason"] == "CanaryFailed" and reason in e["message"]]
    assert failed, [f"{e['reason']}: {e['message']}" for e in events if e["reason"].startswith("Canary")]
    print(f"\n{profile}: {failed[0]['message']}")
    message = failed[0]["message"]
    if profile == "e2e-erroring":
        match = re.search(r"canary error rate ([0-9.]+)% \(([0-9]+) of ([0-9]+) requests\) > 1.00%", message)
        assert match, message
    if profile == "e2e-tpot-slow":
        # Only latency fails (failed checks lead the message); the ratio is vLLM's bucketed p90.
        checks = message.split(": ", 1)[1].split("; ")
        match = re.match(r"TPOT p90 [0-9.]+ ms vs stable [0-9.]+ ms \(ratio ([0-9.]+) > 1.15, p=", checks[0])
        assert match and 1.3 < float(match.group(1)) < 1.8, message
        # Acceptance and goodput pass: within their limits, or beyond by less than one look's noise (a passed
        # check: "within noise"). A CI run read position 3 at 0.898 of the stable's from 20 canary requests.
        assert all(">=" in check or "within noise" in check
                   for check in checks if check.startswith(("acceptance", "goodput"))), message


def test_operator_killed_mid_canary_resumes_at_the_same_step(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    """Killed (SIGKILL) in step 1, the operator goes on from the step status records: from the audit log, every
    step is recorded once, with one start, step 1's the one from before the kill; the route moves through each
    step's weight once."""
    audit = AuditLog(cluster.paths.logs / "audit.log")
    body = canary_model("durable", pause_s=45)
    kube.apply([route("durable"), body])
    settle(kube, "durable")
    change(kube, body)
    before = wait_for("step 1 running", lambda: (s := canary_status(kube, "durable")) and s["weight"] == 10 and s,
                      120, 1)
    operator.restart(signal.SIGKILL)
    wait_for("promoted after the restart", lambda: (s := canary_status(kube, "durable")) and s["phase"] == "Promoted",
             240, 2, describe=lambda: canary_status(kube, "durable"))
    entries = audit.entries(str(kube.namespace))

    def step_started(status: dict[str, Any]) -> tuple[int, str] | None:
        # A step's clock starts once its weight is in force (before, the step waits for its pods at weight 0).
        canary = status.get("canary") or {}
        running = canary.get("phase") == "Progressing" and canary.get("weight")
        return (canary["step"], canary["stepStartedAt"]) if running else None

    starts = recorded_sequence(status_writes(entries, "durable"), step_started)
    steps = [step for step, _ in starts]
    assert steps == sorted(set(steps)), f"a step recorded more than once (restarted): {starts}"
    assert (before["step"], before["stepStartedAt"]) in starts, (before, starts)
    weights_written = route_weights(entries, "durable-route", "durable-canary")
    assert [weight for weight in weights_written if weight] == route_weights_for(body), weights_written
    # Events are best effort: one posted after the status write can be lost with the process that wrote it,
    # but none is posted twice.
    events = [e for e in kube.events("durable") if e["reason"] == "CanaryStepStarted" and "step 1/3" in e["message"]]
    assert sum(e.get("count", 1) for e in events) <= 1, events


def test_tuner_k_change_goes_through_the_canary(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    body = canary_model("tunedcanary", pause_s=15, autotune=True, profile="e2e-opt-k2")
    body["spec"]["speculation"] = {"initialK": 5, "minK": 1, "maxK": 8, "autotune": {
        "intervalSeconds": 15, "minSamples": 2000, "minGain": 0.03, "cooldownSeconds": 60}}
    kube.apply([route("tunedcanary"), body])
    settle(kube, "tunedcanary")
    status = wait_for("a tuner-driven canary", lambda: (s := canary_status(kube, "tunedcanary")) and s, 180, 1)
    assert status["canaryK"] is not None and status["canaryK"] != 5
    wait_for("the K change promoted", lambda: (s := canary_status(kube, "tunedcanary")) and s["phase"] == "Promoted",
             240, 2, describe=lambda: canary_status(kube, "tunedcanary"))
    pools = kube.get("sm", "tunedcanary")["status"]["pools"]
    assert pools[0]["effectiveK"] == status["canaryK"]


def test_failover_mid_step_with_little_traffic_ends_the_step_on_evidence(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    """One client per pod: step 1 needs about 40 s of drafts. The operator is killed six passes (about 30 s)
    into the step, so its successor cannot finish the window inside the step's original 60 s timeout."""
    body = canary_model("failover", pause_s=20, profile="e2e-low-traffic")
    body["spec"]["rollout"]["canary"]["steps"] = [{"weight": 10, "pauseSeconds": 20},
                                                  {"weight": 100, "pauseSeconds": 5}]
    # TPOT p90 from one client's few requests sits on a bucket edge; this test is about the clock. ~25 requests a
    # step cannot bound a 1% error rate or know a p99: past its timeout the clean step holds as a quiet model's
    # (InsufficientTraffic) and goes on to the 100% step on its clean window after
    # insufficientTraffic.maxWaitSeconds (CanaryStepUndecided), which is promoted on its own window.
    body["spec"]["rollout"]["canary"]["analysis"].update({"minDrafts": 1500, "minRequests": 10, "timeoutSeconds": 60,
                                                          "maxTpotRatio": 3})
    body["spec"]["rollout"]["canary"]["insufficientTraffic"] = {"maxWaitSeconds": 90}
    kube.apply([route("failover"), body])
    settle(kube, "failover")
    change(kube, body)
    running = wait_for("step 1 running",
                       lambda: (s := canary_status(kube, "failover")) and s["weight"] == 10 and s, 120, 1)
    started = datetime.fromisoformat(running["stepStartedAt"].replace("Z", "+00:00"))
    # Six passes of the model into the step (about 30 s at the 5 s interval, fewer if events add passes): the
    # predecessor has judged the window over and over, well short of the ~40 s of drafts it needs.
    operator.wait_passes(str(kube.namespace), "failover", 6)
    mid = canary_status(kube, "failover")
    assert mid is not None and (mid["step"], mid["phase"], mid["verdict"]) == (0, "Progressing", "Inconclusive"), mid
    killed_at = datetime.now(UTC)
    operator.restart(signal.SIGKILL)
    print(f"\nkilled {(killed_at - started).total_seconds():.0f} s into step 1, successor serving after "
          f"{(datetime.now(UTC) - killed_at).total_seconds():.0f} s")

    def step_1_ended() -> list[dict[str, Any]]:
        return [e for e in kube.events("failover") if e["reason"] in ("CanaryStepPassed", "CanaryStepUndecided",
                                                                      "CanaryFailed", "CanaryTimedOut",
                                                                      "CanaryPromoted")]

    ended = wait_for("step 1 ended", step_1_ended, 150, 1, describe=lambda: canary_status(kube, "failover"))
    reasons = [e["reason"] for e in kube.events("failover")]
    assert "CanaryTimedOut" not in reasons, [e["message"] for e in ended]
    assert ended[0]["reason"] in ("CanaryStepPassed", "CanaryStepUndecided", "CanaryFailed"), ended[0]["message"]
    restarted = [e for e in kube.events("failover") if e["reason"] == "CanaryEvidenceRestarted"]
    assert len(restarted) == 1, reasons
    after = canary_status(kube, "failover")
    assert after is not None
    print(f"{restarted[0]['message']}\nstep 1 ended "
          f"{(datetime.now(UTC) - started).total_seconds():.0f} s after it started: {ended[0]['message']}")
    if ended[0]["reason"] in ("CanaryStepPassed", "CanaryStepUndecided"):
        # The 100% step judges its own window: passed, or held as quiet up to maxWaitSeconds.
        wait_for("promoted", lambda: (s := canary_status(kube, "failover")) and s["phase"] == "Promoted", 180, 1,
                 describe=lambda: canary_status(kube, "failover"))
