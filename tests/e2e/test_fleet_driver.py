"""The fleet driver serves vLLM-compatible metrics on every runtime pod's loopback IP, with the pod's own K."""

from __future__ import annotations

import ipaddress
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess

pytestmark = pytest.mark.e2e

DRAFTS = "vllm:spec_decode_num_drafts"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

SERVED = "Qwen/Qwen2.5-Coder-7B-Instruct"


def scrape(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's own simulator's figures, or None (not serving yet, or its IP still answers for the
    pod that had it before: kwok reuses IPs, and the old simulator stops a moment later)."""
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip).is_loopback, ip  # never dial anything but loopback
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    families = {f.name: f for f in text_string_to_metric_families(text)}
    if DRAFTS not in families:
        return None
    # vLLM labels its series with the served name, which defaults to spec.model.name (the hub id).
    if {s.labels.get("model_name") for s in families[DRAFTS].samples} != {SERVED}:
        return None
    positions = {s.labels["position"] for s in families[PER_POS].samples if s.name.endswith("_total")}
    drafts = next(s.value for s in families[DRAFTS].samples if s.name.endswith("_total"))
    return {"positions": positions, "drafts": drafts}


def model(name: str, k: int) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": SERVED},
            "drafters": [{"method": "ngram"}],
            "speculation": {"initialK": k, "minK": 0, "maxK": 8, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx1100"], "replicasPerPool": 2},
            "runtime": {"simulatorProfile": "quick"},
        },
    }


def test_every_runtime_pod_serves_its_own_k_and_restarts_reset_counters(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    kube.apply(model("served", k=3))
    pods = wait_for("2 Running pods", lambda: (p := [x for x in kube.items("pods", "specdec.io/model=served")
                                                    if x["status"].get("podIP")]) and len(p) == 2 and p, 60)
    for pod in pods:
        metrics = wait_for(f"metrics on {pod['status']['podIP']}", lambda p=pod: scrape(p), 60)
        assert metrics["positions"] == {"0", "1", "2"}
    victim = pods[0]
    # Far more than a fresh simulator counts in the seconds before its first scrape.
    before = wait_for("drafts counted", lambda: (m := scrape(victim)) and m["drafts"] > 10000 and m, 120)
    kube.run("delete", "pod", victim["metadata"]["name"], "--wait=true")

    def replacement() -> dict[str, Any] | None:
        fresh = [p for p in kube.items("pods", "specdec.io/model=served")
                 if p["metadata"]["uid"] != victim["metadata"]["uid"] and p["status"].get("podIP")
                 and p["metadata"]["name"] not in {x["metadata"]["name"] for x in pods}]
        return fresh[0] if fresh else None

    new_pod = wait_for("a replacement pod", replacement, 60)
    # A new process whose counters restarted from zero. Until the driver has swapped processes, the
    # IP (kwok may hand the replacement its predecessor's) can still answer with the old counters.
    after = wait_for("the replacement's counters restarted",
                     lambda: (m := scrape(new_pod)) and m["drafts"] < before["drafts"] and m, 60)
    assert after["positions"] == {"0", "1", "2"}
    # The old pod's simulator is gone with it (unless its IP was handed to the replacement).
    if victim["status"]["podIP"] != new_pod["status"]["podIP"]:
        # An upper bound: the old simulator drains what it has in flight first, slower beside four busy lanes.
        wait_for("old simulator stopped", lambda: scrape(victim) is None, 90)


def test_k_change_reaches_the_simulator(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess
) -> None:
    body = model("rekeyed", k=2)
    kube.apply(body)
    wait_for("K=2 served", lambda: any((m := scrape(p)) and m["positions"] == {"0", "1"}
                                       for p in kube.items("pods", "specdec.io/model=rekeyed")
                                       if p["status"].get("podIP")), 60)
    body["spec"]["speculation"]["initialK"] = 5
    body["spec"]["speculation"]["minK"] = 5
    kube.apply(body)

    def all_at_five() -> bool:
        pods = [p for p in kube.items("pods", "specdec.io/model=rekeyed")
                if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")]
        served = [scrape(p) for p in pods]
        return len(pods) == 2 and all(m and m["positions"] == {"0", "1", "2", "3", "4"} for m in served)

    wait_for("every pod serving K=5", all_at_five, 90)
