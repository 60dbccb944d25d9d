"""The local metrics pipeline: Prometheus and KEDA (operator + metrics server) out of cluster, on loopback.

`hack/cluster autoscaling` starts them next to a running local control plane (docs/autoscaling.md):

- Prometheus scrapes what `prometheus-targets.json` in the cluster dir lists (file_sd; the fake pods have loopback
  IPs, so a test writes their addresses there) and answers queries on 127.0.0.1.
- KEDA's operator watches ScaledObjects, creates their HPAs and serves its scalers' metrics over gRPC (mutual TLS
  with a cert signed by the cluster CA) on loopback.
- KEDA's metrics server ("adapter") serves external.metrics.k8s.io on loopback. The API server's aggregator
  reaches it through an APIService whose Service is an ExternalName `127.0.0.1`: without
  --enable-aggregator-routing, kube-aggregator resolves a Service with proxy.ResolveCluster, which for an
  ExternalName dials https://<externalName>:<APIService port>. No ClusterIP and no Endpoints are involved (the
  API server refuses loopback addresses in those anyway).

Every process is registered in the cluster's PID directory, so `hack/cluster down` stops it with the rest.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster import build, certs, processes
from localcluster.cluster import LocalCluster, port_base
from localcluster.errors import ClusterError

KEDA_NAMESPACE = "keda"
# The names KEDA's own manifests use (config/metrics-server); the aggregator checks the metrics server's cert
# against <service>.<namespace>.svc.
METRICS_SERVICE = "keda-metrics-apiserver"
EXTERNAL_METRICS_APISERVICE = "v1beta1.external.metrics.k8s.io"
_CERT_NAMES = ("IP:127.0.0.1", "DNS:localhost", f"DNS:{METRICS_SERVICE}.{KEDA_NAMESPACE}.svc",
               f"DNS:keda-operator.{KEDA_NAMESPACE}.svc")


@dataclass(frozen=True)
class AutoscalingPorts:
    prometheus: int
    keda_grpc: int
    keda_metrics: int
    keda_probes: int
    adapter_secure: int
    adapter_metrics: int

    @classmethod
    def from_env(cls) -> AutoscalingPorts:
        base = port_base()
        return cls(base + 90, base + 666, base + 680, base + 681, base + 643, base + 682)


# The ports each process listens on, by AutoscalingPorts field.
_COMPONENT_PORTS = {
    "prometheus": ("prometheus",),
    "keda-operator": ("keda_grpc", "keda_metrics", "keda_probes"),
    "keda-adapter": ("adapter_secure", "adapter_metrics"),
}


def port_bindable(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:port now (as processes.check_port_free tests it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_loopback_port() -> int:
    """A port the kernel has free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def keda_certs(pki: Path) -> Path:
    """ca.crt, tls.crt and tls.key in one directory, as KEDA's operator and metrics server both read them: one
    cert for both ends of their mutual-TLS gRPC link and for the metrics server's HTTPS, signed by the cluster CA."""
    directory = pki / "keda"
    if (directory / "tls.crt").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    certs.signed_cert(
        pki, "keda", "/CN=keda-local",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={','.join(_CERT_NAMES)}\n",
    )
    shutil.copy(pki / "ca.crt", directory / "ca.crt")
    shutil.copy(pki / "keda.crt", directory / "tls.crt")
    shutil.copy(pki / "keda.key", directory / "tls.key")
    return directory


