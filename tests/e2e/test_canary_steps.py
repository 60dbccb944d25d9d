"""Canary steps under routed load (issue 31): equal load per pod by construction, so a healthy change promotes
while the offered load moves; requests go through the Gateway stand-in, by the HTTPRoute's weights, as in
production (docs/local-traffic.md)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from specdec_runtime import contract
from tests.e2e.canary_recording import RECORD_PERIOD_S, CanaryRecorder, assert_replay_agrees
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import test_nodes  # noqa: F401 - fixture
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.test_canary_traffic import (  # noqa: F401 - fixtures
    ANALYSIS,
    PAUSE_S,
    SERVED,
    STEP_TIMEOUT_S,
    TUNED_FROM_K,
    TUNER,
    canary_story,
    gateway,
    gateway_standin,
    hostname,
    http_route,
    model,
    own_nodes,
    phase,
    ready,
    rollback_event,
    rolled_out_reason,
)
from tests.e2e.traffic import RATE, BackgroundLoad, GatewayStandIn

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.xdist_group("test_canary_traffic")]

DONE = ("Promoted", "RolledBack", "Aborted")
ANALYSED_PAUSE_S = 60


def canary(kube: Kube, name: str) -> dict[str, Any]:
    return (kube.get("sm", name) or {}).get("status", {}).get("canary") or {}


# Its own waits (Ready, then the 50% step, then the verdict, each with its budget) add up to more than the
# suite's 600 s per test: without this, a slow run is cut off before `wait_for` can print the canary's story.
@pytest.mark.timeout(180 + 2 * (STEP_TIMEOUT_S * 2 + 4 * PAUSE_S) + 60)
def test_a_healthy_k_change_on_8_replicas_promotes_while_the_offered_load_doubles_mid_step(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The tuner's K change on a pool of 8 replicas behind the example's route: when the canary's 50% step starts,
    a second open-loop load of the same rate joins the first (a morning ramp inside a step). Both sides' pods see
    the same offered load per pod at every step, so the doubling moves both alike and the change promotes."""
    name = "ramp8"
    body = model(name, 8, str(kube.namespace), analysis=ANALYSIS)
    body["spec"]["speculation"]["autotune"] = TUNER
    body["spec"]["speculation"]["initialK"] = TUNED_FROM_K
    kube.apply([http_route(name), body])
    wait_for(f"{name} Ready", lambda: ready(kube, name), 180)
    recorder = CanaryRecorder(kube, name, RECORD_PERIOD_S, route=name)
    with BackgroundLoad(gateway.url, hostname(name), seed=11, model=SERVED, rate=RATE), recorder:
        wait_for("the 50% step started", lambda: canary(kube, name).get("weight") == 50
                 or canary(kube, name).get("phase") in DONE, STEP_TIMEOUT_S * 2 + 4 * PAUSE_S, 0.5,
                 describe=lambda: canary_story(kube, name))
        doubled_at = canary(kube, name)
        assert doubled_at.get("phase") == "Progressing", (doubled_at, rollback_event(kube, name))
        with BackgroundLoad(gateway.url, hostname(name), seed=12, model=SERVED, rate=RATE):
            wait_for("canary decided", lambda: canary(kube, name).get("phase") in DONE,
                     STEP_TIMEOUT_S * 2 + 4 * PAUSE_S, 0.5, describe=lambda: canary_story(kube, name))
            wait_for("the recorder's rounds after the outcome", lambda: recorder.done or recorder.error, 60)
    final = canary(kube, name)
    assert final.get("phase") == "Promoted", (final, rollback_event(kube, name))
    events = kube.events_once(name, "CanaryPromoted", rolled_out_reason(kube, name))
    passed = [e["message"] for e in events if e["reason"] == "CanaryStepPassed"]
    promoted = [e["message"] for e in events if e["reason"] == "CanaryPromoted"]
    print(f"{name}: {passed} {promoted}")  # shown with -rA: the numbers the promotion rests on
    assert len(passed) == 2 and promoted, (passed, promoted)
    assert_replay_agrees(recorder, body, kube.get("sm", name)["status"], tmp_path / f"{name}.jsonl", __name__)


