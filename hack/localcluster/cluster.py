"""Bring the local control plane up and down: etcd, kube-apiserver, controller-manager, scheduler, kwok."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster import build, certs, processes
from localcluster.errors import ClusterError
from localcluster.fleet import FLEETS_DIR, load_fleet, node_objects
from localcluster.processes import Component
from localcluster.versions import KUBERNETES_VERSION

Log = Callable[[str], None]

REPO_ROOT = Path(__file__).resolve().parents[2]
# Stopped in reverse: kwok and the controllers before the API server, etcd last.
COMPONENT_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Short names `hack/cluster restart` accepts besides the full ones.
COMPONENT_ALIASES = {
    "apiserver": "kube-apiserver",
    "controller-manager": "kube-controller-manager",
    "scheduler": "kube-scheduler",
}
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # Writes only: the steady-state check counts what clients change, not what they read.
  # Bodies of the writes that carry a K decision and its rollout, so fault-injection tests can count
  # Deployment template changes (rollouts), decisions written to status and route weights.
  - level: RequestResponse
    verbs: [create, update, patch, delete]
    resources:
      - {group: apps, resources: [deployments]}
      - {group: specdec.io, resources: [speculativemodels/status]}
      - {group: gateway.networking.k8s.io, resources: [httproutes]}
  # kopf writes a model's finalizer as a JSON patch whose first op tests metadata.resourceVersion: the body
  # tells that optimistic-concurrency 422 apart from a refused object.
  - level: Request
    verbs: [patch]
    resources:
      - {group: specdec.io, resources: [speculativemodels]}
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
"""
# hack/scale splits every request by client, reads included (SPECDEC_CLUSTER_AUDIT_READS=true).
AUDIT_POLICY_ALL = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""


def stderr_log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


DEFAULT_PORT_BASE = 26000


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def from_env(cls) -> Ports:
        base = port_base()
        return cls(base + 79, base + 80, base + 443, base + 257, base + 259)


def port_base() -> int:
    return int(os.environ.get("SPECDEC_CLUSTER_PORT_BASE", str(DEFAULT_PORT_BASE)))


