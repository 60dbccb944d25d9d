"""KEDA scales a SpeculativeModel on queue depth, through the /scale subresource, and the operator follows.

The whole pipeline runs (docs/autoscaling.md, "The local pipeline"): open-loop load through the model's Service
(the stand-in spreads it over the ready pods as kube-proxy would) queues in the simulators (profile
e2e-autoscale: no virtual load, a running batch of 4), Prometheus scrapes `vllm:num_requests_waiting` from the
pods, KEDA's prometheus scaler serves the sum as an external metric through the aggregator, and the HPA KEDA made
writes `/scale`. The operator spreads the count over the pools, never writes it back, rolls nothing, and its tuner
takes no K decision while a resize is in progress. Each resize restarts the pool's decision window, and after the
scale-out the tuner weighs K again on samples taken at the new size alone (the operator's /metrics:
specdec_tuner_window_restarts_total, specdec_tuner_samples, specdec_tuner_decisions_total; docs/metrics.md).

Prometheus finds the pods through file_sd: a thread here lists the model's runtime pods (label specdec.io/model)
and writes their IP:8000 to the targets file. It stands in for what a cluster does with the chart's PodMonitor (the
Prometheus Operator turns it into kubernetes_sd pod discovery); the fake pods' loopback IPs are only reachable
this way.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localcluster import build, processes
from localcluster.autoscaling import EXTERNAL_METRICS_APISERVICE, AutoscalingPipeline
from localcluster.cluster import LocalCluster
from localcluster.versions import AUTOSCALING_TOOLS
from specdec_runtime import contract
from tests.e2e.audit import OPERATOR_AGENTS, AuditEntry, AuditLog, rollouts, status_writes, written_status
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.traffic import BackgroundLoad, GatewayStandIn

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.xdist_group("test_autoscaling")]

NAME = "queued"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"  # spec.model.name: the served name and vLLM's model_name label
POOL = f"{NAME}-gfx942"
MAX_REPLICAS = 3
# KEDA's prometheus trigger (metricType AverageValue): the HPA wants ceil(waiting / THRESHOLD) replicas.
THRESHOLD = 4
# Open-loop load in requests/s. One e2e-autoscale pod finishes about 3/s: the base rate alone queues little;
# with the surge on top the queue grows by about 3 requests a second until more pods serve.
BASE_RATE, SURGE_RATE = 1.5, 5.0
# The HPA keeps the highest recommendation of this window before it scales in: long enough that a queue that
# empties between two scrapes does not shrink the model while the load still runs, and that the tuner fills a
# window at the new size (MIN_SAMPLES below) before the model shrinks again.
SCALE_DOWN_WINDOW_S = 30
# Samples (drafts) a decision window needs. Three saturated pods draft at most about 120 a second and the tuner
# evaluates every 5 s, so the first evaluation after a window restart always holds for samples; the surge on
# three pods fills a window in about 10 s.
MIN_SAMPLES = 600
AUTOSCALING_COMPONENTS = ("prometheus", "keda-operator", "keda-adapter")


class PodTargets:
    """Keeps Prometheus's file_sd targets at the Running runtime pods of the namespaces it is told about.

    A stand-in for the chart's PodMonitor (kubernetes_sd role pod in a cluster's Prometheus): every second it lists
    pods labelled specdec.io/model and writes `<podIP>:8000` with the labels a PodMonitor would attach."""

    def __init__(self, cluster: LocalCluster, targets_file: Path) -> None:
        self.cluster, self.targets_file = cluster, targets_file
        self.namespaces: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prometheus-targets", daemon=True)
        self._written = ""

    def start(self) -> PodTargets:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.refresh()
            except Exception as err:  # a failed listing (the API server busy) is retried next second
                print(f"prometheus targets: {err}")

    def refresh(self) -> None:
        groups = []
        for namespace in sorted(self.namespaces):
            listing = json.loads(self.cluster.kubectl("get", "pods", "-n", namespace, "-l", contract.LABEL_MODEL,
                                                      "-o", "json"))
            for pod in listing["items"]:
                meta, status = pod["metadata"], pod.get("status", {})
                if status.get("phase") != "Running" or not status.get("podIP") or meta.get("deletionTimestamp"):
                    continue
                labels = meta.get("labels", {})
                groups.append({"targets": [f"{status['podIP']}:8000"],
                               "labels": {"namespace": namespace, "pod": meta["name"],
                                          "model": labels.get(contract.LABEL_MODEL, ""),
                                          "pool": labels.get(contract.LABEL_POOL, "")}})
        text = json.dumps(groups, indent=1, sort_keys=True) + "\n"
        if text != self._written:
            scratch = self.targets_file.with_suffix(".tmp")
            scratch.write_text(text)
            os.replace(scratch, self.targets_file)  # Prometheus never reads half a file
            self._written = text


@dataclass
class Autoscaling:
    pipeline: AutoscalingPipeline
    targets: PodTargets

    def query(self, promql: str) -> float | None:
        """An instant query's single value; None when Prometheus has no series for it (yet)."""
        url = f"{self.pipeline.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=5) as response:
            result = json.loads(response.read())["data"]["result"]
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def autoscaling(cluster: LocalCluster) -> Iterator[Autoscaling]:
    """Prometheus, KEDA's operator and its metrics server (hack/localcluster/autoscaling.py) for this module, and
    the targets thread. What this fixture started it stops; the APIService goes first, so that the aggregator does
    not advertise an API nobody serves (discovery, and with it namespace deletion, would stall on it)."""
    unbuilt = [tool.name for tool in AUTOSCALING_TOOLS
               if not all((build.binary_dir(tool) / name).is_file() for name in tool.packages)]
    if unbuilt:
        # A cold build of KEDA alone takes about 20 minutes on two cores: not something a test lane starts.
        # hack/test builds them first; a run without them fails here rather than passing without the test.
        pytest.fail(f"{', '.join(unbuilt)} not built: run `hack/cluster tools --autoscaling` once (hack/test does)")
    already = set(processes.running_components(cluster.paths.pids))
    pipeline = AutoscalingPipeline(cluster)
    pipeline.up()
    targets = PodTargets(cluster, pipeline.targets_file).start()
    try:
        yield Autoscaling(pipeline, targets)
    finally:
        targets.stop()
        started = [name for name in AUTOSCALING_COMPONENTS if name not in already]
        if "keda-adapter" in started:
            cluster.kubectl("delete", "apiservice", EXTERNAL_METRICS_APISERVICE, "--ignore-not-found", check=False)
        for name in started:
            processes.stop_pid_file(cluster.paths.pids / f"{name}.pid")


