"""Canaries judged on real traffic: open-loop requests through the Gateway stand-in, by the HTTPRoute's weights.

The simulators here have no virtual load (profiles e2e-traffic*.yaml): every request they serve, every counter
the canary analysis reads, comes from the load generator below, sent to the loopback Gateway stand-in
(`specdec-runtime gateway`, see docs/local-traffic.md), which routes it by the route's weights to a Service and
then to one of that Service's ready pods. The share of requests each revision's pods received is read from the
simulators' own request counters, per canary step.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from localcluster.cluster import LocalCluster
from specdec_operator.canary.plan import equal_load_percent
from specdec_runtime import contract
from specdec_runtime.routing import STANDIN_GATEWAY_CLASS
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import FLEET_LABEL, test_nodes, toleration_for_test_nodes  # noqa: F401 - fixture
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.traffic import BackgroundLoad, GatewayStandIn

# One lane for the whole file: its module fixture runs one Gateway stand-in for every test here.
pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.xdist_group("test_canary_traffic")]

EAGLE_A = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE_B = "example-org/EAGLE3-LLaMA3.1-Instruct-8B-v2"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
# examples/canary-httproute.yaml's steps and thresholds; only the pauses are short (the example's 300 s would
# keep a step's window for five minutes), and minRequests/minDrafts scaled to what a short step can collect.
STEP_WEIGHTS = (10, 50, 100)
# How long a step may wait for its finished requests. In e2e lanes the machine's two cores are shared with three
# other lanes, and a slowed canary (1.5x TPOT) finishes its 40 requests at 10% of the load in well over 120 s.
STEP_TIMEOUT_S = 300
PAUSE_S = 20
ANALYSIS = {"minAcceptedLengthRatio": 0.9, "maxTpotRatio": 1.15, "maxErrorRate": 0.01, "minRequests": 40,
            "minDrafts": 200, "timeoutSeconds": STEP_TIMEOUT_S}
# The tuner in the K-change test: decisions every 5 s from 500 drafts (the concurrency-0 profiles draft only for
# routed requests), one change per model (the cooldown outlasts the test). The models start at K=1, where the
# profile's drafter (acceptance 0.8, 0.72, 0.65, ...) leaves a real gain: K=2 serves about 28% more tokens per
# step-second. From K=3, near the profile's best, the tuner can only explore moves worth a few percent either way,
# and the canary rightly rolls back the ones that lose (a rolled-back exploration is not a healthy change).
TUNER = {"intervalSeconds": 5, "minSamples": 500, "cooldownSeconds": 3600}
TUNED_FROM_K = 1
# Each step's share is counted inside the weight's time (see ShareMeter), and the Gateway's smooth weighted round
# robin keeps any window within one request of the weights; what is left is the few requests between the Gateway
# and a pod while a round scrapes, and those a pod refuses while its model loads.
SHARE_TOLERANCE = 0.06


@pytest.fixture(scope="module")
def gateway_standin(cluster: LocalCluster) -> Iterator[GatewayStandIn]:
    standin = GatewayStandIn(cluster).start()
    yield standin
    standin.stop()


@pytest.fixture
def gateway(kube: Kube, gateway_standin: GatewayStandIn) -> GatewayStandIn:
    """The test's own Gateway `inference-gateway`, of the stand-in's class: as a Gateway controller, the stand-in
    serves (and reports on) only the routes attached to Gateways of its class that exist."""
    kube.apply({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "inference-gateway"},
                "spec": {"gatewayClassName": STANDIN_GATEWAY_CLASS,
                         "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}})
    return gateway_standin


@pytest.fixture(autouse=True)
def own_nodes(test_nodes: Callable[[str, int], list[dict[str, Any]]]) -> None:  # noqa: F811
    """Two MI300X nodes (16 GPUs) for each test's models alone. Pools of 1, 2 and 4 replicas and their canaries
    take up to 14 GPUs, more than the demo fleet's gfx942 nodes can spare while other lanes place there."""
    test_nodes("traffic", 2)


