"""Build the control-plane binaries from pinned Go modules, cached per version.

A cold build of kubernetes takes many minutes on two cores, so we print progress lines, and we key the
cache on the module files and flags so a warm start skips `go` entirely.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from localcluster.errors import ClusterError
from localcluster.versions import (
    AUTOSCALING_TOOLS,
    BUILDS,
    GATEWAY_API_VERSION,
    GATEWAY_TOOLS,
    KEDA_VERSION,
    KWOK_VERSION,
    LEGO_VERSION,
    PROMETHEUS_OPERATOR_VERSION,
    TOOLS,
    GoBuild,
)

Log = Callable[[str], None]

_PROGRESS_EVERY_S = 20.0
_REFUSAL_WORDS = ("reading", "invalid version", "unknown revision", "verifying", "410", "404")
# `go: k8s.io/foo@v1.2.3: reading https://...: 404 Not Found` and friends.
_MODULE_FAILURE = re.compile(r"^go: (?:.*?: )?(?P<module>[\w.\-/]+)@(?P<version>v[\w.\-+]+): (?P<reason>.+)$")


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE_DIR", Path.home() / ".cache" / "specdec-operator"))


def go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            "Go is not installed (no `go` on PATH): install Go 1.26 or newer, put it on PATH, and re-run"
        )
    return go


def _build_inputs(build: GoBuild) -> list[Path]:
    """The wrapper module's own files: go.mod, go.sum and any local Go source it builds (see hack/gomod/traefik).

    tools.go only pins the module and is left out, so the keys (and caches) of the other builds stay as they were.
    """
    staged = build.module_dir / STAGED_LEGO_DIR
    local_go = sorted(path for path in build.module_dir.rglob("*.go")
                      if staged not in path.parents and path.name != "tools.go")
    return [build.module_dir / "go.mod", build.module_dir / "go.sum", *local_go]


def _build_key(build: GoBuild) -> str:
    digest = hashlib.sha256()
    for path in _build_inputs(build):
        digest.update(path.read_bytes())
    digest.update(" ".join((build.tags, *build.ldflags, *build.packages.values())).encode())
    return f"{build.name}-{build.version}-{digest.hexdigest()[:12]}"


def binary_dir(build: GoBuild) -> Path:
    return cache_dir() / "bin" / _build_key(build)


def _explain_go_failure(build: GoBuild, output: str) -> ClusterError:
    for line in output.splitlines():
        match = _MODULE_FAILURE.match(line.strip())
        if match and any(word in line for word in _REFUSAL_WORDS):
            return ClusterError(
                f"the Go module proxy refused {match['module']}@{match['version']} ({match['reason'].strip()[:160]}): "
                f"pin a version it serves in {build.module_dir}/go.mod (for kubernetes try the neighbouring minor "
                "release) and re-run"
            )
    tail = "\n".join(output.strip().splitlines()[-15:])
    return ClusterError(f"building {build.name} {build.version} failed; last lines of go's output:\n{tail}")


def _go_build_commands(build: GoBuild, out_dir: Path) -> list[list[str]]:
    """One `go build` for the whole build when `-o DIR/` names every binary right, else one per binary."""
    ldflags = " ".join(("-s", "-w", *build.ldflags))
    command = [go_binary(), "build", "-v", "-trimpath", "-ldflags", ldflags]
    if build.tags:
        command += ["-tags", build.tags]
    if len(build.packages) > 1 and all(name == package.rsplit("/", 1)[-1] for name, package in build.packages.items()):
        return [[*command, "-o", str(out_dir) + "/", *build.packages.values()]]
    # `go build -o DIR/` names a binary after its package's last path element, which for etcd's server module is
    # "v3" and for KEDA's commands "operator" and "adapter"; name each explicitly instead (the second build of a
    # pair reuses the first one's compiled packages from Go's build cache).
    return [[*command, "-o", str(out_dir / name), package] for name, package in build.packages.items()]


def _run_go_build(build: GoBuild, out_dir: Path, log_path: Path, log: Log) -> None:
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}
    started = time.monotonic()
    with log_path.open("w") as sink:
        done = threading.Event()

        def report_progress() -> None:
            while not done.wait(_PROGRESS_EVERY_S):
                compiled = sum(1 for _ in log_path.open())
                log(f"  ... {build.name} {build.version}: {compiled} packages compiled, "
                    f"{time.monotonic() - started:.0f}s elapsed")

        reporter = threading.Thread(target=report_progress, daemon=True)
        reporter.start()
        code = 0
        for command in _go_build_commands(build, out_dir):
            process = subprocess.Popen(command, cwd=build.module_dir, stdout=sink, stderr=subprocess.STDOUT, env=env)
            code = process.wait()
            if code != 0:
                break
        done.set()
    if code != 0:
        raise _explain_go_failure(build, log_path.read_text())
    log(f"  built {build.name} {build.version} in {time.monotonic() - started:.0f}s")


# hack/gomod/traefik replaces lego with a copy staged here (git-ignored); see hack/gomod/traefik/README.md.
STAGED_LEGO_DIR = "lego"
LEGO_MODULE = "github.com/go-acme/lego/v5"


def _stage_lego(build: GoBuild) -> None:
    """lego from the module cache with providers/dns reduced to a factory that refuses every provider.

    Its DNS-01 providers import cloud SDKs the Go proxy here refuses; Traefik only calls the factory.
    """
    staged = build.module_dir / STAGED_LEGO_DIR
    marker = staged / ".staged-version"
    if marker.is_file() and marker.read_text() == LEGO_VERSION:
        return
    source = module_source_dir(LEGO_MODULE, LEGO_VERSION, build.name)
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(source, staged, ignore=shutil.ignore_patterns("cmd", "e2e", "main.go"))
    for path in [staged, *staged.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # the module cache is read-only
    dns = staged / "providers" / "dns"
    shutil.rmtree(dns)
    dns.mkdir()
    shutil.copy(build.module_dir / "lego-dns" / "dns_providers.go", dns / "dns_providers.go")
    marker.write_text(LEGO_VERSION)


def ensure_build(build: GoBuild, log: Log) -> Path:
    """Directory holding the build's binaries, building them first when the cache lacks them.

    Processes that need the same build at once (hack/test brings up two clusters side by side) take turns on a
    lock: the first builds, the others find its result. Two cold kubernetes builds at once would take twice the
    CPU of one on a two-core machine, for the same binaries.
    """
    target = binary_dir(build)
    if _complete(build, target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process building {build.name} {build.version}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete(build, target):  # the process we waited for may have built it
            _build_into(build, target, log)
    return target


def _complete(build: GoBuild, target: Path) -> bool:
    return all((target / name).is_file() for name in build.packages)


def _build_into(build: GoBuild, target: Path, log: Log) -> None:
    if (build.module_dir / "lego-dns").is_dir():
        _stage_lego(build)
    log(f"building {build.name} {build.version} from Go modules (cold builds take minutes; log: "
        f"{cache_dir() / 'logs'})")
    (cache_dir() / "logs").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{build.name}-") as staging:
        _run_go_build(build, Path(staging), cache_dir() / "logs" / f"build-{build.name}.log", log)
        shutil.rmtree(target, ignore_errors=True)
        Path(staging).rename(target)
        # TemporaryDirectory would now remove a path that no longer exists; recreate it empty.
        Path(staging).mkdir()


def ensure_binaries(log: Log) -> dict[str, Path]:
    """Every binary the cluster and the tests need, by name."""
    binaries: dict[str, Path] = {}
    for build in BUILDS:
        directory = ensure_build(build, log)
        binaries.update({name: directory / name for name in build.packages})
    return binaries


def ensure_tools(log: Log, gateway: bool = False, autoscaling: bool = False) -> dict[str, Path]:
    """The test tools (promtool; with `gateway`, Traefik; with `autoscaling`, Prometheus and KEDA), built on demand
    and cached like the control plane."""
    tools: dict[str, Path] = {}
    builds = (*TOOLS, *(GATEWAY_TOOLS if gateway else ()), *(AUTOSCALING_TOOLS if autoscaling else ()))
    for build in builds:
        directory = ensure_build(build, log)
        tools.update({name: directory / name for name in build.packages})
    return tools


def module_source_dir(module: str, version: str, from_build: str) -> Path:
    """Where the Go module cache holds a module's files (downloading it if needed)."""
    build = next(b for b in (*BUILDS, *TOOLS, *GATEWAY_TOOLS, *AUTOSCALING_TOOLS) if b.name == from_build)
    result = subprocess.run(
        [go_binary(), "mod", "download", "-json", f"{module}@{version}"],
        cwd=build.module_dir, capture_output=True, text=True, check=False,
    )
    info = json.loads(result.stdout or "{}")
    if result.returncode != 0 or "Dir" not in info:
        reason = info.get("Error") or result.stderr.strip() or "no output"
        raise ClusterError(
            f"the Go module proxy refused {module}@{version} ({reason[:160]}): pin a version it serves in "
            f"hack/localcluster/versions.py and {build.module_dir}/go.mod, then re-run"
        )
    return Path(info["Dir"])


