"""Traffic for the e2e tests: the loopback Gateway/kube-proxy stand-in and open-loop load through it.

See docs/local-traffic.md: requests reach the simulators through `specdec-runtime gateway`, by an HTTPRoute's
weights or, for a Service host, by the Service's ready pods, as a Gateway and kube-proxy would.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from localcluster.cluster import LocalCluster
from specdec_runtime.loadgen import Lengths, LoadReport, LoadShape, run_load
from specdec_runtime.routing import STANDIN_GATEWAY_CLASS
from tests.e2e.kube import wait_for
from tests.e2e.operator_process import free_port

RATE = 12.0  # requests per second per model, open loop


class GatewayStandIn:
    """`specdec-runtime gateway` on a free loopback port, registered with hack/cluster for cleanup.

    `name` names its pid and log files; `gateway_class` the Gateways it serves. Requests for a Service host
    (`<service>.<namespace>.svc`) it serves whatever the class, as kube-proxy would."""

    def __init__(self, cluster: LocalCluster, name: str = "gateway-standin",
                 gateway_class: str = STANDIN_GATEWAY_CLASS) -> None:
        self.cluster, self.name, self.gateway_class = cluster, name, gateway_class
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pid_file = cluster.paths.pids / f"{name}.pid"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> GatewayStandIn:
        command = [str(Path(sys.executable).parent / "specdec-runtime"), "gateway", "--kubeconfig",
                   str(self.cluster.paths.kubeconfig), "--listen", f"127.0.0.1:{self.port}",
                   "--gateway-class", self.gateway_class]
        with (self.cluster.paths.logs / f"{self.name}.log").open("ab") as sink:
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


class BackgroundLoad:
    """Open-loop load for one model's hostname until stopped, on its own event loop thread."""

    def __init__(self, url: str, host: str, seed: int, model: str, rate: float = RATE) -> None:
        self.shape = LoadShape(rate=rate, prompt=Lengths(64, 0.5, high=512), output=Lengths(24, 0.4, high=96),
                               stream=False, seed=seed)
        # `model`: the served name, spec.model.servedName or else spec.model.name (the hub id).
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