@pytest.fixture(scope="module")
def service_proxy(cluster: LocalCluster) -> Iterator[GatewayStandIn]:
    """Carries only Service-host requests (the kube-proxy half), as in test_canary_defaults."""
    proxy = GatewayStandIn(cluster, name="autoscaling-proxy", gateway_class="specdec-e2e-services-only").start()
    yield proxy
    proxy.stop()


def model() -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": NAME},
        "spec": {
            "model": {"name": SERVED},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            # The tuner runs (every 5 s) and its window restarts on every resize, but K is pinned: a free K may be
            # explored on the cost priors' doubt alone (tuner/policy.py `_explore_prior_doubt`, once per pool and free
            # under a surge rollout), a rollout of the tuner's own that the checks below would take for the resize's
            # (seen in CI: K 3 -> 2 explored 4 s after the scale-out settled).
            "speculation": {"initialK": 3, "minK": 3, "maxK": 3,
                            "autotune": {"intervalSeconds": 5, "minSamples": MIN_SAMPLES}},
            "placement": {"gfxTargets": ["gfx942"], "totalReplicas": 1,
                          "minReplicasPerPool": 1, "maxReplicasPerPool": MAX_REPLICAS},
            "runtime": {"simulatorProfile": "e2e-autoscale"},
        },
    }


def waiting_query(namespace: str) -> str:
    # The simulator labels its series as vLLM does: model_name is the served name (spec.model.name by default).
    return f'sum(vllm:num_requests_waiting{{namespace="{namespace}", model_name="{SERVED}"}})'


