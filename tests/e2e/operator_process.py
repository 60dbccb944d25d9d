"""The operator as a real process against the local cluster, registered with hack/cluster for cleanup."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from localcluster.cluster import LocalCluster
from tests.e2e.kube import wait_for

# How often the operator scrapes its pods here (tests/e2e/canary_recording.py records at the same period).
SCRAPE_INTERVAL_S = 2

E2E_SETTINGS = {
    "SPECDEC_STANDALONE": "true",
    "SPECDEC_RECONCILE_INTERVAL_SECONDS": "5",
    "SPECDEC_SCRAPE_INTERVAL_SECONDS": str(SCRAPE_INTERVAL_S),
    "SPECDEC_SCRAPE_TIMEOUT_SECONDS": "2",
    # Fake pods have loopback IPs; refusing anything else keeps tests from dialling private ranges.
    "SPECDEC_SCRAPE_LOOPBACK_ONLY": "true",
    # Refused owned objects are retried after 2, 4, 8, ... s (production: 10 s doubling to 10 min).
    "SPECDEC_REFUSED_WRITE_BACKOFF_SECONDS": "2",
    # Timestamps and the object on every line: a failed run's logs must say when and about what.
    "SPECDEC_LOG_FORMAT": "full",
}


STARTUP_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# A deleted pod's preStop wait (10 s as rendered), as the tests' kubelet stand-in runs it: the Gateway stand-in drops a
# deleted pod as soon as its watch says so, and tests wait for old pods to go.
MAX_PRE_STOP_S = "1"

class FleetDriverProcess:
    """The kubelet stand-in that runs a simulator for every runtime pod on its loopback pod IP."""

    def __init__(self, cluster: LocalCluster, default_profile: str = "quick") -> None:
        self.cluster = cluster
        self.log_dir = cluster.paths.logs / "simulators"
        self.command = [str(Path(sys.executable).parent / "specdec-runtime"), "fleet-driver",
                        "--kubeconfig", str(cluster.paths.kubeconfig), "--log-dir", str(self.log_dir),
                        "--default-profile", default_profile, "--max-pre-stop-seconds", MAX_PRE_STOP_S]
        self.pid_file = cluster.paths.pids / "fleet-driver.pid"
        self.process: subprocess.Popen[bytes] | None = None

    def running_pid(self) -> int | None:
        """The pid of a fleet driver already serving this cluster (another lane started it), if any."""
        try:
            pid = int(self.pid_file.read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def start(self) -> FleetDriverProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.cluster.paths.logs / "fleet-driver.log"
        offset = log.stat().st_size if log.exists() else 0
        with log.open("ab") as sink:
            self.process = subprocess.Popen(self.command, stdout=sink, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        self.pid_file.write_text(str(self.process.pid))
        # Up once it says it watches the pods (its own line: the log is shared with earlier drivers); a bound, not
        # a wait, as for the operator.
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("fleet driver exited at start; see fleet-driver.log")
            with log.open("rb") as text:
                text.seek(offset)
                if b"watching runtime pods" in text.read():
                    return self
            time.sleep(0.3)
        raise RuntimeError(f"fleet driver not watching pods after {STARTUP_TIMEOUT_S} s; see fleet-driver.log")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)


class OperatorProcess:
    def __init__(self, cluster: LocalCluster, name: str = "operator", kubeconfig: Path | None = None,
                 **settings: str) -> None:
        """`kubeconfig` overrides the cluster's admin one, e.g. to act as a ServiceAccount."""
        self.cluster = cluster
        self.name = name
        self.metrics_port = free_port()
        self.env = {
            **os.environ,
            **E2E_SETTINGS,
            "KUBECONFIG": str(kubeconfig or cluster.paths.kubeconfig),
            "SPECDEC_METRICS_PORT": str(self.metrics_port),
            **settings,
        }
        if not json.loads(self.env.get("SPECDEC_NAMESPACES") or "[]"):
            # No namespaces: the session operator watches the whole cluster, which must be said (settings.py).
            self.env.setdefault("SPECDEC_CLUSTER_WIDE", "true")
        self.log_path = cluster.paths.logs / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        # A ServiceAccount token for an operator serving authenticated metrics (SPECDEC_METRICS_AUTH=true).
        self.metrics_token: str | None = None

    @property
    def pid_file(self) -> Path:
        return self.cluster.paths.pids / f"{self.name}.pid"

    def start(self) -> OperatorProcess:
        command = [sys.executable, "-m", "specdec_operator.cli", "run"]
        with self.log_path.open("ab") as sink:
            self.process = subprocess.Popen(command, env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        self.pid_file.write_text(str(self.process.pid))
        # A bound, not a wait: the operator's imports alone took 33 s of wall time (3 s of CPU) on the shared
        # 2-core machine at load 23, and tests with a scoped operator start several.
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"operator exited at start; log tail:\n{self.log_tail()}")
            if self.metrics() is not None:
                return self
            time.sleep(0.3)
        raise RuntimeError(f"operator metrics never came up; log tail:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.pid_file.unlink(missing_ok=True)

    def restart(self, sig: int = signal.SIGTERM) -> OperatorProcess:
        """Stop (SIGTERM, or SIGKILL to simulate a crash) and start again with a fresh metrics registry."""
        self.stop(sig)
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> dict[str, float] | None:
        """Samples of the operator's own /metrics, keyed by name{labels}; None while it is not serving."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.metrics_port}/metrics")
        if self.metrics_token:
            request.add_header("Authorization", f"Bearer {self.metrics_token}")
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return None
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}"] = sample.value
        return samples

    def total(self, prefix: str) -> float:
        return sum(v for k, v in (self.metrics() or {}).items() if k.startswith(prefix + "{"))

    def model_passes(self, namespace: str, model: str) -> float:
        """Finished reconcile passes of one model since this process started (specdec_model_reconciles_total)."""
        key = f"specdec_model_reconciles_total{{model={model},namespace={namespace}}}"
        return (self.metrics() or {}).get(key, 0.0)

    def tuner_evaluations(self, namespace: str, model: str) -> float:
        """The tuner's evaluations of one model since this process started: every evaluation counts one decision
        per pool in specdec_tuner_decisions_total (Hold included), so the fewest over the pools is the count."""
        per_pool: dict[str, float] = {}
        for key, value in (self.metrics() or {}).items():
            if not key.startswith("specdec_tuner_decisions_total{"):
                continue
            labels = dict(part.split("=", 1) for part in key[key.index("{") + 1:-1].split(","))
            if labels.get("namespace") == namespace and labels.get("model") == model:
                per_pool[labels["pool"]] = per_pool.get(labels["pool"], 0.0) + value
        return min(per_pool.values(), default=0.0)

    def wait_tuner_evaluations(self, namespace: str, models: Sequence[str], evaluations: int,
                               timeout_s: float) -> None:
        """Until each model has had `evaluations` more tuner evaluations than at the call."""
        self._wait_more("tuner evaluations", self.tuner_evaluations, namespace, models, evaluations, timeout_s, 1)

    def _wait_more(self, what: str, count: Callable[[str, str], float], namespace: str,
                   models: Sequence[str], more: int, timeout_s: float, interval_s: float) -> None:
        """Until `count(namespace, model)` has grown by `more` for each model since the call."""
        before = {name: count(namespace, name) for name in models}

        def done() -> dict[str, float]:
            return {name: count(namespace, name) - before[name] for name in models}
        wait_for(f"{more} {what} of each of {namespace}/{','.join(models)}",
                 lambda: min(done().values()) >= more, timeout_s, interval_s, describe=done)

    def wait_passes(self, namespace: str, model: str | Sequence[str], passes: int, timeout_s: float = 120) -> None:
        """Until `passes` more passes of the model (of each model named) have finished: a pass, not a clock, is
        what "nothing changed for N passes" means. The first may have begun before the call, so at least
        passes - 1 ran whole after."""
        models = (model,) if isinstance(model, str) else tuple(model)
        self._wait_more("reconcile passes", self.model_passes, namespace, models, passes, timeout_s, 0.5)


# The `scoped_operator` fixture (tests/e2e/conftest.py): settings as keyword arguments, a started operator back.
OperatorFactory = Callable[..., OperatorProcess]
