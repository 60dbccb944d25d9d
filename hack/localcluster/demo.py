"""`hack/demo`: control plane, simulated AMD fleet, chart, operator, fleet driver and examples; K converging live.

Everything the demo starts is registered in the cluster's PID directory, so `hack/cluster down` stops it
too. Ctrl-C (or the end of `--duration`) tears it all down: the processes, then the cluster, unless the
demo runs in a cluster it did not start (`--reuse-cluster`), which it leaves as it found it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from localcluster import processes
from localcluster.cluster import REPO_ROOT, LocalCluster
from localcluster.demoplot import PoolHistory
from localcluster.errors import ClusterError
from specdec_operator.fleetview import render_table

DEMO_NAMESPACE = "demo"
# As the README installs it into a real cluster.
RELEASE, RELEASE_NAMESPACE = "specdec-operator", "specdec-system"
# Each example runs a simulator profile with a clear best K, so every pool has somewhere visible to go:
# the EAGLE-3 pool climbs from 3 to 7, both draft-model pools come down from 4 to 2.
DEMO_PROFILES = {
    "eagle3-mi300x.yaml": "e2e-opt-k7",
    "draft-70b-mi300x-mi250x.yaml": "e2e-opt-k2",
    "ngram-w7900.yaml": "quick",
}
# The examples tune every 60 s with a 10-minute cooldown, as production should; a demo has minutes.
DEMO_AUTOTUNE = {"intervalSeconds": 10, "cooldownSeconds": 30, "minSamples": 2000}
SAMPLE_EVERY_S = 3.0
READY_WAIT_S = 120.0
_CLEAR_SCREEN = "\x1b[H\x1b[2J"


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


def demo_models() -> list[dict[str, Any]]:
    """The examples as the demo applies them: same placement and drafters, a simulator profile, fast tuning."""
    models = []
    for file_name, profile in DEMO_PROFILES.items():
        for obj in yaml.safe_load_all((REPO_ROOT / "examples" / file_name).read_text()):
            spec = obj["spec"]
            spec.setdefault("runtime", {})["simulatorProfile"] = profile
            spec["speculation"]["autotune"] = {**spec["speculation"].get("autotune", {}), **DEMO_AUTOTUNE}
            models.append(obj)
    return models


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class Demo:
    def __init__(self, cluster: LocalCluster, reuse_cluster: bool) -> None:
        self.cluster = cluster
        self.reuse_cluster = reuse_cluster
        self.metrics_port = _free_port()
        self.children: dict[str, processes.Component] = {}
        # What teardown may undo: never a cluster, release or namespace the demo found already there.
        self.owns_cluster = False
        self.installed = False
        self.applied_at = 0.0  # monotonic clock; the live view and the plot count from here

    # --- bring-up ---------------------------------------------------------------------------------------

    def start(self) -> None:
        running = self.cluster.status()["running"] or self.cluster.is_ready()
        if running and not self.reuse_cluster:
            raise ClusterError(
                f"a local cluster is already running in {self.cluster.paths.root} (perhaps someone's e2e tests): "
                "pass --reuse-cluster to run the demo inside it, stop it with `hack/cluster down`, or give the "
                "demo its own with SPECDEC_CLUSTER_DIR=/tmp/specdec-demo SPECDEC_CLUSTER_PORT_BASE=27000"
            )
        if self.reuse_cluster and not running:
            raise ClusterError("--reuse-cluster: no cluster is running here; start one with `hack/cluster up`")
        step("control plane with the simulated AMD fleet (the first run builds it from Go modules: minutes)")
        self.owns_cluster = not running
        self.cluster.up()
        step(f"helm install {RELEASE} charts/specdec-operator -n {RELEASE_NAMESPACE} (CRDs, RBAC, dashboard)")
        self.installed = True
        self._helm_install()
        models = demo_models()
        profiles = ", ".join(f"{m['metadata']['name']}: {m['spec']['runtime']['simulatorProfile']}" for m in models)
        step(f"applying {len(models)} examples into namespace {DEMO_NAMESPACE} with simulator profiles ({profiles}), "
             f"autotune every {DEMO_AUTOTUNE['intervalSeconds']} s")
        self.cluster.kubectl("create", "namespace", DEMO_NAMESPACE, check=False)
        # The examples read their Hugging Face token from this Secret; the fleet driver, like a kubelet, holds a
        # pod whose Secret is missing in CreateContainerConfigError. The simulators download nothing.
        self.cluster.kubectl("create", "secret", "generic", "hf-token", "-n", DEMO_NAMESPACE,
                             "--from-literal=token=demo-placeholder", check=False)
        self.cluster.kubectl("apply", "-n", DEMO_NAMESPACE, "-f", "-", input_text=yaml.safe_dump_all(models))
        self.applied_at = time.monotonic()
        step("starting the operator (standalone, reconcile every 5 s, scrape every 3 s)")
        self._start_operator()
        step("starting the fleet driver (one vLLM simulator per runtime pod, on the pod's loopback IP)")
        self._start_child("demo-fleet-driver", [
            str(Path(sys.executable).parent / "specdec-runtime"), "fleet-driver",
            "--kubeconfig", str(self.cluster.paths.kubeconfig),
            "--log-dir", str(self.cluster.paths.logs / "simulators"), "--default-profile", "quick",
            # The gateway stand-in drops a deleted pod as soon as its watch says so: 2 s of the 10 s preStop wait.
            "--max-pre-stop-seconds", "2"])
        self._wait_for_ready_models(len(models))

    def _helm_install(self) -> None:
        helm = self.cluster.binaries["helm"]
        # The operator runs on this machine: KWOK nodes run no containers, so the chart's single replica is
        # a placeholder pod that never acts. Peering is off because the local operator runs standalone.
        command = [str(helm), "--kubeconfig", str(self.cluster.paths.kubeconfig), "upgrade", "--install",
                   RELEASE, str(REPO_ROOT / "charts" / "specdec-operator"), "--namespace", RELEASE_NAMESPACE,
                   "--create-namespace", "--set", "replicaCount=1", "--set", "peering.enabled=false",
                   "--wait", "--timeout", "120s"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ClusterError(f"helm install failed: {result.stderr.strip()}")

    def _start_operator(self) -> None:
        os.environ.update({
            "KUBECONFIG": str(self.cluster.paths.kubeconfig),
            "SPECDEC_STANDALONE": "true",
            "SPECDEC_CLUSTER_WIDE": "true",  # the demo operator watches every namespace
            "SPECDEC_RECONCILE_INTERVAL_SECONDS": "5",
            "SPECDEC_SCRAPE_INTERVAL_SECONDS": "3",
            # Simulated pods live on loopback IPs; the operator must never dial anything else here.
            "SPECDEC_SCRAPE_LOOPBACK_ONLY": "true",
            "SPECDEC_METRICS_PORT": str(self.metrics_port),
            # The demo plots tokens/s from status: refresh it often (production: every 5 minutes).
            "SPECDEC_STATUS_STATS_PERIOD_SECONDS": "15",
        })
        self._start_child("demo-operator", [sys.executable, "-m", "specdec_operator.cli", "run"])
        deadline = time.monotonic() + 60
        while not self._operator_serving():
            self._check_children()
            if time.monotonic() > deadline:
                raise ClusterError(f"the operator did not start within 60 s; see {self._log('demo-operator')}")
            time.sleep(0.5)

    def _start_child(self, name: str, command: list[str]) -> None:
        component = processes.Component(name, command)
        (self.cluster.paths.logs / "simulators").mkdir(parents=True, exist_ok=True)
        process = processes.start(component, self.cluster.paths.logs, self.cluster.paths.pids)
        self.children[name] = component
        time.sleep(1)
        processes.ensure_running(component, process, self.cluster.paths.logs)

    def _operator_serving(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _log(self, name: str) -> Path:
        return self.cluster.paths.logs / f"{name}.log"

    def _check_children(self) -> None:
        alive = processes.running_components(self.cluster.paths.pids)
        for name in self.children:
            if name not in alive:
                raise ClusterError(f"{name} exited; last lines of {self._log(name)}:\n"
                                   f"{processes.log_tail(self._log(name))}")

    def models(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(
            self.cluster.kubectl("get", "speculativemodels", "-n", DEMO_NAMESPACE, "-o", "json"))["items"]
        return items

    def _wait_for_ready_models(self, expected: int) -> None:
        deadline = time.monotonic() + READY_WAIT_S
        reported = ""
        while time.monotonic() < deadline:
            self._check_children()
            ready = sum(any(c["type"] == "Ready" and c["status"] == "True"
                            for c in m.get("status", {}).get("conditions", [])) for m in self.models())
            progress = f"    {ready}/{expected} models Ready (pods scheduled on KWOK nodes, simulators loading)"
            if progress != reported:
                print(progress, flush=True)
                reported = progress
            if ready == expected:
                return
            time.sleep(2)
        print(f"    not every model is Ready after {READY_WAIT_S:.0f} s; the fleet view shows why", flush=True)

    # --- live view --------------------------------------------------------------------------------------

    def watch(self, duration_s: float | None, refresh_s: float, history: PoolHistory) -> None:
        tty = sys.stdout.isatty()
        # In a log file a table every few seconds drowns everything else; print one every 30 s there.
        refresh_s = refresh_s if tty else max(refresh_s, 30.0)
        next_view = time.monotonic()
        while duration_s is None or time.monotonic() - self.applied_at < duration_s:
            self._check_children()
            elapsed = time.monotonic() - self.applied_at
            try:
                models = self.models()
            except ClusterError as error:
                models, problem = [], f"error: {error}\n"
            else:
                problem = ""
                history.record(elapsed, models)
            if time.monotonic() >= next_view:
                self._show(models, problem, elapsed, duration_s, tty)
                next_view += refresh_s
            time.sleep(min(SAMPLE_EVERY_S, refresh_s))

    def _show(self, models: list[dict[str, Any]], problem: str, elapsed: float, duration_s: float | None,
              tty: bool) -> None:
        remaining = "" if duration_s is None else f", stops in {max(duration_s - elapsed, 0):.0f}s"
        header = (
            f"specdec demo: {elapsed:.0f}s since the examples were applied{remaining}; Ctrl-C tears everything down\n"
            f"K column: effective K, or effective->recommended while the tuner moves it. "
            f"export KUBECONFIG={self.cluster.paths.kubeconfig}\n"
            f"logs: {self.cluster.paths.logs}   operator metrics: http://127.0.0.1:{self.metrics_port}/metrics\n\n"
        )
        body = problem or (render_table(models) if models else "No SpeculativeModels yet.\n")
        sys.stdout.write(f"{_CLEAR_SCREEN if tty else chr(10)}{header}{body}")
        sys.stdout.flush()

    # --- teardown ---------------------------------------------------------------------------------------

    def stop(self) -> None:
        # The operator first, so it does not react to the rest going away; then the simulators' driver.
        for name in self.children:
            processes.stop_pid_file(self.cluster.paths.pids / f"{name}.pid")
        if self.owns_cluster:
            self.cluster.down()
        elif self.installed:
            self.cluster.kubectl("delete", "namespace", DEMO_NAMESPACE, "--wait=false", check=False)
            subprocess.run([str(self.cluster.binaries["helm"]), "--kubeconfig", str(self.cluster.paths.kubeconfig),
                            "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE], capture_output=True, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/demo", description=__doc__)
    parser.add_argument("--duration", type=float, metavar="S",
                        help="tear down S seconds after the examples are applied (default: at Ctrl-C)")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="write K and tokens/s per pool over time")
    parser.add_argument("--refresh", type=float, default=2.0, metavar="S", help="fleet view refresh (default 2)")
    parser.add_argument("--reuse-cluster", action="store_true",
                        help="run inside an already running local cluster and leave it running afterwards")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    demo = Demo(LocalCluster(), args.reuse_cluster)
    history = PoolHistory()
    code = 0
    try:
        demo.start()
        demo.watch(args.duration, args.refresh, history)
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        code = 1
    # A second Ctrl-C must not leave half the processes running.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.plot and history.series:
        history.write_png(args.plot, "specdec demo: effective K and tokens/s per pool")
        step(f"wrote {args.plot}")
    if demo.children or demo.owns_cluster or demo.installed:
        step("tearing down what the demo started" + (", control plane included" if demo.owns_cluster else ""))
        with contextlib.suppress(ClusterError):
            demo.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