def cluster_objects(ca_cert: Path, adapter_port: int) -> list[dict[str, object]]:
    """KEDA's namespace, the ExternalName Service standing for the metrics server, and its APIService."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NAMESPACE}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": METRICS_SERVICE, "namespace": KEDA_NAMESPACE},
         "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": EXTERNAL_METRICS_APISERVICE},
         "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                  "service": {"name": METRICS_SERVICE, "namespace": KEDA_NAMESPACE, "port": adapter_port},
                  "caBundle": base64.b64encode(ca_cert.read_bytes()).decode(),
                  "groupPriorityMinimum": 100, "versionPriority": 100}},
    ]


def prometheus_config(targets_file: Path, scrape_interval_s: int = 5) -> str:
    return yaml.safe_dump({
        "global": {"scrape_interval": f"{scrape_interval_s}s", "evaluation_interval": f"{scrape_interval_s}s"},
        "scrape_configs": [{
            "job_name": "pods",
            "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
        }],
    })


class AutoscalingPipeline:
    def __init__(self, cluster: LocalCluster, ports: AutoscalingPorts | None = None) -> None:
        self.cluster = cluster
        if ports is None and self.ports_file.is_file():  # the ports the running processes were given
            ports = AutoscalingPorts(**json.loads(self.ports_file.read_text()))
        self.ports = ports or AutoscalingPorts.from_env()
        self.tools: dict[str, Path] = {}

    @property
    def ports_file(self) -> Path:
        return self.cluster.paths.root / "autoscaling-ports.json"

    def _claim_ports(self) -> None:
        """Move a port that is taken to a free one, for the processes not running yet, and remember the ports.

        The ports sit at fixed offsets from the cluster's port base, and a base inside the kernel's ephemeral range
        (32768-60999 here; 35000 is one) shares them with client sockets: the API server's many short etcd
        connections took base + 680 and base + 682 on one machine (loopback reuses TIME_WAIT ports for the same
        peer, so such a port stays taken). Who dials these ports reads them from here: the test and KEDA's
        ScaledObjects from `prometheus_url`, the metrics server from its flags, the aggregator from the APIService.
        """
        running = processes.running_components(self.cluster.paths.pids)
        for component, fields in _COMPONENT_PORTS.items():
            if component in running:
                continue
            for name in fields:
                port = getattr(self.ports, name)
                if not port_bindable(port):
                    spare = free_loopback_port()
                    self.cluster.log(f"port {port} for {component} is taken (a client socket in the ephemeral range, "
                                     f"most likely): using {spare}")
                    self.ports = dataclasses.replace(self.ports, **{name: spare})
        self.ports_file.write_text(json.dumps(dataclasses.asdict(self.ports)) + "\n")

    @property
    def targets_file(self) -> Path:
        """file_sd targets: `[{"targets": ["127.x.y.z:8000"], "labels": {...}}]`, re-read every 5 s."""
        return self.cluster.paths.root / "prometheus-targets.json"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.prometheus}"

    def up(self) -> None:
        if not self.cluster.is_ready():
            raise ClusterError("the local cluster is not up: run `hack/cluster up` first")
        self.tools = build.ensure_tools(self.cluster.log, autoscaling=True)
        self.cluster.binaries = build.ensure_binaries(self.cluster.log)
        paths = self.cluster.paths
        kubeconfig = str(paths.kubeconfig)
        cert_dir = keda_certs(paths.root / "pki")
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts",
                             *[arg for path in build.keda_crd_files() for arg in ("-f", str(path))])
        for crd in ("scaledobjects.keda.sh", "triggerauthentications.keda.sh"):
            self.cluster.wait_crd_established(crd)
        if not self.targets_file.exists():
            self.targets_file.write_text("[]\n")
        (paths.root / "prometheus.yml").write_text(prometheus_config(self.targets_file))
        self._claim_ports()
        self._start("prometheus", [
            str(self.tools["prometheus"]), f"--config.file={paths.root / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{self.ports.prometheus}",
            f"--storage.tsdb.path={paths.root / 'prometheus-data'}", "--log.level=warn",
        ], (self.ports.prometheus,))
        env = ["env", f"KUBECONFIG={kubeconfig}", f"POD_NAMESPACE={KEDA_NAMESPACE}",
               f"KEDA_CLUSTER_OBJECT_NAMESPACE={KEDA_NAMESPACE}", "WATCH_NAMESPACE="]
        self._start("keda-operator", [
            *env, str(self.tools["keda"]), "--leader-elect=false", "--zap-log-level=info", "--zap-encoder=console",
            "--enable-cert-rotation=false", "--enable-webhook-patching=false", "--enable-apiservice-patching=false",
            f"--cert-dir={cert_dir}", f"--ca-dir={cert_dir}",
            f"--metrics-bind-address=127.0.0.1:{self.ports.keda_metrics}",
            f"--health-probe-bind-address=127.0.0.1:{self.ports.keda_probes}",
            f"--metrics-service-bind-address=127.0.0.1:{self.ports.keda_grpc}",
        ], (self.ports.keda_grpc, self.ports.keda_metrics, self.ports.keda_probes))
        self._start("keda-adapter", [
            *env, str(self.tools["keda-adapter"]), "--zap-log-level=info", "--zap-encoder=console",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports.adapter_secure}",
            f"--cert-dir={cert_dir}", f"--tls-cert-file={cert_dir / 'tls.crt'}",
            f"--tls-private-key-file={cert_dir / 'tls.key'}",
            f"--lister-kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--metrics-service-address=127.0.0.1:{self.ports.keda_grpc}",
            f"--port={self.ports.adapter_metrics}",
        ], (self.ports.adapter_secure, self.ports.adapter_metrics))
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=yaml.safe_dump(
            {"apiVersion": "v1", "kind": "List", "items": cluster_objects(paths.root / "pki" / "ca.crt",
                                                                           self.ports.adapter_secure)}))
        self._wait("Prometheus ready", "prometheus", self._prometheus_ready, 60)
        self._wait(f"APIService {EXTERNAL_METRICS_APISERVICE} Available", "keda-adapter", self._apiservice_available,
                   120)
        self.cluster.log(f"Prometheus on {self.prometheus_url} (targets: {self.targets_file}); KEDA serves "
                         f"/apis/external.metrics.k8s.io/v1beta1 through the aggregator")

    def _start(self, name: str, command: list[str], ports: tuple[int, ...]) -> None:
        if name in processes.running_components(self.cluster.paths.pids):
            return
        component = processes.Component(name, command, ports)
        process = processes.start(component, self.cluster.paths.logs, self.cluster.paths.pids)
        time.sleep(1)
        processes.ensure_running(component, process, self.cluster.paths.logs)

    def _wait(self, what: str, component: str, ready: Callable[[], bool], timeout_s: float) -> None:
        self.cluster._wait(what, component, ready, timeout_s)  # the cluster's exit checks and log tails

    def _prometheus_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.prometheus_url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _apiservice_available(self) -> bool:
        out = self.cluster.kubectl("get", "apiservice", EXTERNAL_METRICS_APISERVICE, "-o", "json", check=False)
        if not out:
            return False
        conditions = json.loads(out).get("status", {}).get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)
