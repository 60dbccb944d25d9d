"""hack/scale: the fleet-scale benchmark on a local control plane of its own. Prints figures, asserts nothing.

Brings up a cluster (its own SPECDEC_CLUSTER_DIR and port base) with a generated kwok fleet of MI300X
nodes, runs the fleet driver (simulated vLLM with traffic from the `quick` profile) and the operator,
applies N models x R replicas and reports:

- time from apply to every model Ready, and the same for N bare Deployments of the same pods (the floor);
- API requests per second by verb and resource over a steady window, from kube-apiserver's
  apiserver_request_total (all clients) and from the audit log (which this cluster logs reads into),
  split into the operator's user agents (ours and kopf's) and everyone else's. The window starts --settle
  seconds after Ready (default: one status statistics period and two scrape rounds), after each model's
  first statistics and their one provisional refresh;
- operator writes per minute, RSS and CPU; scrape round p50/p99 and the share of scrapes that succeed;
- after deleting every model: per-model series left in the operator's /metrics, and RSS against idle.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from localcluster.cluster import REPO_ROOT, ClusterPaths, LocalCluster, Ports
from specdec_operator.handlers.services import memory_release as memory
from specdec_operator.settings import OperatorEnvSettings

OPERATOR_AGENTS = ("specdec-operator", "kopf/")
GPUS_PER_NODE = 8
NAMESPACES = 10
# The operator's log line (handlers/services/memory_release.py) for a memory release.
RELEASE_LINE = re.compile(r"resident memory (\d+) MiB -> (\d+) MiB after collection and trim \((\S+) MiB of heap")
MANAGED = "app.kubernetes.io/managed-by=specdec-operator"
# The allocator settings of the operator image (Dockerfile): RSS figures are only meaningful measured alike.
OPERATOR_IMAGE_ENV = {"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"}
STATS_PERIOD_S = OperatorEnvSettings.model_fields["status_stats_period_seconds"].default
SETTLE_S = STATS_PERIOD_S + 30  # one statistics period and two scrape rounds


def log(message: str) -> None:
    sys.stderr.write(f"[scale {datetime.now(UTC).strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def fleet_yaml(pods: int) -> str:
    nodes = math.ceil(pods / GPUS_PER_NODE) + 1  # one spare, so the last pods are never squeezed
    return yaml.safe_dump({
        "gpuModels": {"mi300x": {"deviceId": "74a1", "productName": "AMD_Instinct_MI300X_OAM", "vram": "192G",
                                 "family": "AI", "cuCount": 304, "simdCount": 1216}},
        "nodeGroups": [{"prefix": "mi300x", "count": nodes, "gpus": [{"model": "mi300x", "count": GPUS_PER_NODE}],
                        "partition": "spx_nps1"}],
    })


def model(name: str, namespace: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": name, "tensorParallelSize": 1},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            "speculation": {"initialK": 3, "minK": 1, "maxK": 6, "autotune": {"enabled": True}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": replicas},
        },
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- processes ---------------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(name: str, command: list[str], env: dict[str, str], logs: Path) -> Child:
    with (logs / f"{name}.log").open("ab") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    return Child(name, process)


def wait_until(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 2.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(every_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of a Prometheus text body; enough for counters and gauges."""
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = line_re.match(line)
        if match:
            yield match.group(1), dict(label_re.findall(match.group(2) or "")), float(match.group(3))


# --- the benchmark -----------------------------------------------------------------------------------