def pod_network_octet() -> int:
    """Second octet of the cluster's loopback pod network (127.X.N.0/24 per node).

    Derived from the port base, so two clusters on one machine (say, base 26000 and 27000) hand out
    different pod IPs and their simulators never collide on an address; SPECDEC_CLUSTER_POD_OCTET overrides.
    """
    explicit = os.environ.get("SPECDEC_CLUSTER_POD_OCTET")
    octet = int(explicit) if explicit is not None else ((port_base() - DEFAULT_PORT_BASE) // 1000) % 256
    if not 0 <= octet <= 255:
        raise ClusterError(f"SPECDEC_CLUSTER_POD_OCTET={octet} is not an octet (0-255)")
    return octet


@dataclass(frozen=True)
class ClusterPaths:
    root: Path

    @classmethod
    def from_env(cls) -> ClusterPaths:
        return cls(Path(os.environ.get("SPECDEC_CLUSTER_DIR", REPO_ROOT / ".cluster")).resolve())

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def state(self) -> Path:
        return self.root / "state.json"


class LocalCluster:
    def __init__(self, paths: ClusterPaths | None = None, ports: Ports | None = None, log: Log = stderr_log) -> None:
        self.paths = paths or ClusterPaths.from_env()
        self.ports = ports or Ports.from_env()
        self.log = log
        self.binaries: dict[str, Path] = {}

    # --- public -----------------------------------------------------------------------------------------

    def up(self, fleet_file: Path | None = None) -> float:
        """Start everything and load the fleet; returns seconds from process start to nodes Ready."""
        self.binaries = build.ensure_binaries(self.log)
        if self.is_ready():
            self.log(f"cluster already up: export KUBECONFIG={self.paths.kubeconfig}")
            return 0.0
        self.down(quiet=True)
        started = time.monotonic()
        for directory in (self.paths.root, self.paths.logs, self.paths.pids):
            directory.mkdir(parents=True, exist_ok=True)
        cluster_certs = certs.generate_certs(self.paths.root / "pki")
        self._write_kubeconfig(cluster_certs)
        reads = os.environ.get("SPECDEC_CLUSTER_AUDIT_READS", "").lower() in ("1", "true")
        (self.paths.root / "audit-policy.yaml").write_text(AUDIT_POLICY_ALL if reads else AUDIT_POLICY)
        stages = build.kwok_stage_files(self.paths.root / "kwok-stages")
        try:
            self._start("etcd", self._etcd_command(), (self.ports.etcd_client, self.ports.etcd_peer))
            self._wait(f"etcd on 127.0.0.1:{self.ports.etcd_client}", "etcd", self._etcd_healthy, 30)
            self._start("kube-apiserver", self._apiserver_command(cluster_certs), (self.ports.apiserver,))
            self._wait("kube-apiserver /readyz", "kube-apiserver", self.is_ready, 90)
            self._start("kube-controller-manager", self._controller_manager_command(cluster_certs),
                        (self.ports.controller_manager,))
            self._start("kube-scheduler", self._scheduler_command(), (self.ports.scheduler,))
            self._start("kwok", self._kwok_command(stages), ())
            self.apply_fleet(fleet_file or FLEETS_DIR / "demo.yaml")
            self.kubectl("apply", "--server-side", "--force-conflicts",
                         *[arg for path in build.gateway_api_crd_files() for arg in ("-f", str(path))])
            self._wait("nodes Ready", "kwok", self._nodes_ready, 90)
            self._wait("default ServiceAccount", "kube-controller-manager", self._default_service_account, 60)
        except BaseException:
            self.down(quiet=True)
            raise
        elapsed = time.monotonic() - started
        self.paths.state.write_text(json.dumps({"ports": self.ports.__dict__, "ready_seconds": elapsed}))
        self.log(f"cluster ready in {elapsed:.1f}s")
        self.log(f"export KUBECONFIG={self.paths.kubeconfig}")
        self.log(f"export PATH={self.binaries['kubectl'].parent}:$PATH   # kubectl {KUBERNETES_VERSION}")
        return elapsed

    def down(self, quiet: bool = False) -> list[str]:
        stopped = []
        for name in reversed(self._pid_names()):
            if processes.stop_pid_file(self.paths.pids / f"{name}.pid"):
                stopped.append(name)
        if self.paths.root.exists():
            shutil.rmtree(self.paths.root)
        if not quiet:
            self.log(f"stopped: {', '.join(stopped) or 'nothing was running'}; removed {self.paths.root}")
        return stopped

    def restart(self, component: str, kill: bool = False, down_seconds: float = 0.0) -> float:
        """Stop one component's process group (SIGTERM, or SIGKILL with `kill`) and start it again with the
        flags it was started with, keeping its data (etcd's data dir, the audit log); waits until the
        control plane answers again. Returns the seconds from the stop to healthy."""
        started = time.monotonic()
        sig = signal.SIGKILL if kill else signal.SIGTERM
        if not self.stop_component(component, sig):
            self.log(f"{component} was not running; starting it")
        if down_seconds > 0:
            time.sleep(down_seconds)
        self.start_component(component)
        elapsed = time.monotonic() - started
        self.log(f"restarted {self._component(component)} ({sig.name}) in {elapsed:.1f}s")
        return elapsed

    def _component(self, component: str) -> str:
        name = COMPONENT_ALIASES.get(component, component)
        if name not in COMPONENT_ORDER:
            known = ", ".join([*COMPONENT_ORDER, *COMPONENT_ALIASES])
            raise ClusterError(f"unknown component {component!r}: one of {known}")
        return name

    def stop_component(self, component: str, sig: signal.Signals = signal.SIGTERM) -> bool:
        """Stop one component's process group, keeping what start_component() needs to start it again;
        True if it was running. Returns once the process is gone (its ports are closed)."""
        name = self._component(component)
        processes.load_component(self.paths.pids, name)  # fails now, not at the start, if nothing is recorded
        return processes.stop_pid_file(self.paths.pids / f"{name}.pid", sig=sig)

    def start_component(self, component: str) -> None:
        """Start a component stopped by stop_component() with the flags it was first started with, keeping
        its data; waits until the control plane answers again."""
        name = self._component(component)
        recorded = processes.load_component(self.paths.pids, name)
        self._start(name, recorded.command, recorded.ports)
        if name == "etcd":
            self._wait(f"etcd on 127.0.0.1:{self.ports.etcd_client}", "etcd", self._etcd_healthy, 30)
        if name in ("etcd", "kube-apiserver"):
            # The API server's /readyz includes its etcd check, so this also covers an etcd restart.
            self._wait("kube-apiserver /readyz", "kube-apiserver", self.is_ready, 90)

    def status(self) -> dict[str, object]:
        return {
            "dir": str(self.paths.root),
            "running": processes.running_components(self.paths.pids),
            "ready": self.is_ready(),
            "kubeconfig": str(self.paths.kubeconfig),
        }

    def is_ready(self) -> bool:
        if not self.paths.kubeconfig.exists():
            return False
        pki = self.paths.root / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.ports.apiserver}/readyz", context=context,
                                        timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        kubectl = self.binaries.get("kubectl") or shutil.which("kubectl")
        result = subprocess.run([str(kubectl), "--kubeconfig", str(self.paths.kubeconfig), *args],
                                input=input_text, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:3])} failed: {result.stderr.strip()}")
        return result.stdout

    def wait_crd_established(self, crd: str, timeout_s: float = 30.0) -> None:
        """Wait until the API server serves `crd`. (`kubectl wait --for=condition=Established` fails outright,
        instead of waiting, while a CRD created a moment ago has no status conditions yet.)"""
        jsonpath = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
        deadline = time.monotonic() + timeout_s
        while self.kubectl("get", "crd", crd, "-o", jsonpath, check=False).strip() != "True":
            if time.monotonic() > deadline:
                raise ClusterError(f"CRD {crd} not Established after {timeout_s:.0f}s")
            time.sleep(0.2)

    def apply_fleet(self, fleet_file: Path) -> int:
        nodes = node_objects(load_fleet(fleet_file), pod_network_octet())
        self.kubectl("apply", "--server-side", "-f", "-",
                     input_text=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
        self.log(f"applied {len(nodes)} fake nodes from {fleet_file}")
        return len(nodes)

    # --- internals --------------------------------------------------------------------------------------

    def _pid_names(self) -> list[str]:
        extra = sorted(p.stem for p in self.paths.pids.glob("*.pid")) if self.paths.pids.exists() else []
        # Non-control-plane processes registered by the demo (operator, fleet driver) stop first.
        return list(COMPONENT_ORDER) + [name for name in extra if name not in COMPONENT_ORDER]

    def _start(self, name: str, command: list[str], ports: tuple[int, ...]) -> None:
        component = Component(name, command, ports)
        process = processes.start(component, self.paths.logs, self.paths.pids)
        time.sleep(0.3)
        processes.ensure_running(component, process, self.paths.logs)

    def _wait(self, what: str, component: str, ready: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            if component not in processes.running_components(self.paths.pids):
                raise ClusterError(
                    f"{component} exited at start; last lines of {self.paths.logs / component}.log:\n"
                    f"{processes.log_tail(self.paths.logs / f'{component}.log')}"
                )
            time.sleep(0.25)
        raise ClusterError(
            f"timed out after {timeout_s:.0f}s waiting for {what}; last lines of {self.paths.logs / component}.log:\n"
            f"{processes.log_tail(self.paths.logs / f'{component}.log')}"
        )

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.etcd_client}/health", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _nodes_ready(self) -> bool:
        items = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
        ready = [
            node for node in items
            if any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))
            and not any(t["key"] == "node.kubernetes.io/not-ready" for t in node["spec"].get("taints", []))
        ]
        return bool(items) and len(ready) == len(items)

    def _default_service_account(self) -> bool:
        return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False) != ""

    def _write_kubeconfig(self, cluster_certs: certs.ClusterCerts) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "specdec-local", "cluster": {
                "server": f"https://127.0.0.1:{self.ports.apiserver}",
                "certificate-authority": str(cluster_certs.ca_cert)}}],
            "users": [{"name": "specdec-admin", "user": {
                "client-certificate": str(cluster_certs.admin_cert),
                "client-key": str(cluster_certs.admin_key)}}],
            "contexts": [{"name": "specdec-local", "context": {"cluster": "specdec-local", "user": "specdec-admin"}}],
            "current-context": "specdec-local",
        }
        self.paths.kubeconfig.write_text(yaml.safe_dump(config))

    def _etcd_command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        return [str(self.binaries["etcd"]), "--name=specdec-local", f"--data-dir={self.paths.root / 'etcd'}",
                f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=specdec-local={peer}", "--unsafe-no-fsync=true",
                "--listen-metrics-urls=", "--log-level=warn"]

    def _apiserver_command(self, c: certs.ClusterCerts) -> list[str]:
        return [str(self.binaries["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports.apiserver}",
                f"--tls-cert-file={c.serving_cert}", f"--tls-private-key-file={c.serving_key}",
                f"--client-ca-file={c.ca_cert}",
                # The aggregation layer's front proxy, for extension API servers such as KEDA's metrics server
                # (docs/autoscaling.md); without it they see every proxied request as anonymous.
                f"--requestheader-client-ca-file={c.front_proxy_ca_cert}",
                f"--requestheader-allowed-names={certs.FRONT_PROXY_CLIENT_NAME}",
                "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={c.front_proxy_client_cert}",
                f"--proxy-client-key-file={c.front_proxy_client_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={c.sa_pub}", f"--service-account-signing-key-file={c.sa_key}",
                # The Service range exists only inside the API server's allocator; nothing here dials it.
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=RBAC", "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                f"--audit-policy-file={self.paths.root / 'audit-policy.yaml'}",
                f"--audit-log-path={self.paths.logs / 'audit.log'}",
                "--audit-log-maxsize=200", "--audit-log-maxbackup=1"]

    def _controller_manager_command(self, c: certs.ClusterCerts) -> list[str]:
        return [str(self.binaries["kube-controller-manager"]), f"--kubeconfig={self.paths.kubeconfig}",
                f"--authentication-kubeconfig={self.paths.kubeconfig}",
                f"--authorization-kubeconfig={self.paths.kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={self.ports.controller_manager}",
                f"--root-ca-file={c.ca_cert}", f"--service-account-private-key-file={c.sa_key}",
                "--use-service-account-credentials=false", "--leader-elect=false",
                # KWOK renews leases itself; a late renewal means this host is overloaded, not that a node failed.
                "--node-monitor-grace-period=300s",
                # HPAs (KEDA's, tests/e2e/test_autoscaling.py) re-read their metrics every 5 s instead of 15 s.
                "--horizontal-pod-autoscaler-sync-period=5s"]

    def _scheduler_command(self) -> list[str]:
        return [str(self.binaries["kube-scheduler"]), f"--kubeconfig={self.paths.kubeconfig}",
                f"--authentication-kubeconfig={self.paths.kubeconfig}",
                f"--authorization-kubeconfig={self.paths.kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={self.ports.scheduler}", "--leader-elect=false"]

    def _kwok_command(self, stages: list[Path]) -> list[str]:
        return [str(self.binaries["kwok"]), f"--kubeconfig={self.paths.kubeconfig}",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                # Fallback range for nodes without a podCIDR: loopback too.
                f"--cidr=127.{pod_network_octet()}.255.0/24", "--node-ip=127.0.0.1",
                # Without a lease duration kwok renews no node leases, and every node turns Unknown
                # (pods unready) when the controller manager's grace period runs out.
                "--node-lease-duration-seconds=40",
                *[f"--config={path}" for path in stages]]