def model(name: str, replicas: int, namespace: str, profile: str = "e2e-traffic",
          analysis: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": SERVED},
            "drafters": [{"method": "eagle3", "model": EAGLE_A}],
            # Autotune off unless a test turns it on: with it, the tuner may explore K=2 from K=3 under this load
            # and that K change would ride in the canary of the change a test sends (K=2 is slower per token here,
            # so its TPOT rollback is right, but not the verdict on that change; a fresh-clone run saw exactly that).
            "speculation": {"initialK": 3, "minK": 1, "maxK": 8, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": replicas,
                          "nodeSelector": {FLEET_LABEL: namespace},
                          "tolerations": [toleration_for_test_nodes(namespace)]},
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


def canary_weight(route: dict[str, Any]) -> int:
    name = route["metadata"]["name"]
    by_name = {ref["name"]: int(ref.get("weight", 1)) for ref in route["spec"]["rules"][0]["backendRefs"]}
    stable, canary = by_name.get(f"{name}-stable", 0), by_name.get(f"{name}-canary", 0)
    return round(100 * canary / (stable + canary)) if stable + canary else 0


def ready(kube: Kube, name: str) -> bool:
    conditions = (kube.get("sm", name) or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def arrivals(ip: str) -> float | None:
    """Requests this pod has taken in so far: those it answered (http_requests_total on the completions handler)
    plus those in its batch or queue now (vllm:num_requests_running, vllm:num_requests_waiting). Counting
    arrivals, not answers, puts each request in the window in which the Gateway routed it, however long it runs.
    0 when nothing answers yet (a pod that is not serving has taken nothing); None when the scrape failed."""
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5) as response:
            text = response.read().decode()
    except urllib.error.HTTPError:
        return 0.0  # 503 while the model loads: it serves nothing yet
    except urllib.error.URLError as err:
        return 0.0 if isinstance(err.reason, ConnectionRefusedError) else None
    except OSError:
        return None
    taken = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            answered = sample.name == "http_requests_total" and sample.labels.get("handler") == "/v1/completions"
            if answered or sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                taken += sample.value
    return taken


@dataclass(frozen=True)
class RouteState:
    generation: int
    weight: int  # the canary's share of the route, in percent
    acked: bool  # the Gateway's status reports this generation: it routes by these weights


def route_state(route: dict[str, Any]) -> RouteState:
    generation = int(route["metadata"]["generation"])
    observed = [c.get("observedGeneration") for parent in (route.get("status") or {}).get("parents") or []
                for c in parent.get("conditions") or [] if c.get("type") == "Accepted"]
    return RouteState(generation, canary_weight(route), generation in observed)


@dataclass(frozen=True)
class Snapshot:
    """One round: the routes as read before the pods were scraped, and every pod's arrivals (pod uid -> (model,
    revision, arrivals)). `unanswered` names the models with a pod that did not answer the scrape (a pod still
    starting, or going): the round counts for no window of theirs, and still counts for the other models."""

    routes: dict[str, RouteState]
    taken: dict[str, tuple[str, str, float]]
    unanswered: frozenset[str] = frozenset()

    def complete_for(self, model: str) -> bool:
        return model not in self.unanswered


class ShareMeter:
    """Requests each revision's pods took while a route weight was in force, counted between snapshots that are
    certainly inside that weight's time: the route read before the scrape shows the weight and the Gateway's
    acknowledgement of it, and the read after the scrape (the next round's) still shows the same generation.
    No request routed under a neighbouring weight can fall in such a window, however slowly the rounds go."""

    def __init__(self, models: list[str]) -> None:
        self.models = models
        self.snapshots: list[Snapshot] = []
        self.pairs: dict[str, tuple[str, str]] = {}  # model -> (stable, canary) revision
        self.phases: dict[str, str | None] = {}
        self._scraper = ThreadPoolExecutor(max_workers=8)

    def close(self) -> None:
        self._scraper.shutdown()

    def round(self, kube: Kube) -> None:
        """One LIST of routes, pods and models (reads happen in that order, each consistent), then every pod's
        /metrics."""
        listed = kube.items("httproutes,pods,speculativemodels")
        routes = {o["metadata"]["name"]: route_state(o) for o in listed if o["kind"] == "HTTPRoute"}
        pods = [o for o in listed if o["kind"] == "Pod"
                and o["metadata"].get("labels", {}).get("specdec.io/model") in self.models
                and o["status"].get("podIP") and not o["metadata"].get("deletionTimestamp")]
        for obj in listed:
            if obj["kind"] != "SpeculativeModel" or obj["metadata"]["name"] not in self.models:
                continue
            canary = obj.get("status", {}).get("canary") or {}
            self.phases[obj["metadata"]["name"]] = canary.get("phase")
            if canary.get("stableRevision") and canary.get("canaryRevision"):
                self.pairs.setdefault(obj["metadata"]["name"],
                                      (str(canary["stableRevision"]), str(canary["canaryRevision"])))
        counts = list(self._scraper.map(arrivals, [pod["status"]["podIP"] for pod in pods]))
        taken: dict[str, tuple[str, str, float]] = {}
        unanswered: set[str] = set()
        for pod, count in zip(pods, counts, strict=True):
            labels = pod["metadata"]["labels"]
            if count is None:
                unanswered.add(labels["specdec.io/model"])
            else:
                taken[pod["metadata"]["uid"]] = (labels["specdec.io/model"], labels["specdec.io/revision"], count)
        self.snapshots.append(Snapshot(routes, taken, frozenset(unanswered)))

    def taken_by_revision(self, model: str) -> dict[str, float]:
        last = next((s.taken for s in reversed(self.snapshots) if s.complete_for(model)), {})
        counts: dict[str, float] = {}
        for pod_model, revision, count in last.values():
            if pod_model == model:
                counts[revision] = counts.get(revision, 0.0) + count
        return counts

    def _monotone(self) -> list[tuple[Snapshot, dict[str, tuple[str, str, float]]]]:
        """Each snapshot with every pod's arrivals so far as the most it ever showed: a pod's arrivals only grow,
        but one stopping between the LIST and its scrape refuses the connection and reads 0, and a request that
        ends without an answer leaves the running count unanswered; a drop would count as negative requests
        (a full run once measured a canary taking 297 of 266 requests)."""
        peak: dict[str, float] = {}
        result = []
        for snapshot in self.snapshots:
            counted = {}
            for uid, (pod_model, revision, count) in snapshot.taken.items():
                peak[uid] = max(peak.get(uid, 0.0), count)
                counted[uid] = (pod_model, revision, peak[uid])
            result.append((snapshot, counted))
        return result

    def shares(self, model: str) -> dict[int, tuple[float, float]]:
        """Per canary weight: (requests the canary revision's pods took, requests all the model's pods took)."""
        windows: dict[int, tuple[int, list[dict[str, tuple[str, str, float]]]]] = {}  # generation -> snapshots
        for (before, counted), after in zip(self._monotone(), self.snapshots[1:], strict=False):
            state, next_state = before.routes.get(model), after.routes.get(model)
            if (state is None or not state.acked or not before.complete_for(model) or next_state is None
                    or next_state.generation != state.generation):
                continue
            windows.setdefault(state.generation, (state.weight, []))[1].append(counted)
        canary_revision = self.pairs.get(model, ("", ""))[1]
        result: dict[int, tuple[float, float]] = {}
        for weight, taken in windows.values():
            if len(taken) < 2:
                continue
            first, pods_end = taken[0], {}
            for snapshot in taken:  # a pod's last count in the window, even if it left before the window closed
                pods_end.update({uid: entry for uid, entry in snapshot.items() if entry[0] == model})
            canary = total = 0.0
            for uid, (_, revision, count) in pods_end.items():
                got = count - (first[uid][2] if uid in first else 0.0)
                total += got
                canary += got if revision == canary_revision else 0.0
            had_canary, had_total = result.get(weight, (0.0, 0.0))
            result[weight] = (had_canary + canary, had_total + total)
        return result


def canary_story(kube: Kube, name: str) -> dict[str, Any]:
    """What explains a canary that did not end: the tuner's last decision, the canary status, its events."""
    status = (kube.get("sm", name) or {}).get("status", {})
    events = [f"{e['reason']}: {e['message']}" for e in kube.events(name) if e["reason"].startswith(("Canary", "K"))]
    return {"decision": (status.get("speculation") or {}).get("lastDecision"), "canary": status.get("canary"),
            "events": events[-4:]}


def phase(kube: Kube, name: str) -> str | None:
    canary = (kube.get("sm", name) or {}).get("status", {}).get("canary")
    return canary.get("phase") if canary else None


def change_drafter(kube: Kube, body: dict[str, Any], profile: str | None = None) -> None:
    body["spec"]["drafters"][0]["model"] = EAGLE_B
    if profile is not None:
        body["spec"]["runtime"]["simulatorProfile"] = profile
    kube.apply(body)


def rolled_out_reason(kube: Kube, name: str) -> str:
    """The event a promoted tuner canary posts: KChanged for a confident change, KExplore for a one-step
    exploration (the tuner explores when its confidence is below 0.9: tuner/policy.py). Both are K rolled out."""
    decision = (kube.get("sm", name)["status"].get("speculation") or {}).get("lastDecision") or {}
    assert decision.get("action") in ("Change", "Explore"), decision
    return "KChanged" if decision["action"] == "Change" else "KExplore"


def rollback_event(kube: Kube, name: str) -> str:
    messages = [e["message"] for e in kube.events(name) if e["reason"] in ("CanaryFailed", "CanaryTimedOut")]
    return " | ".join(messages)


def run_canaries(kube: Kube, gateway: GatewayStandIn, pools: dict[str, int], analysis: dict[str, Any] | None,
                 tuned: bool = False) -> tuple[ShareMeter, list[BackgroundLoad]]:
    """Models of the given sizes behind their routes, open-loop load on each, and a change each: a drafter change,
    or with `tuned` the tuner's own K change (decided from the routed requests' drafts once the load runs).
    Returns when every canary is decided and gone, with the meter that counted what each revision's pods took
    at each weight."""
    bodies = {name: model(name, replicas, str(kube.namespace), analysis=analysis) for name, replicas in pools.items()}
    if tuned:
        for body in bodies.values():
            # One decision per model (the cooldown outlasts the test), as early as the drafts allow.
            body["spec"]["speculation"]["autotune"] = TUNER
            body["spec"]["speculation"]["initialK"] = TUNED_FROM_K
    kube.apply([http_route(name) for name in pools] + list(bodies.values()))
    wait_for("every model Ready", lambda: all(ready(kube, n) for n in pools), 120)
    meter = ShareMeter(list(pools))
    # The served name defaults to the hub id (spec.model.name), which every model here shares.
    loads = [BackgroundLoad(gateway.url, hostname(name), seed, SERVED) for seed, name in enumerate(pools)]
    for load in loads:
        load.__enter__()
    try:
        def stable_serves() -> bool:
            meter.round(kube)
            return all(sum(meter.taken_by_revision(n).values()) > 0 for n in pools)

        # The route's whole weight goes to the stable Service before the canary starts.
        wait_for("traffic on each model's stable revision", stable_serves, 60,
                 describe=lambda: meter.snapshots[-1] if meter.snapshots else None)
        for name in pools:
            if not tuned:
                change_drafter(kube, bodies[name])

        def all_done() -> bool:
            meter.round(kube)
            return all(meter.phases.get(n) in ("Promoted", "RolledBack", "Aborted") for n in pools)

        wait_for("every canary decided", all_done, 2 * STEP_TIMEOUT_S + 8 * PAUSE_S, 0.5,
                 describe=lambda: {n: (meter.phases.get(n), meter.snapshots[-1].routes.get(n), canary_story(kube, n))
                                   for n in pools})
        meter.round(kube)  # the last round closes the last weight's window
        # The load goes on until every canary Deployment is gone: requests keep arriving through the hand-back
        # of the route to the stable Service and the canary pods' deletion, as they would in production.
        wait_for("every canary Deployment removed", lambda: not [
            d for d in kube.items("deployments", f"{contract.LABEL_TRACK}=canary")
            if d["metadata"]["labels"].get(contract.LABEL_MODEL) in pools], 180, 1)
    finally:
        for load in loads:
            load.__exit__()
        meter.close()
    return meter, loads


def test_healthy_canaries_promote_and_each_revision_takes_its_route_share_at_every_step_on_1_2_4_replicas(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn
) -> None:
    """The example's steps and analysis on pools of 1, 2 and 4 replicas: every healthy drafter change promotes,
    and at each paused step the canary's pods took the route's weight of the requests."""
    pools = {f"pool{replicas}": replicas for replicas in (1, 2, 4)}
    meter, loads = run_canaries(kube, gateway, pools, ANALYSIS)
    verdicts = {name: phase(kube, name) for name in pools}
    assert verdicts == dict.fromkeys(pools, "Promoted"), {n: rollback_event(kube, n) for n in pools}
    failures, measured = [], {}
    for name in pools:
        shares = measured[name] = meter.shares(name)
        for step_weight in STEP_WEIGHTS[:-1]:  # the 100% step has no pause to measure
            # The route follows the step's replica split, so each pod of either revision takes the same load.
            weight = equal_load_percent(pools[name], step_weight)
            canary, total = shares.get(weight, (0.0, 0.0))
            assert total >= 50, f"{name}: only {total:.0f} requests measured at {weight}% ({shares})"
            if abs(canary / total - weight / 100) > SHARE_TOLERANCE:
                failures.append(f"{name} at step {step_weight}% (route {weight}%): canary pods took {canary:.0f} "
                                f"of {total:.0f} ({canary / total:.1%})")
    print(f"requests (canary, total) per weight: {measured}")  # shown with -rA: the figures behind the pass
    assert not failures, (failures, measured)
    assert_every_request_answered(loads)


def assert_every_request_answered(loads: list[BackgroundLoad]) -> None:
    """Every request through every step, the promotion and the canary's removal answered 200.

    A pod is Ready only once its simulator has loaded (the fleet driver reports it, as a readiness probe would:
    docs/local-traffic.md), so no request is routed to a starting pod; the route leaves the canary's pods before
    they are deleted (tests/unit/reconcile/test_canary_drain.py); and a deleted pod serves through its preStop wait,
    then drains what it has in flight (--shutdown-timeout) before it exits (docs/runtime-pods.md)."""
    statuses = {load.model: load.report.statuses if load.report else None for load in loads}
    assert all(counts is not None for counts in statuses.values()), statuses
    print(f"answers per model by HTTP status: {statuses}")
    failures = {load.model: load.report.failures.most_common(5) for load in loads if load.report}
    assert not any(failures.values()), failures


def test_healthy_tuner_k_changes_promote_under_real_traffic_on_1_2_4_replicas(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn
) -> None:
    """The change every tuned model makes: the tuner's K decision, judged by the K-change analysis (per-position
    acceptance on the positions both revisions draft, goodput against the tuner's prediction) on the routed
    requests of pools of 1, 2 and 4 replicas. Every healthy K change promotes, with its numbers in the event, and
    no request fails through the steps, the promotion and the canary's removal."""
    pools = {f"tuned{replicas}": replicas for replicas in (1, 2, 4)}
    _, loads = run_canaries(kube, gateway, pools, ANALYSIS, tuned=True)
    verdicts = {name: phase(kube, name) for name in pools}
    assert verdicts == dict.fromkeys(pools, "Promoted"), {n: rollback_event(kube, n) for n in pools}
    for name in pools:
        status = kube.get("sm", name)["status"]
        canary = status["canary"]
        assert canary["canaryK"] > TUNED_FROM_K and status["pools"][0]["effectiveK"] == canary["canaryK"], canary
        rolled_out = rolled_out_reason(kube, name)
        events = kube.events_once(name, "CanaryPromoted", rolled_out)
        promoted = [e["message"] for e in events if e["reason"] == "CanaryPromoted"]
        assert promoted and any(ch.isdigit() for ch in promoted[-1]), promoted
        passed = [e["message"] for e in events if e["reason"] == "CanaryStepPassed"]
        # Judged as a K change: against the goodput the tuner predicted, acceptance per shared draft position.
        assert any("tuner predicted" in m and "acceptance at position 1" in m for m in passed), passed
        print(f"{name}: {passed} {promoted[-1]}")  # shown with -rA: the numbers the promotion rests on
        # Announced once, at the promotion, as what the recorded decision was.
        changed = [(e["reason"], e["message"]) for e in events if e["reason"] in ("KChanged", "KExplore")]
        assert [reason for reason, _ in changed] == [rolled_out], changed
    assert_every_request_answered(loads)


@pytest.mark.parametrize(("profile", "cited"), [
    ("e2e-traffic-tpot-slow", "TPOT"),
    ("e2e-traffic-erroring", "error rate"),
])
def test_a_bad_canary_under_real_traffic_is_rolled_back_citing_its_metric(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, gateway: GatewayStandIn,
    profile: str, cited: str,
) -> None:
    name = "bad"
    body = model(name, 2, str(kube.namespace))
    kube.apply([http_route(name), body])
    wait_for(f"{name} Ready", lambda: ready(kube, name), 120)
    with BackgroundLoad(gateway.url, hostname(name), seed=7, model=SERVED):
        change_drafter(kube, body, profile)
        wait_for("canary decided", lambda: phase(kube, name) in ("Promoted", "RolledBack", "Aborted"),
                 STEP_TIMEOUT_S + 4 * PAUSE_S + 60,
                 describe=lambda: (phase(kube, name), canary_weight(kube.get("httproute", name))))
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
    kube.apply([http_route(name, backend_namespace="somewhere-else"), model(name, 1, str(kube.namespace))])

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