@dataclass
class Bench:
    models: int
    replicas: int
    window_s: float
    cluster: LocalCluster
    settle_s: float = SETTLE_S
    poll_s: float = 15.0
    out: dict[str, Any] = field(default_factory=dict)
    operator: Child | None = None
    driver: Child | None = None
    metrics_port: int = 0

    @property
    def namespaces(self) -> list[str]:
        return [f"scale-{i}" for i in range(min(NAMESPACES, self.models))]

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.cluster.kubectl(*args, "-o", "json"))

    def apply(self, objects: list[dict[str, Any]]) -> None:
        for chunk in range(0, len(objects), 100):
            # JSON, not YAML: a hash label such as 4996883e7 is a string to PyYAML but a number to kubectl.
            text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects[chunk:chunk + 100]})
            self.cluster.kubectl("apply", "--server-side", "-f", "-", input_text=text)

    def operator_metrics(self) -> list[tuple[str, dict[str, str], float]]:
        return list(samples(scrape_text(f"http://127.0.0.1:{self.metrics_port}/metrics")))

    def run(self) -> None:
        pods = self.models * self.replicas
        root = self.cluster.paths.root
        # Beside the cluster dir, which `up` starts afresh.
        fleet = root.parent / f"{root.name}-fleet.yaml"
        fleet.write_text(fleet_yaml(pods))
        log(f"cluster up: {math.ceil(pods / GPUS_PER_NODE) + 1} kwok nodes for {pods} pods in {root}")
        self.cluster.up(fleet)
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))
        self.cluster.wait_crd_established("speculativemodels.specdec.io")
        for namespace in self.namespaces:
            self.cluster.kubectl("create", "namespace", namespace)
        env = {**os.environ, "KUBECONFIG": str(self.cluster.paths.kubeconfig)}
        bin_dir = Path(sys.executable).parent
        self.driver = start("scale-fleet-driver", [str(bin_dir / "specdec-runtime"), "fleet-driver",
                                                   "--default-profile", "quick", "--max-pre-stop-seconds", "1"],
                            env, self.cluster.paths.logs)
        self.metrics_port = free_port()
        self.operator = start("scale-operator", [sys.executable, "-m", "specdec_operator.cli", "run"], {
            **env, **OPERATOR_IMAGE_ENV, "SPECDEC_STANDALONE": "true", "SPECDEC_SCRAPE_LOOPBACK_ONLY": "true",
            "SPECDEC_METRICS_PORT": str(self.metrics_port), "SPECDEC_NAMESPACES": json.dumps(self.namespaces),
        }, self.cluster.paths.logs)
        try:
            wait_until("operator /metrics", self._metrics_up, 60, 1)
            time.sleep(20)
            self.out["idle_rss_mib"] = self.operator.rss_mib()
            self._models_to_ready()
            self._steady_window()
            templates = self._deployment_templates()
            self._delete_models()
            self._floor(templates)
        finally:
            for child in (self.operator, self.driver):
                if child is not None:
                    child.stop()

    def _metrics_up(self) -> bool:
        try:
            self.operator_metrics()
        except OSError:
            return False
        return True

    def _all_models_ready(self) -> bool:
        items = self.kubectl_json("get", "sm", "-A")["items"]
        ready = sum(1 for item in items if any(c.get("type") == "Ready" and c.get("status") == "True"
                                               for c in item.get("status", {}).get("conditions", [])))
        self._progress(f"models Ready {ready}/{self.models}")
        return ready == self.models

    def _progress(self, line: str) -> None:
        now = time.monotonic()
        if now - getattr(self, "_last_progress", 0.0) > 30:
            self._last_progress = now
            log(line)

    def _models_to_ready(self) -> None:
        objects = [model(f"m{i:04d}", self.namespaces[i % len(self.namespaces)], self.replicas)
                   for i in range(self.models)]
        started = time.monotonic()
        self.apply(objects)
        log(f"applied {self.models} models")
        wait_until("all models Ready", self._all_models_ready, 3600, 3)
        self.out["models_ready_s"] = time.monotonic() - started
        log(f"all {self.models} models Ready in {self.out['models_ready_s']:.0f}s")

    def _steady_window(self) -> None:
        # A model writes its first statistics as soon as acceptance is known, from its first minutes of
        # traffic, and may refresh them once soon after (handlers/writes.py). Settling keeps that one-off
        # convergence out of a window meant to show the settled fleet.
        log(f"settling {self.settle_s:.0f}s before the steady window (first statistics and their first refresh)")
        time.sleep(self.settle_s)
        assert self.operator is not None
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        api_before = self._apiserver_requests()
        op_before = self.operator_metrics()
        assert self.driver is not None
        cpu_before, wall_before = self.operator.cpu_seconds(), time.monotonic()
        driver_cpu_before = self.driver.cpu_seconds()
        rounds: list[float] = []
        round_count = _value(op_before, "specdec_scrape_round_duration_seconds_count")
        rss: list[float] = []
        log(f"steady window: {self.window_s:.0f}s")
        while time.monotonic() - wall_before < self.window_s:
            # As often as a Prometheus would scrape the operator: serving /metrics is part of its CPU.
            time.sleep(self.poll_s)
            current = self.operator_metrics()
            count = _value(current, "specdec_scrape_round_duration_seconds_count")
            if count > round_count:
                round_count = count
                rounds.append(_value(current, "specdec_scrape_last_round_seconds"))
            rss.append(self.operator.rss_mib())
        elapsed = time.monotonic() - wall_before
        until = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        op_after = self.operator_metrics()
        self.out["window_s"] = elapsed
        self.out["operator_cpu_cores"] = (self.operator.cpu_seconds() - cpu_before) / elapsed
        self.out["operator_rss_mib"] = max(rss) if rss else self.operator.rss_mib()
        # The fleet driver serves every simulated pod in one process: if it saturates a core, scrape rounds
        # stretch for reasons that are the benchmark's, not the operator's.
        self.out["driver_cpu_cores"] = (self.driver.cpu_seconds() - driver_cpu_before) / elapsed
        self.out["driver_rss_mib"] = self.driver.rss_mib()
        self.out["load_average"] = os.getloadavg()
        api_after = self._apiserver_requests()
        self.out["apiserver_rps"] = {key: (api_after[key] - api_before.get(key, 0)) / elapsed
                                     for key in api_after if api_after[key] - api_before.get(key, 0) > 0}
        self.out["audit"] = self._audit(since, until, elapsed)
        scrapes = {labels["result"]: value - _value(op_before, name, labels)
                   for name, labels, value in op_after if name == "specdec_scrapes_total"}
        self.out["scrapes"] = scrapes
        self.out["scrape_rounds"] = rounds
        self.out["scrape_targets"] = _value(op_after, "specdec_scrape_targets")
        writes = {f"{labels['verb']} {labels['kind']}": value - _value(op_before, name, labels)
                  for name, labels, value in op_after if name == "specdec_api_writes_total"}
        self.out["operator_writes_metric"] = {key: value for key, value in writes.items() if value}
        causes = {labels["cause"]: value - _value(op_before, name, labels)
                  for name, labels, value in op_after if name == "specdec_status_writes_total"}
        self.out["status_writes_by_cause"] = {cause: value for cause, value in causes.items() if value}
        decisions: dict[str, float] = {}
        for name, labels, value in op_after:
            if name == "specdec_tuner_decisions_total":
                delta = value - _value(op_before, name, labels)
                decisions[labels["action"]] = decisions.get(labels["action"], 0.0) + delta
        self.out["tuner_decisions"] = {action: value for action, value in decisions.items() if value}

    def _apiserver_requests(self) -> dict[str, float]:
        counts: dict[str, float] = {}
        for name, labels, value in samples(self.cluster.kubectl("get", "--raw", "/metrics")):
            if name == "apiserver_request_total":
                key = f"{labels.get('verb')} {labels.get('resource')}"
                counts[key] = counts.get(key, 0.0) + value
        return counts

    def _audit(self, since: str, until: str, elapsed: float) -> dict[str, dict[str, float]]:
        """Requests received in [since, until) by (operator | others) and verb resource, per second."""
        seen: set[str] = set()
        counts: dict[str, Counter[str]] = {"operator": Counter(), "others": Counter()}
        for path in sorted(self.cluster.paths.logs.glob("audit*.log")):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                received = entry.get("requestReceivedTimestamp", "")
                if not since <= received < until or entry.get("auditID") in seen:
                    continue
                seen.add(entry.get("auditID"))
                who = "operator" if str(entry.get("userAgent", "")).startswith(OPERATOR_AGENTS) else "others"
                ref = entry.get("objectRef") or {}
                counts[who][f"{entry.get('verb')} {ref.get('resource', entry.get('requestURI', '?'))}"] += 1
        return {who: {key: value / elapsed for key, value in sorted(found.items())} for who, found in counts.items()}

    def _deployment_templates(self) -> list[dict[str, Any]]:
        return list(self.kubectl_json("get", "deployments", "-A", "-l", MANAGED)["items"])

    def _delete_models(self) -> None:
        assert self.operator is not None
        log("deleting every model")
        operator_log = self.cluster.paths.logs / "scale-operator.log"
        log_offset = operator_log.stat().st_size
        for namespace in self.namespaces:
            self.cluster.kubectl("delete", "sm", "--all", "-n", namespace, "--wait=false")
        wait_until("models gone", lambda: not self.kubectl_json("get", "sm", "-A")["items"], 900, 5)
        wait_until("owned deployments gone",
                   lambda: not self.kubectl_json("get", "deployments", "-A", "-l", MANAGED)["items"], 900, 5)
        # The garbage collector deletes the ReplicaSets and pods after the Deployments: until the pods are
        # gone the operator still holds them in its pod index, and RSS would be measured with them.
        wait_until("runtime pods gone",
                   lambda: not self.kubectl_json("get", "pods", "-A", "-l", MANAGED)["items"], 900, 5)
        # The operator samples its watch caches, waits for them to stop shrinking, then gives memory back.
        time.sleep(memory.SAMPLE_S + memory.QUIET_S + 30)
        with operator_log.open("rb") as raw:
            raw.seek(log_offset)
            log_text = raw.read().decode(errors="replace")
        self.out["releases"] = RELEASE_LINE.findall(log_text)
        left = [(name, labels) for name, labels, _ in self.operator_metrics() if "model" in labels]
        self.out["series_left"] = len(left)
        self.out["series_left_names"] = sorted({name for name, _ in left})
        self.out["rss_after_delete_mib"] = self.operator.rss_mib()

    def _floor(self, templates: list[dict[str, Any]]) -> None:
        """The same pods as bare Deployments, nobody's children: how fast this cluster makes them Ready."""
        bare = []
        for index, deployment in enumerate(templates):
            text = json.dumps({"spec": deployment["spec"]}).replace('"specdec-operator"', '"scale-bench-floor"')
            spec = json.loads(text)["spec"]
            bare.append({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": f"bare-{index:04d}", "namespace": deployment["metadata"]["namespace"],
                                      "labels": {"app.kubernetes.io/managed-by": "scale-bench-floor"}},
                         "spec": spec})
        started = time.monotonic()
        self.apply(bare)
        selector = "app.kubernetes.io/managed-by=scale-bench-floor"

        def all_ready() -> bool:
            items = self.kubectl_json("get", "deployments", "-A", "-l", selector)["items"]
            ready = sum(1 for d in items if d.get("status", {}).get("readyReplicas", 0) == d["spec"]["replicas"])
            self._progress(f"bare Deployments ready {ready}/{len(bare)}")
            return ready == len(bare)

        wait_until("bare Deployments Ready", all_ready, 3600, 3)
        self.out["floor_ready_s"] = time.monotonic() - started
        self.out["floor_deployments"] = len(bare)
        for namespace in self.namespaces:
            self.cluster.kubectl("delete", "deployments", "-n", namespace, "-l", selector, "--wait=false")