def scaled_object(namespace: str, prometheus_url: str) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": NAME},
        "spec": {
            "scaleTargetRef": {"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "name": NAME},
            "pollingInterval": 2, "cooldownPeriod": 10,
            "minReplicaCount": 1, "maxReplicaCount": MAX_REPLICAS,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": MAX_REPLICAS, "periodSeconds": 5}]},
                "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
                              "policies": [{"type": "Percent", "value": 100, "periodSeconds": 5}]},
            }}},
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": prometheus_url, "query": waiting_query(namespace), "threshold": str(THRESHOLD),
            }}],
        },
    }


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class TunerWindow:
    """The pool's decision window on the operator's /metrics, as its last evaluation published it."""

    samples: float
    min_samples: float
    started: float  # Unix time
    restarts: dict[str, float]  # cause -> restarts so far
    decisions: float  # evaluations so far (specdec_tuner_decisions_total over its actions)

    @classmethod
    def read(cls, operator: OperatorProcess, namespace: str) -> TunerWindow | None:
        metrics = operator.metrics() or {}
        labels = f"model={NAME},namespace={namespace},pool={POOL}"
        samples = metrics.get(f"specdec_tuner_samples{{{labels}}}")
        if samples is None:
            return None  # not evaluated yet
        restarts = {key.split("cause=")[1].split(",")[0]: value for key, value in metrics.items()
                    if key.startswith("specdec_tuner_window_restarts_total{") and key.endswith(f",{labels}}}")}
        decisions = sum(value for key, value in metrics.items()
                        if key.startswith("specdec_tuner_decisions_total{") and key.endswith(f",{labels}}}"))
        return cls(samples, metrics.get(f"specdec_tuner_min_samples{{{labels}}}", math.nan),
                   metrics.get(f"specdec_tuner_window_start_timestamp_seconds{{{labels}}}", math.nan), restarts,
                   decisions)

    def line(self, started: float) -> str:
        restarts = ",".join(f"{cause}={value:.0f}" for cause, value in sorted(self.restarts.items()) if value)
        return (f"tuner: samples={self.samples:.0f}/{self.min_samples:.0f} window from "
                f"{self.started - started:.1f}s restarts={restarts or 0} evaluations={self.decisions:.0f}")


@dataclass
class Sample:
    began: str  # UTC, RFC 3339 with microseconds: everything below was read after this...
    at: str  # ...and before this
    total: int | None  # spec.placement.totalReplicas: what the scaler asks for
    placed: int | None  # status.replicas
    ready_uids: tuple[str, ...]  # Running, Ready, not terminating
    terminating: int
    waiting: float | None  # Prometheus's sum of vllm:num_requests_waiting
    serving: int  # the model's targets Prometheus scraped successfully last (`up == 1`)
    tuner: TunerWindow | None  # the operator's /metrics

    @property
    def settled(self) -> bool:
        """The count the scaler asked for is placed, Ready, and serving: Ready says a pod's simulator has loaded
        (docs/local-traffic.md), Prometheus's `up` that it has found and scraped every new pod."""
        return self.total == self.placed == len(self.ready_uids) == self.serving and self.terminating == 0

    def line(self, started: float) -> str:
        tuner = self.tuner.line(started) if self.tuner is not None else "tuner: not evaluated yet"
        return (f"{(parse_time(self.at).timestamp() - started):6.1f}s  total={self.total} placed={self.placed} "
                f"ready={len(self.ready_uids)} serving={self.serving} terminating={self.terminating} "
                f"waiting={self.waiting}  {tuner}")


@dataclass
class Timeline:
    kube: Kube
    autoscaling: Autoscaling
    operator: OperatorProcess
    namespace: str
    samples: list[Sample] = field(default_factory=list)

    def sample(self) -> Sample:
        began = utc_now()
        sm = self.kube.get("sm", NAME) or {}
        pods = self.kube.items("pods", f"{contract.LABEL_MODEL}={NAME}")
        ready = tuple(sorted(
            p["metadata"]["uid"] for p in pods
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))))
        try:
            waiting = self.autoscaling.query(waiting_query(self.namespace))
            serving = self.autoscaling.query(f'count(up{{namespace="{self.namespace}", model="{NAME}"}} == 1)')
        except OSError:
            waiting = serving = None
        tuner = TunerWindow.read(self.operator, self.namespace)
        sample = Sample(began, utc_now(), sm.get("spec", {}).get("placement", {}).get("totalReplicas"),
                        sm.get("status", {}).get("replicas"), ready,
                        sum(1 for p in pods if p["metadata"].get("deletionTimestamp")), waiting, int(serving or 0),
                        tuner)
        self.samples.append(sample)
        return sample

    def until(self, what: str, done: Callable[[Sample], bool], timeout_s: float) -> Sample:
        """Sample every second until `done` holds for a sample; that sample."""
        def probe() -> Sample | None:
            sample = self.sample()
            return sample if done(sample) else None

        return wait_for(what, probe, timeout_s, 1.0, describe=lambda: self.samples[-1] if self.samples else None)


