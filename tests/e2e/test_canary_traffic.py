"""Canaries judged on real traffic: open-loop requests through the Gateway stand-in, by the HTTPRoute's weights.

The simulators here have no virtual load (profiles e2e-traffic*.yaml): every request they serve, every counter
the canary analysis reads, comes from the load generator below, sent to the loopback Gateway stand-in
(`specdec-runtime gateway`, see docs/local-traffic.md), which routes it by the route's weights to a Service and
then to one of that Service's ready pods. The share of requests each revision's pods received is read from the
simulators' own request counters, per canary step.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from localcluster.cluster import LocalCluster
from specdec_runtime.loadgen import Lengths, LoadReport, LoadShape, run_load
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess, free_port

pytestmark = pytest.mark.e2e

EAGLE_A = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE_B = "example-org/EAGLE3-LLaMA3.1-Instruct-8B-v2"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
# examples/canary-httproute.yaml's steps and thresholds; only the pauses are short (the example's 300 s would
# keep a step's window for five minutes) and minDrafts scaled to what a short step can collect.
STEP_WEIGHTS = (10, 50, 100)
PAUSE_S = 20
ANALYSIS = {"minAcceptedLengthRatio": 0.9, "maxTpotRatio": 1.15, "maxErrorRate": 0.01, "minDrafts": 200,
            "timeoutSeconds": 120}
RATE = 12.0  # requests per second per model, open loop
# A step's share is counted from counters read when the route's weight moves; requests in flight across that
# moment (about RATE x latency, ~12 of a step's ~240) and the poll's lag blur it by a few percent.
SHARE_TOLERANCE = 0.06


class GatewayStandIn:
    """`specdec-runtime gateway` on a free loopback port, registered with hack/cluster for cleanup."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pid_file = cluster.paths.pids / "gateway-standin.pid"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> GatewayStandIn:
        command = [str(Path(sys.executable).parent / "specdec-runtime"), "gateway", "--kubeconfig",
                   str(self.cluster.paths.kubeconfig), "--listen", f"127.0.0.1:{self.port}"]
        with (self.cluster.paths.logs / "gateway-standin.log").open("ab") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid_file.write_text(str(self.process.pid))
        wait_for("gateway stand-in listening", self._answers, 30)
        return self

    def _answers(self) -> bool:
        assert self.process is not None and self.process.poll() is None, "gateway stand-in exited"
        try:
            urllib.request.urlopen(f"{self.url}/nothing", timeout=1)
        except urllib.error.HTTPError:
            return True  # 404: no route matches, as a Gateway answers
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)
        self.pid_file.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def gateway(cluster: LocalCluster) -> Iterator[GatewayStandIn]:
    standin = GatewayStandIn(cluster).start()
    yield standin
    standin.stop()


class BackgroundLoad:
    """Open-loop load for one model's hostname until stopped, on its own event loop thread."""

    def __init__(self, url: str, host: str, seed: int, model: str) -> None:
        self.shape = LoadShape(rate=RATE, prompt=Lengths(64, 0.5, high=512), output=Lengths(24, 0.4, high=96),
                               stream=False, seed=seed)
        # The operator serves a model under its SpeculativeModel name (spec.model.servedName unset).
        self.url, self.host, self.model = url, host, model
        self.report: LoadReport | None = None
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self.report = self._loop.run_until_complete(run_load(self.url, self.model, self.shape, host=self.host,
                                                             stop=self._stop))

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(120)


# Thresholds no revision of these profiles can miss: the share test must walk every step whatever the analysis.
PERMISSIVE = {"minAcceptedLengthRatio": 0, "minTokensPerSecondRatio": 0, "maxTpotRatio": 10, "maxErrorRate": 1,
              "minDrafts": 0, "timeoutSeconds": 120}


def model(name: str, replicas: int, profile: str = "e2e-traffic",
          analysis: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": SERVED},
            "drafters": [{"method": "eagle3", "model": EAGLE_A}],
            "speculation": {"initialK": 3, "minK": 1, "maxK": 8},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": replicas},
            "runtime": {"simulatorProfile": profile},
            "rollout": {"strategy": "Canary", "canary": {
                "steps": [{"weight": w, "pauseSeconds": PAUSE_S if w < 100 else 0} for w in STEP_WEIGHTS],
                "analysis": analysis or ANALYSIS,
                "traffic": {"httpRouteRef": {"name": name}},
            }},
        },
    }


def http_route(name: str, backend_namespace: str | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": f"{name}-stable", "port": 8000, "weight": 100}
    if backend_namespace:
        ref["namespace"] = backend_namespace
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name},
            "spec": {"parentRefs": [{"name": "inference-gateway"}], "hostnames": [hostname(name)],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}], "backendRefs": [ref]}]}}