# The runtime pods' name label (specdec_runtime.contract). This package runs without the project installed, so it
# is spelled out here; a unit test keeps the two equal.
RUNTIME_POD_LABEL = ("app.kubernetes.io/name", "specdec-runtime")

# Runtime pods, once scheduled: a pod IP and Pending, not ready, as a kubelet reports a pod whose sandbox is up and
# whose container is being created. The fleet driver, the kubelet's stand-in for them, reports the container
# running and Ready only once its simulator listens (as vLLM's readiness probe would pass), or the waiting state
# that keeps it from starting. Selected once: by the missing pod IP.
RUNTIME_POD_START_STAGE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: runtime-pod-start
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchLabels: {labels}
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
    - key: '.status.podIP'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}

      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        reason: ContainersNotReady
        type: Ready
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        reason: ContainersNotReady
        type: ContainersReady

      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        started: false
        restartCount: 0
        state:
          waiting:
            reason: ContainerCreating
      {{{{ end }}}}
      {{{{ $hostIPs := NodeIPsWith .spec.nodeName }}}}
      {{{{ with $hostIPs }}}}
      hostIP: {{{{ index . 0 | Quote }}}}
      hostIPs:
      {{{{ range . }}}}
      - ip: {{{{ . | Quote }}}}
      {{{{ end }}}}
      {{{{ end }}}}
      {{{{ $hostNetwork := or .spec.hostNetwork false }}}}
      {{{{ $uid := or .metadata.uid "" }}}}
      {{{{ $name := or .metadata.name "" }}}}
      {{{{ $namespace := or .metadata.namespace "" }}}}
      {{{{ $podIPs := PodIPsWith .spec.nodeName $hostNetwork $uid $name $namespace }}}}
      {{{{ with $podIPs }}}}
      podIP: {{{{ index . 0 | Quote }}}}
      podIPs:
      {{{{ range . }}}}
      - ip: {{{{ . | Quote }}}}
      {{{{ end }}}}
      {{{{ end }}}}
      phase: Pending
      startTime: {{{{ $now | Quote }}}}