def serving(pod: dict[str, Any]) -> bool:
    """Ready, with an IP, and not on its way out: a pod the Gateway stand-in routes requests to."""
    conditions = pod["status"].get("conditions") or []
    return (bool(pod["status"].get("podIP")) and not pod["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions))


def fail_requests(ip: str, rate: float) -> None:
    """Tell one simulator (a fake pod on its loopback IP) to fail this share of its requests from now on."""
    request = urllib.request.Request(f"http://{ip}:8000/faults", data=json.dumps({"error_rate": rate}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def test_a_canary_that_starts_failing_at_the_100_percent_step_rolls_back_citing_the_error_rate(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A drafter change that serves well at 10% and 50%, and at first at 100%; two scrape rounds into the 100% step
    its pods begin to fail half their requests. The 100% step has its own window (no pass on an empty one), judged
    on errors without a baseline, and errors that begin after clean intervals are not diluted by them: the canary
    rolls back, and the rollback cites the error rate. The onset lies inside the step's window, not at its edge,
    so the replay (whose rounds fall between the operator's scrapes) must find it there too."""
    name = "late"
    body = model(name, 2, str(kube.namespace))
    # Each analysed step pauses until its pods have the ~300 clean requests a step needs to pass (the error rate's
    # 95% bound under 1%, at 6 requests/s a pod): the step then ends at its pause, in the operator and in the replay
    # alike. Ended by the requests instead, the two count them from scrapes taken at other moments, and a replay
    # that started the 100% step 40 s earlier passed it on clean requests the operator never judged there.
    for step in body["spec"]["rollout"]["canary"]["steps"]:
        if step["weight"] < 100:
            step["pauseSeconds"] = ANALYSED_PAUSE_S
    kube.apply([http_route(name), body])
    wait_for(f"{name} Ready", lambda: ready(kube, name), 120)
    recorder = CanaryRecorder(kube, name, RECORD_PERIOD_S, route=name)
    with BackgroundLoad(gateway.url, hostname(name), seed=21, model=SERVED), recorder:
        body["spec"]["drafters"] = [{"method": "eagle3", "model": "example-org/EAGLE3-LLaMA3.1-Instruct-8B-v2"}]
        kube.apply(body)
        wait_for("the 100% step started", lambda: canary(kube, name).get("weight") == 100
                 or canary(kube, name).get("phase") in DONE, STEP_TIMEOUT_S * 2 + 4 * ANALYSED_PAUSE_S, 0.5,
                 describe=lambda: canary_story(kube, name))
        assert canary(kube, name).get("phase") == "Progressing", (canary(kube, name), rollback_event(kube, name))
        revision = canary(kube, name)["canaryRevision"]

        def canary_pods() -> list[dict[str, Any]]:
            return [p for p in kube.items("pods", f"{contract.LABEL_TRACK}=canary")
                    if p["metadata"]["labels"].get(contract.LABEL_MODEL) == name
                    and p["metadata"]["labels"].get(contract.LABEL_REVISION) == revision and serving(p)]

        # The whole revision fails, every replica the 100% step gives it, after two rounds of clean service (the
        # step cannot pass this soon: its error rate's upper bound needs some 300 clean requests).
        wait_for("every canary replica serving, and two recorded rounds at 100%",
                 lambda: (len(canary_pods()) >= 2 and recorder.rounds_at(100) >= 2) or recorder.error is not None,
                 STEP_TIMEOUT_S, 0.5, describe=lambda: canary_story(kube, name))
        assert canary(kube, name).get("phase") == "Progressing", (canary(kube, name), rollback_event(kube, name))
        pods = canary_pods()
        for pod in pods:
            fail_requests(pod["status"]["podIP"], 0.5)
        wait_for("canary decided", lambda: canary(kube, name).get("phase") in DONE, STEP_TIMEOUT_S + 60, 0.5,
                 describe=lambda: canary_story(kube, name))
        wait_for("the recorder's rounds after the outcome", lambda: recorder.done or recorder.error, 60)
    assert canary(kube, name).get("phase") == "RolledBack", (canary(kube, name), rollback_event(kube, name))
    message = rollback_event(kube, name)
    assert "error rate" in message.lower() and "step 3/3 (100%)" in message, message
    print(f"{name}: {message}")  # shown with -rA
    assert_replay_agrees(recorder, body, kube.get("sm", name)["status"], tmp_path / f"{name}.jsonl", __name__)