def hostname(name: str) -> str:
    return f"{name}.models.test"


def canary_weight(kube: Kube, name: str, route: dict[str, Any] | None = None) -> int:
    refs = (route or kube.get("httproute", name))["spec"]["rules"][0]["backendRefs"]
    by_name = {ref["name"]: int(ref.get("weight", 1)) for ref in refs}
    stable, canary = by_name.get(f"{name}-stable", 0), by_name.get(f"{name}-canary", 0)
    return round(100 * canary / (stable + canary)) if stable + canary else 0


def ready(kube: Kube, name: str) -> bool:
    conditions = (kube.get("sm", name) or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def served_by_revision(kube: Kube, name: str) -> dict[str, float]:
    """Completions each revision's pods answered, from the simulators' own http_requests_total."""
    counts: dict[str, float] = {}
    for pod in kube.items("pods", f"specdec.io/model={name}"):
        ip = pod["status"].get("podIP")
        if not ip or pod["metadata"].get("deletionTimestamp"):
            continue
        try:
            with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            continue  # not serving yet or gone: it answered nothing we could count
        revision = pod["metadata"]["labels"]["specdec.io/revision"]
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "http_requests_total" and sample.labels.get("handler") == "/v1/completions":
                    counts[revision] = counts.get(revision, 0.0) + sample.value
    return counts


def revisions(kube: Kube, name: str) -> tuple[str, str] | None:
    canary = (kube.get("sm", name) or {}).get("status", {}).get("canary") or {}
    if canary.get("stableRevision") and canary.get("canaryRevision"):
        return str(canary["stableRevision"]), str(canary["canaryRevision"])
    return None


@dataclass
class StepShares:
    """Per canary weight: requests the canary revision's pods and the stable revision's pods answered."""

    name: str
    weight: int = 0
    at_change: dict[str, float] = field(default_factory=dict)
    shares: dict[int, tuple[float, float]] = field(default_factory=dict)  # weight -> (canary, total)
    pair: tuple[str, str] | None = None

    def observe(self, kube: Kube, route: dict[str, Any]) -> None:
        """Called while waiting: when the route's weight has moved, close the previous step's window."""
        weight = canary_weight(kube, self.name, route)
        if weight == self.weight:
            return
        self.pair = self.pair or revisions(kube, self.name)
        counts = served_by_revision(kube, self.name)
        if self.pair is not None and self.at_change and self.weight > 0:
            stable, canary = self.pair
            got_canary = counts.get(canary, 0.0) - self.at_change.get(canary, 0.0)
            got_stable = counts.get(stable, 0.0) - self.at_change.get(stable, 0.0)
            self.shares[self.weight] = (got_canary, got_canary + got_stable)
        self.weight, self.at_change = weight, counts


def phase(kube: Kube, name: str) -> str | None:
    canary = (kube.get("sm", name) or {}).get("status", {}).get("canary")
    return canary.get("phase") if canary else None


def change_drafter(kube: Kube, body: dict[str, Any], profile: str | None = None) -> None:
    body["spec"]["drafters"][0]["model"] = EAGLE_B
    if profile is not None:
        body["spec"]["runtime"]["simulatorProfile"] = profile
    kube.apply(body)


def rollback_event(kube: Kube, name: str) -> str:
    messages = [e["message"] for e in kube.events(name) if e["reason"] in ("CanaryFailed", "CanaryTimedOut")]
    return " | ".join(messages)


def run_canaries(kube: Kube, gateway: GatewayStandIn, pools: dict[str, int],
                 analysis: dict[str, Any] | None) -> tuple[dict[str, StepShares], list[BackgroundLoad]]:
    """Models of the given sizes behind their routes, open-loop load on each, a drafter change each; returns when
    every canary is decided, with the requests each revision answered per step."""
    bodies = {name: model(name, replicas, analysis=analysis) for name, replicas in pools.items()}
    kube.apply([http_route(name) for name in pools] + list(bodies.values()))
    wait_for("every model Ready", lambda: all(ready(kube, n) for n in pools), 120)
    steps = {name: StepShares(name) for name in pools}
    loads = [BackgroundLoad(gateway.url, hostname(name), seed, name) for seed, name in enumerate(pools)]
    for load in loads:
        load.__enter__()
    try:
        # The route's whole weight goes to the stable Service before the canary starts.
        wait_for("traffic on each model's stable revision",
                 lambda: all(sum(served_by_revision(kube, n).values()) > 0 for n in pools), 60)
        for name in pools:
            change_drafter(kube, bodies[name])

        def all_done() -> bool:
            # One LIST per kind and round, so a weight change is seen within about a second.
            routes = {r["metadata"]["name"]: r for r in kube.items("httproutes")}
            for name, share in steps.items():
                share.observe(kube, routes[name])
            phases = {m["metadata"]["name"]: (m.get("status", {}).get("canary") or {}).get("phase")
                      for m in kube.items("sm")}
            return all(phases.get(n) in ("Promoted", "RolledBack", "Aborted") for n in pools)

        wait_for("every canary decided", all_done, 8 * PAUSE_S + 240, 0.5,
                 describe=lambda: {n: (phase(kube, n), steps[n].weight) for n in pools})
    finally:
        for load in loads:
            load.__exit__()
    return steps, loads


def test_each_revision_receives_the_route_weight_at_every_step_on_1_2_4_replicas(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn
) -> None:
    pools = {f"share{replicas}": replicas for replicas in (1, 2, 4)}
    steps, loads = run_canaries(kube, gateway, pools, PERMISSIVE)
    outcomes = {n: ((kube.get("sm", n).get("status", {}).get("canary") or {}).get("message"), rollback_event(kube, n))
                for n in pools}
    failures = []
    for name, share in steps.items():
        for weight in STEP_WEIGHTS[:-1]:  # the 100% step has no pause to measure
            canary, total = share.shares.get(weight, (0.0, 0.0))
            assert total >= 50, (f"{name}: only {total:.0f} requests measured at {weight}% ({share.shares}); "
                                 f"canaries: {outcomes}")
            if abs(canary / total - weight / 100) > SHARE_TOLERANCE:
                failures.append(f"{name} at {weight}%: canary pods answered {canary:.0f} of {total:.0f} "
                                f"({canary / total:.1%})")
    assert not failures, failures
    for load in loads:
        assert load.report is not None and load.report.sent > 0
        statuses = load.report.statuses
        # The stand-in answers 5xx itself only when no pod is ready; these simulators never fail a request.
        assert statuses.get(200, 0) >= 0.99 * load.report.sent, statuses


def test_healthy_canaries_with_the_examples_analysis_promote_on_1_2_4_replicas(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn
) -> None:
    pools = {f"pool{replicas}": replicas for replicas in (1, 2, 4)}
    run_canaries(kube, gateway, pools, None)
    verdicts = {name: phase(kube, name) for name in pools}
    assert verdicts == dict.fromkeys(pools, "Promoted"), {n: rollback_event(kube, n) for n in pools}


@pytest.mark.parametrize(("profile", "cited"), [
    ("e2e-traffic-tpot-slow", "TPOT"),
    ("e2e-traffic-erroring", "error rate"),
])
def test_a_bad_canary_under_real_traffic_is_rolled_back_citing_its_metric(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn,
    profile: str, cited: str,
) -> None:
    name = "bad"
    body = model(name, 2)
    kube.apply([http_route(name), body])
    wait_for(f"{name} Ready", lambda: ready(kube, name), 120)
    with BackgroundLoad(gateway.url, hostname(name), seed=7, model=name):
        change_drafter(kube, body, profile)
        wait_for("canary decided", lambda: phase(kube, name) in ("Promoted", "RolledBack", "Aborted"),
                 4 * PAUSE_S + 240, describe=lambda: (phase(kube, name), canary_weight(kube, name)))
    assert phase(kube, name) == "RolledBack", (phase(kube, name), rollback_event(kube, name))
    message = rollback_event(kube, name)
    assert cited.lower() in message.lower(), message
    assert any(ch.isdigit() for ch in message), f"the event must carry the numbers: {message}"


def test_a_route_the_gateway_cannot_resolve_is_a_condition_with_the_gateways_message(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn,
) -> None:
    """A backendRef to a Service in another namespace without a ReferenceGrant: the Gateway's ResolvedRefs=False
    (RefNotPermitted) becomes the model's Degraded condition within one reconcile of the status appearing."""
    name = "crossns"
    kube.apply([http_route(name, backend_namespace="somewhere-else"), model(name, 1)])

    def degraded() -> dict[str, Any] | None:
        conditions = (kube.get("sm", name) or {}).get("status", {}).get("conditions", [])
        found = next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"
                      and c["reason"].startswith("HTTPRoute")), None)
        return found

    condition = wait_for("Degraded with the Gateway's message", degraded, 60,
                         describe=lambda: (kube.get("httproute", name) or {}).get("status"))
    route_status = kube.get("httproute", name)["status"]["parents"][0]
    refused = next(c for c in route_status["conditions"] if c["type"] == "ResolvedRefs")
    assert refused["status"] == "False" and refused["reason"] == "RefNotPermitted"
    assert condition["reason"] == "HTTPRouteRefsNotResolved"
    assert refused["message"] in condition["message"]