def _value(found: list[tuple[str, dict[str, str], float]], name: str, labels: dict[str, str] | None = None) -> float:
    return sum(value for sample_name, sample_labels, value in found
               if sample_name == name and (labels is None or sample_labels == labels))


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def report(bench: Bench) -> str:
    out = bench.out
    lines = [f"# fleet scale: {bench.models} models x {bench.replicas} replicas = "
             f"{bench.models * bench.replicas} pods, steady window {out.get('window_s', 0):.0f}s"]
    if "models_ready_s" in out:
        lines.append(f"apply -> all models Ready       {out['models_ready_s']:8.1f} s")
    if "floor_ready_s" in out:
        ratio = out["models_ready_s"] / out["floor_ready_s"] if out.get("floor_ready_s") else float("nan")
        lines.append(f"apply -> {out['floor_deployments']} bare Deployments Ready {out['floor_ready_s']:6.1f} s"
                     f"  (operator / floor = {ratio:.2f}x)")
    audit = out.get("audit", {})
    for who in ("operator", "others"):
        found = audit.get(who, {})
        reads = sum(v for k, v in found.items() if k.split()[0] in ("get", "list", "watch"))
        writes = sum(v for k, v in found.items() if k.split()[0] not in ("get", "list", "watch"))
        lines.append(f"API requests/s, {who:8s} (audit): reads {reads:7.3f}  writes {writes:7.3f}")
        for key, value in sorted(found.items(), key=lambda kv: -kv[1])[:12]:
            lines.append(f"    {value:8.3f}/s  {key}")
    lines.append("API requests/s, all clients (apiserver_request_total):")
    for key, value in sorted(out.get("apiserver_rps", {}).items(), key=lambda kv: -kv[1])[:15]:
        lines.append(f"    {value:8.3f}/s  {key}")
    op_writes = sum(v for k, v in audit.get("operator", {}).items() if k.split()[0] not in ("get", "list", "watch"))
    lines.append(f"operator writes/min (audit)      {op_writes * 60:8.2f}   by the operator's own count: "
                 f"{out.get('operator_writes_metric', {})}")
    lines.append(f"status writes by cause            {out.get('status_writes_by_cause', {})}   tuner decisions "
                 f"(K changes and explorations): {out.get('tuner_decisions', {})}")
    lines.append(f"operator RSS (peak in window)    {out.get('operator_rss_mib', float('nan')):8.1f} MiB   "
                 f"idle {out.get('idle_rss_mib', float('nan')):.1f} MiB")
    lines.append(f"operator CPU (window mean)       {out.get('operator_cpu_cores', float('nan')):8.3f} cores")
    lines.append(f"fleet driver CPU / RSS           {out.get('driver_cpu_cores', float('nan')):8.3f} cores  "
                 f"{out.get('driver_rss_mib', float('nan')):.1f} MiB   machine load average "
                 f"{' '.join(f'{v:.1f}' for v in out.get('load_average', ()))}")
    rounds = out.get("scrape_rounds", [])
    lines.append(f"scrape rounds                    {len(rounds)} rounds over {out.get('scrape_targets', 0):.0f} pods: "
                 f"p50 {percentile(rounds, 0.5):.2f}s p99 {percentile(rounds, 0.99):.2f}s"
                 f" (median {statistics.median(rounds) if rounds else float('nan'):.2f}s)")
    scrapes = out.get("scrapes", {})
    total = sum(scrapes.values())
    ok = scrapes.get("ok", 0) + scrapes.get("incomplete", 0)
    lines.append(f"scrapes in window                {total:.0f}, succeeded {100 * ok / total if total else 0:.3f}% "
                 f"{ {k: int(v) for k, v in scrapes.items() if v} }")
    if "series_left" in out:
        after, idle = out["rss_after_delete_mib"], out["idle_rss_mib"]
        lines.append(f"after deleting every model: per-model series left {out['series_left']} "
                     f"{out['series_left_names'][:8]}; RSS {after:.1f} MiB"
                     f" vs idle {idle:.1f} MiB ({after / idle:.2f}x)")
        releases = "; ".join(f"{b} -> {a} MiB, {stranded} MiB stranded" for b, a, stranded in out.get("releases", []))
        lines.append(f"    memory releases after the deletion: {releases or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/scale", description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--window", type=float, default=300, help="steady window in seconds")
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help="seconds between all Ready and the steady window (default: one status statistics "
                        "period, 300 s, and two scrape rounds)")
    parser.add_argument("--poll", type=float, default=15.0,
                        help="seconds between reads of the operator's /metrics in the window")
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPECDEC_CLUSTER_DIR", str(REPO_ROOT / ".scale-cluster"))
    # Loopback pod IPs of their own (127.231.N.x), apart from any e2e cluster on this machine.
    os.environ.setdefault("SPECDEC_CLUSTER_POD_OCTET", "231")
    # Reads too: the benchmark splits every request by client.
    os.environ["SPECDEC_CLUSTER_AUDIT_READS"] = "true"
    cluster = LocalCluster(ClusterPaths.from_env(), Ports.from_env())
    bench = Bench(args.models, args.replicas, args.window, cluster, settle_s=args.settle, poll_s=args.poll)
    try:
        bench.run()
    finally:
        sys.stdout.write(report(bench) + "\n")
        report_file = cluster.paths.root.parent / f"{cluster.paths.root.name}-report.json"
        report_file.write_text(json.dumps(bench.out, indent=1, default=str))
        if not args.keep:
            cluster.down(quiet=True)
    return 0