"""


# Runtime pods being deleted, should no fleet driver run to terminate them: deleted when their grace period ends
# (the deletionTimestamp), as a kubelet kills what still runs then. With a driver they are gone long before: it runs
# the kubelet's termination (the preStop wait, SIGTERM, the drain) and deletes the pod itself (termination.py).
RUNTIME_POD_DELETE_STAGE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: runtime-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchLabels: {labels}
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.deletionTimestamp'
  next:
    delete: true
"""


def kwok_stage_files(out_dir: Path) -> list[Path]:
    """KWOK's own stages (fast node init, lease heartbeats, pod ready/complete/delete), except that its pod-ready
    and pod-delete stages leave runtime pods to `runtime-pod-start`, `runtime-pod-delete` and the fleet driver: KWOK
    would report them Ready before anything serves on them (and again after the driver reported a container that
    cannot start), and delete them before they drained."""
    root = module_source_dir("sigs.k8s.io/kwok", KWOK_VERSION, "kwok") / "kustomize" / "stage"
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = json.dumps(dict([RUNTIME_POD_LABEL]))
    written = []
    for name in ("pod-ready", "pod-delete"):
        path = out_dir / f"{name}.yaml"
        path.write_text(stage_without_runtime_pods((root / "pod" / "fast" / f"{name}.yaml").read_text()))
        written.append(path)
    runtime_stages = (("runtime-pod-start", RUNTIME_POD_START_STAGE), ("runtime-pod-delete", RUNTIME_POD_DELETE_STAGE))
    for name, text in runtime_stages:
        path = out_dir / f"{name}.yaml"
        path.write_text(text.format(labels=labels))
        written.append(path)
    return [
        root / "node" / "fast" / "node-initialize.yaml",
        root / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
        *written,
        root / "pod" / "fast" / "pod-complete.yaml",
    ]


def stage_without_runtime_pods(stage_text: str) -> str:
    """A KWOK pod stage with one more selector term: not a runtime pod (a missing label matches NotIn)."""
    anchor = "    matchExpressions:\n"
    if stage_text.count(anchor) != 1:
        raise ClusterError("a kwok pod stage changed shape: expected one selector matchExpressions list")
    key, value = RUNTIME_POD_LABEL
    term = f"    - key: '.metadata.labels.\"{key}\"'\n      operator: 'NotIn'\n      values:\n      - '{value}'\n"
    return stage_text.replace(anchor, anchor + term)


def gateway_api_crd_files() -> list[Path]:
    root = module_source_dir("sigs.k8s.io/gateway-api", GATEWAY_API_VERSION, "helm")
    return sorted((root / "config" / "crd" / "standard").glob("*.yaml"))


def keda_crd_files() -> list[Path]:
    """KEDA's CRDs (ScaledObject, ScaledJob, TriggerAuthentication, ...) from its Go module zip."""
    root = module_source_dir("github.com/kedacore/keda/v2", KEDA_VERSION, "keda")
    return sorted((root / "config" / "crd" / "bases").glob("*.yaml"))


def prometheus_operator_crd_files() -> list[Path]:
    """prometheus-operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule, ...) from its Go module zip."""
    root = module_source_dir("github.com/prometheus-operator/prometheus-operator", PROMETHEUS_OPERATOR_VERSION,
                             "promtool")
    return sorted((root / "example" / "prometheus-operator-crd").glob("*.yaml"))