def pods_restarted(kube: Kube) -> dict[str, int]:
    restarts = {}
    for pod in kube.items("pods", f"{contract.LABEL_MODEL}={NAME}"):
        count = sum(int(c.get("restartCount", 0)) for c in pod["status"].get("containerStatuses", []))
        if count:
            restarts[pod["metadata"]["name"]] = count
    return restarts


def touches_spec(entry: AuditEntry) -> bool:
    """Whether a write of the model could have changed its spec: any write but a patch, or a patch whose body
    (a merge patch, or a JSON patch's ops) reaches into spec."""
    if entry.verb != "patch":
        return True
    body = entry.request
    if isinstance(body, list):
        return any(str(op.get("path", "")).startswith("/spec") for op in body if isinstance(op, dict))
    return isinstance(body, dict) and "spec" in body


def resize_windows(scale_writes: list[AuditEntry], samples: list[Sample]) -> list[tuple[str, str]]:
    """From each write of /scale to the end of the first sample read wholly after it that shows the model settled
    (at its new size): a window at least as long as the resize."""
    windows = []
    for write in scale_writes:
        written = parse_time(write.received)
        end = next((s.at for s in samples if parse_time(s.began) > written and s.settled), samples[-1].at)
        windows.append((write.received, end))
    return windows


@dataclass(frozen=True)
class ReDecision:
    """From the operator's /metrics: a resize restarted the pool's window, an evaluation in the window that
    followed held for samples, and a later one in that same window weighed K on minSamples or more."""

    restart: TunerWindow  # the first evaluation that showed the restart (the HPA may resize in steps: the last)
    filling: TunerWindow  # an evaluation in the window with fewer than minSamples
    full: TunerWindow  # the first evaluation of that window with at least minSamples
    counts: tuple[float, ...]  # the samples of every evaluation of that window, up to `full`


def evaluations(samples: list[Sample]) -> list[TunerWindow]:
    """The windows of the evaluations the samples saw: each published window whose evaluation count rose. The
    exporter sets the window before it counts the evaluation, so a window read with a risen count is that
    evaluation's."""
    windows = [s.tuner for s in samples if s.tuner is not None]
    return [window for before, window in itertools.pairwise(windows) if window.decisions > before.decisions]


def re_decision(samples: list[Sample], resizes_before: float) -> ReDecision | None:
    """The first window after a resize (past `resizes_before` restarts for it) that held for samples and then
    filled, without another resize in between."""
    restarted = [w for w in evaluations(samples) if w.restarts.get("resize", 0) > resizes_before]
    for index, filling in enumerate(restarted):
        if filling.samples >= filling.min_samples:
            continue
        resizes = filling.restarts.get("resize", 0)
        # The same window: the same resize count and the same start, which the exporter publishes identically
        # at every evaluation to the millisecond.
        full = next((w for w in restarted[index + 1:] if w.restarts.get("resize", 0) == resizes
                     and abs(w.started - filling.started) < 0.01 and w.samples >= w.min_samples), None)
        if full is not None:
            restart = next(w for w in restarted if w.restarts.get("resize", 0) == resizes)
            counts = tuple(w.samples for w in restarted[index:restarted.index(full) + 1]
                           if abs(w.started - filling.started) < 0.01)
            return ReDecision(restart, filling, full, counts)
    return None


def test_keda_scales_a_model_out_on_queue_depth_and_back_in_without_a_rollout(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    autoscaling: Autoscaling, service_proxy: GatewayStandIn,
) -> None:
    autoscaling.targets.namespaces.add(namespace)
    timeline = Timeline(kube, autoscaling, operator, namespace)
    started = time.time()
    kube.apply(model())
    first = timeline.until(f"{NAME} settled at 1 replica", lambda s: s.settled and s.placed == 1, 180)
    baseline = kube.get("deployment", POOL)
    audit = AuditLog(cluster.paths.logs / "audit.log")
    try:
        kube.apply(scaled_object(namespace, autoscaling.pipeline.prometheus_url))
        wait_for("KEDA's HPA for the model", lambda: kube.get("hpa", f"keda-hpa-{NAME}"), 60)
        # Prometheus scrapes the pod (the targets thread listed it): the query answers before any load.
        timeline.until("Prometheus sees the pod's queue", lambda s: s.waiting is not None, 60)

        host = f"{NAME}.{namespace}.svc"
        with BackgroundLoad(service_proxy.url, host, seed=21, model=SERVED, rate=BASE_RATE) as base:
            # The rise: the base load alone first, until Prometheus has seen the pod finish some of it.
            wait_for("the base load served", lambda: (autoscaling.query(
                f'sum(vllm:request_success_total{{namespace="{namespace}", model_name="{SERVED}"}})') or 0) > 0, 60)
            before = TunerWindow.read(operator, namespace)
            resizes_before = before.restarts.get("resize", 0) if before is not None else 0.0
            with BackgroundLoad(service_proxy.url, host, seed=22, model=SERVED, rate=SURGE_RATE) as surge:
                grown = timeline.until("KEDA scaled the model out", lambda s: (s.total or 0) > 1, 150)
                out = timeline.until("the new pods ready", lambda s: s.settled and (s.placed or 0) > 1, 120)
                # The load goes on until the tuner has filled a window at the new size and weighed K on it.
                timeline.until("the tuner weighed K again on a window at the new size",
                               lambda s: re_decision(timeline.samples, resizes_before) is not None, 90)
                redecided = re_decision(timeline.samples, resizes_before)
        peak = max(s.placed or 0 for s in timeline.samples)
        # The pod that served before the resize still serves: a resize changes counts, not pods.
        assert set(first.ready_uids) <= set(out.ready_uids), "a pod that served before the scale-out was replaced"
        assert pods_restarted(kube) == {}, pods_restarted(kube)

        back = timeline.until("KEDA scaled the model back in", lambda s: s.settled and s.placed == 1, 180)
        # The scale-in restarts the window too, published at the tuner's next evaluation.
        assert redecided is not None
        resized_in = timeline.until(
            "the tuner's window restart for the scale-in",
            lambda s: s.tuner is not None
            and s.tuner.restarts.get("resize", 0) > redecided.full.restarts.get("resize", 0), 30)
        seen = {uid for s in timeline.samples for uid in s.ready_uids}
        assert set(back.ready_uids) <= seen and pods_restarted(kube) == {}, "scale-in started or restarted a pod"
    finally:
        # KEDA holds a finalizer on its ScaledObject: delete it while KEDA still runs, or the namespace never goes.
        kube.run("delete", "scaledobject", NAME, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
        if kube.get("scaledobject", NAME) is not None:
            kube.run("patch", "scaledobject", NAME, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                     check=False)
    entries = audit.entries(namespace)
    scale_writes = [e for e in entries if e.is_write_of("speculativemodels", NAME, "scale") and e.ok]
    spec_writes = [e for e in entries if e.is_write_of("speculativemodels", NAME) and e.by_operator
                   and touches_spec(e)]
    # Who owns which part of the model (server-side field management): (manager, operation, subresource, the
    # top-level fields it owns).
    managers = sorted((entry["manager"], entry["operation"], entry.get("subresource", ""),
                       ",".join(sorted(entry.get("fieldsV1", {})))) for entry in
                      json.loads(kube.run("get", "sm", NAME, "-o", "json", "--show-managed-fields"))["metadata"]
                      .get("managedFields", []))
    operator_spec = [m for m in managers if m[0].startswith(OPERATOR_AGENTS) and "f:spec" in m[3]]
    writes = [e for e in status_writes(entries, NAME) if e.ok]
    decisions = {json.dumps(d, sort_keys=True): d for d in
                 ((written_status(e).get("speculation") or {}).get("lastDecision") for e in writes) if d}
    windows = resize_windows(scale_writes, timeline.samples)

    # The figures, before the verdicts.
    print(f"\nqueue-depth scaling of {NAME} (threshold {THRESHOLD} waiting per replica, max {MAX_REPLICAS}, load "
          f"{BASE_RATE} then {BASE_RATE + SURGE_RATE} requests/s); totalReplicas first above 1 at {grown.at}, "
          f"peak {peak} replicas")
    for sample in timeline.samples:
        print("  " + sample.line(started))
    print(f"  highest queue Prometheus showed: {max((s.waiting or 0) for s in timeline.samples):.0f}")
    print("  /scale writes: " + ", ".join(f"{e.received} {e.verb} by {e.user_agent.split(' ')[0]}"
                                          for e in scale_writes))
    print(f"  resize windows (scale write -> settled): {windows}")
    print(f"  field managers at the end (manager, operation, subresource, fields): {managers}")
    print(f"  status writes: {len(writes)}; K decisions recorded: {list(decisions.values()) or 'none'}")
    mine = {key: value for key, value in (operator.metrics() or {}).items() if f"namespace={namespace}" in key}
    tuner = {key.split("action=")[1].split(",")[0]: value for key, value in mine.items()
             if key.startswith("specdec_tuner_decisions_total{")}
    ks = {key.split("{")[0]: value for key, value in mine.items()
          if key.startswith(("specdec_effective_k{", "specdec_recommended_k{"))}
    print(f"  tuner evaluations by action: {tuner}; at the end {ks} (operator /metrics)")
    assert redecided is not None and resized_in.tuner is not None
    scaled_out_at = parse_time(scale_writes[0].received).timestamp()
    print(f"  tuner window (operator /metrics): resize restarts {resizes_before:.0f} before the scale-out, "
          f"{redecided.restart.restarts.get('resize', 0):.0f} at the first evaluation after it "
          f"({redecided.restart.samples:.0f} samples), {resized_in.tuner.restarts.get('resize', 0):.0f} after the "
          f"scale-in; the window after the scale-out began {redecided.full.started - scaled_out_at:.1f}s after "
          f"the first /scale write, held at {redecided.filling.samples:.0f} of {redecided.full.min_samples:.0f} "
          f"samples, weighed K at {redecided.full.samples:.0f} (evaluation {redecided.full.decisions:.0f}, "
          f"{redecided.full.decisions - redecided.restart.decisions:.0f} after the restart); samples at the "
          f"window's evaluations: {', '.join(f'{count:.0f}' for count in redecided.counts)}")
    # A new pod is Ready (and routed to) only once its simulator has loaded (docs/local-traffic.md).
    print("  answers by HTTP status: " + ", ".join(
        f"{name}: {dict(load.report.statuses) if load.report else None}" for name, load in
        (("base", base), ("surge", surge))))

    # The scaler wrote the count, through /scale, and the operator never did: not through /scale, not in the
    # model's spec, and it owns no field of the spec.
    assert scale_writes and not [e for e in scale_writes if e.by_operator], scale_writes
    assert spec_writes == [], [(e.verb, e.user_agent, e.request) for e in spec_writes]
    assert managers and operator_spec == [], managers
    # No rollout: the pool kept its pod template (its revision and K) through both resizes.
    assert rollouts(entries, POOL, baseline=baseline["spec"]["template"]) == []
    # No K decision recorded: K is pinned, so one would be the tuner moving outside its bounds.
    assert decisions == {}, list(decisions.values())
    # Each resize restarted the pool's decision window: the scale-out once or more (the HPA may step), the
    # scale-in again, and never without a /scale write behind it.
    resize_restarts = resized_in.tuner.restarts.get("resize", 0) - resizes_before
    assert 2 <= resize_restarts <= len(scale_writes), (resize_restarts, len(scale_writes))
    # After the scale-out the tuner re-decided from a fresh window: it began after the first /scale write, held
    # while it had fewer than minSamples, and was weighed on at least minSamples.
    assert scaled_out_at < redecided.full.started < time.time(), (redecided, scale_writes[0].received)
    assert redecided.filling.samples < MIN_SAMPLES <= redecided.full.samples
    assert redecided.full.min_samples == MIN_SAMPLES
