"""The real vLLM engine in the loop: vLLM's CPU build serving tiny local checkpoints behind the operator (issue 33).

The fleet driver runs with `--engine vllm`: for each runtime pod it runs the pod's own container command (our
launcher, reading the runtime.json the operator rendered, then exec'ing `vllm serve`) on the pod's loopback IP and
port, with the spec's model names mapped to the checkpoints `hack/tiny-models` made (a random-weight Llama target and
drafters of calibrated greedy acceptance). Readiness is vLLM's /health; an exit is a terminated container with vLLM's
last log lines. Everything the operator reads here comes from vLLM's own counters.

Run alone: `pytest -m real_engine tests/e2e/test_real_engine.py` (with SPECDEC_CLUSTER_PORT_BASE set as for any e2e
test); the session's cluster must have no simulator fleet driver (one kubelet per cluster), so hack/test runs this
file on a cluster of its own. Each engine costs ~3 GB and 35 s to 2 minutes to start on a 2-core machine: the driver
runs at most two at once, and the tests wait on events (Ready, a status field, a condition), never on sleeps.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from specdec_runtime import contract, engine_env
from specdec_runtime.routing import STANDIN_GATEWAY_CLASS
from tests.e2e.canary_recording import RECORD_PERIOD_S, CanaryRecorder, assert_replay_agrees
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import FLEET_LABEL, condition, test_nodes, toleration_for_test_nodes  # noqa: F401
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.traffic import BackgroundLoad, GatewayStandIn

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
TARGET = "tiny-llama/target"
GOOD = "tiny-llama/drafter-good"
POOR = "tiny-llama/drafter-poor"
# What the driver maps the spec's names to (hack/tiny-models' checkpoints); any other target name is served by the
# tiny target and any other drafter name by drafter-good, so a spec written for a hub model runs too.
MODEL_MAP = {TARGET: "target", GOOD: "good", POOR: "poor", "tiny-llama/drafter-same": "same"}
# 4-8 minutes per engine start measured on the shared 2-core machine under load 9-16 while engines ran two OpenMP
# threads; 43-116 s in a CI run with one (fleet_engine.ENGINE_ENV). The wait keeps the old margin.
ENGINE_READY_S = 900
# A deleted pod's preStop wait: the pod's own 10 s (render/pool.py PRE_STOP_WAIT_S), not capped as the simulator
# fleets' MAX_PRE_STOP_S is. Beside two engines and the other CI lanes on two cores, the Gateway stand-in may see a
# deletion seconds late, and vLLM fails what reaches it after SIGTERM (HTTP 500, or a 200 whose finish_reason is
# "abort"; docs/vllm-contract.md). A 5 s cap saved seconds and left that race to the machine's load.
ENGINE_PRE_STOP_S = "10"
# The draft_model pool's test: the tuner evaluates (and status may take new figures) every EVALUATION_S, a refresh
# that moved goes out at most every STATS_PERIOD_S.
EVALUATION_S = 30
STATS_PERIOD_S = 5
# spec.runtime.drainSeconds of the tests' models: how long a leaving pod may finish what it holds. An engine that
# its load outruns leaves with a queue: in CI runs whose engines ran two OpenMP threads each, a contended engine
# served ~20 tokens/s against the load's ~30 (TPOT p90 883 ms), and requests were still in flight when a 120 s drain,
# and once a 300 s one, ran out (fleet_engine.ENGINE_ENV now runs one thread: 420-740 tokens/s under the same
# contention). 300 s still covers the load's longest answer (96 tokens, tests/e2e/traffic.py) at 3 s a token.
DRAIN_S = 300
# How long a pod that leaves may take to be gone: its preStop wait, the drain and vLLM's exit, with a margin.
POD_GONE_S = int(ENGINE_PRE_STOP_S) + DRAIN_S + 30 + 120


def ensure_engine_env() -> None:
    """The engine venv and tiny checkpoints: installed once per machine (cached in the user's cache)."""
    if engine_env.missing():
        subprocess.run([str(REPO / "hack" / "tiny-models")], check=True, stdout=subprocess.DEVNULL)
    assert not engine_env.missing(), engine_env.missing()


class EngineFleetDriver(FleetDriverProcess):
    """`specdec-runtime fleet-driver --engine vllm`, registered under the fleet driver's pid file (hack/cluster down
    stops it, and the engines die with it)."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster)
        self.work_dir = cluster.paths.logs / "engines"
        self.command = [str(Path(sys.executable).parent / "specdec-runtime"), "fleet-driver",
                        "--kubeconfig", str(cluster.paths.kubeconfig), "--engine", "vllm", "--max-engines", "2",
                        "--work-dir", str(self.work_dir), "--max-pre-stop-seconds", ENGINE_PRE_STOP_S]
        for name, checkpoint in MODEL_MAP.items():
            self.command += ["--model-map", f"{name}={checkpoint}"]

    def pids(self) -> list[int]:
        """The driver and every process of its engines (each engine is a session of its own: launcher -> vLLM's API
        server, engine core, workers)."""
        assert self.process is not None
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, []))
        return found


def inet_sockets(pids: list[int]) -> list[tuple[int, str, str, str]]:
    """(pid, protocol, local address, remote address) of every IPv4/IPv6 socket the processes hold, from
    /proc/<pid>/fd and /proc/<pid>/net/{tcp,tcp6,udp,udp6}."""
    found = []
    for pid in pids:
        try:
            inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                      if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
        except OSError:
            continue  # exited meanwhile
        for protocol in ("tcp", "tcp6", "udp", "udp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{protocol}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    found.append((pid, protocol, _address(fields[1]), _address(fields[2])))
    return found


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return f"{ip}:{int(port, 16)}"


def not_loopback(sockets: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
    def loopback(address: str) -> bool:
        ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip in ipaddress.ip_network("127.0.0.0/8") or (ip.is_unspecified and address.endswith(":0"))

    # An unconnected socket's remote end is 0.0.0.0:0; every local end and every peer must be loopback.
    return [s for s in sockets if not (loopback(s[2]) and loopback(s[3]))]


@pytest.fixture(scope="module")
def engine_driver(cluster: LocalCluster, crds: None) -> Iterator[EngineFleetDriver]:
    ensure_engine_env()
    simulators = FleetDriverProcess(cluster).running_pid()
    if simulators is not None:
        pytest.fail(f"a fleet driver (pid {simulators}) already serves this cluster: the real-engine tests need a "
                    "cluster whose kubelet stand-in is theirs (hack/test gives them one); one driver per cluster")
    driver = EngineFleetDriver(cluster).start()
    yield driver
    driver.stop()


@pytest.fixture
def kube(cluster: LocalCluster, namespace: str, crds: None, engine_driver: EngineFleetDriver) -> Kube:
    """This module's kubelet stand-in is the engine driver (the shared fixture would start the simulator one)."""
    return Kube(cluster, namespace)


@pytest.fixture
def engine_operator(cluster: LocalCluster, crds: None, namespace: str,
                    engine_driver: EngineFleetDriver) -> Iterator[Callable[..., OperatorProcess]]:
    """An operator of the test's own, watching only its namespace, with the settings the test names."""
    started: list[OperatorProcess] = []

    def start(**settings: str) -> OperatorProcess:
        process = OperatorProcess(cluster, f"operator-{namespace}-{len(started)}",
                                  SPECDEC_NAMESPACES=json.dumps([namespace]), **settings)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop()


def tiny_model(name: str, namespace: str, drafter: str = GOOD, k: int = 3, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": TARGET, "maxModelLen": 2048, "weightsGib": 1},
            "drafters": [{"method": "draft_model", "model": drafter, "weightsGib": 1}],
            "speculation": {"initialK": k, "minK": 1, "maxK": 6, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 1, "nodeSelector": {FLEET_LABEL: namespace},
                          "tolerations": [toleration_for_test_nodes(namespace)]},
            # A user's flag, passed through as any extraArgs are: without torch.compile a tiny engine on this CPU
            # is healthy in about half the time (measured 101 s -> 50 s), and each test starts one to three.
            # drainSeconds: see DRAIN_S (the default 30 would cut an answer in flight when its pod leaves).
            "runtime": {"extraArgs": ["--enforce-eager"], "drainSeconds": DRAIN_S},
        },
    }
    for key, value in spec.items():
        body["spec"][key] = {**body["spec"].get(key, {}), **value}
    return body


def ready(kube: Kube, name: str) -> bool:
    found = condition(kube.get("sm", name), "Ready")
    return bool(found and found["status"] == "True")


def runtime_pods(kube: Kube, name: str) -> list[dict[str, Any]]:
    return [pod for pod in kube.items("pods", f"specdec.io/model={name}")
            if pod["status"].get("podIP") and not pod["metadata"].get("deletionTimestamp")]


def complete(ip: str, model: str, prompt: str, max_tokens: int = 48) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(f"http://{ip}:8000/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def scrape(ip: str) -> str:
    with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=10) as response:
        return str(response.read().decode())


def counter(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def pool_stats(kube: Kube, name: str) -> dict[str, Any] | None:
    pools = (((kube.get("sm", name) or {}).get("status") or {}).get("speculation") or {}).get("pools") or []
    return pools[0] if pools else None


def test_a_draft_model_pool_on_the_real_engine_is_ready_and_reports_acceptance_per_position_from_vllms_counters(
    kube: Kube, namespace: str, engine_driver: EngineFleetDriver,
    engine_operator: Callable[..., OperatorProcess],
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    """Placed, Ready once vLLM's /health answers, and status.speculation shows the acceptance per position the
    operator computed from vLLM's own spec-decode counters; every socket the driver and the engine hold is on
    127.0.0.0/8 meanwhile."""
    test_nodes("engine", 1)
    engine_operator(SPECDEC_STATUS_STATS_PERIOD_SECONDS=str(STATS_PERIOD_S))
    started = time.monotonic()
    # The operator measures a pool whose K it tunes (or canaries): autotune on, evaluating every 30 s (status shows
    # the acceptance of the drafts since the last evaluation: 30 s of them), never with the drafts to change K.
    body = tiny_model("tiny", namespace, speculation={"autotune": {
        "enabled": True, "intervalSeconds": EVALUATION_S, "minSamples": 1000000, "cooldownSeconds": 3600}})
    kube.apply(body)
    wait_for("the model Ready on vLLM's /health", lambda: ready(kube, "tiny"), ENGINE_READY_S, 2,
             describe=lambda: [(p["metadata"]["name"], p["status"].get("containerStatuses"))
                               for p in runtime_pods(kube, "tiny")])
    print(f"Ready {time.monotonic() - started:.0f} s after apply")  # shown with -rA: the engine's start time
    pod_ip = runtime_pods(kube, "tiny")[0]["status"]["podIP"]
    before = scrape(pod_ip)
    # Requests one after another for as long as the test looks: status shows the acceptance of the operator's
    # recent window (since its last evaluation), so drafts must keep coming while it is read.
    # Clients name the served model: spec.model.name unless servedName says otherwise (the hub id, issue 32).
    served = body["spec"]["model"]["name"]
    stop = threading.Event()
    answers: list[dict[str, Any]] = []
    failed: list[BaseException] = []

    def client() -> None:
        i = 0
        try:
            while not stop.is_set():
                i += 1
                answers.append(complete(pod_ip, served, f"the model {i} drafts a token and the user reads it"))
        except BaseException as error:
            failed.append(error)  # the wait below fails at once with it, not after its timeout without load
            raise

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        # The first reading may cover a window the load only began in; the next one is a whole window under load.
        # Status is rewritten only when acceptance moves past the operator's tolerance (reconcile/status_write.py):
        # a first reading that stands through two later whole windows under load is within it of both.
        first: list[tuple[list[float], float]] = []

        def reported() -> dict[str, Any] | None:
            assert not failed, f"the client stopped after {len(answers)} answers: {failed[0]!r}"
            stats = pool_stats(kube, "tiny")
            rates = (stats or {}).get("perPositionAcceptance") or []
            if len(rates) != 3:
                return None
            if not first:
                first.append((rates, time.monotonic()))
                return None
            stood = time.monotonic() - first[0][1] >= 2 * EVALUATION_S + STATS_PERIOD_S
            return stats if rates != first[0][0] or stood else None

        stats = wait_for("acceptance per position in status", reported, 240, 2,
                         describe=lambda: (kube.get("sm", "tiny") or {}).get("status", {}).get("speculation"))
    finally:
        stop.set()
        thread.join(300)
    after = scrape(pod_ip)
    assert answers and all(a["usage"]["completion_tokens"] == 48 for a in answers), answers[-1:]

    def moved(name: str, **labels: str) -> float:
        return counter(after, name, **labels) - counter(before, name, **labels)

    drafts = moved("vllm:spec_decode_num_drafts_total")
    per_pos = [moved("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(3)]
    assert drafts > 0 and per_pos[0] >= per_pos[1] >= per_pos[2], (drafts, per_pos)
    measured = [count / drafts for count in per_pos]
    reported_rates = stats["perPositionAcceptance"]
    print(f"vLLM counters over {len(answers)} requests: {drafts:.0f} drafts, per position {per_pos} "
          f"({[round(m, 3) for m in measured]}); status: {stats}")
    # The operator's window holds a few hundred of these drafts: the same rates, within its sampling noise.
    assert reported_rates == pytest.approx(measured, abs=0.15), (reported_rates, measured)
    assert reported_rates[0] >= reported_rates[1] >= reported_rates[2] > 0, reported_rates
    assert 0 < stats["drafts"] <= counter(after, "vllm:spec_decode_num_drafts_total"), stats
    leaks = not_loopback(inet_sockets(engine_driver.pids()))
    assert not leaks, f"sockets off 127.0.0.0/8: {leaks}"


def test_a_spec_vllm_refuses_at_start_up_is_a_crash_looping_pool_with_vllms_message(
    kube: Kube, namespace: str, engine_driver: EngineFleetDriver,
    engine_operator: Callable[..., OperatorProcess],
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    """A max model length beyond what the checkpoint supports passes admission (the operator cannot read the
    checkpoint) and vLLM refuses it while it starts: the pod crash-loops and the model's Ready condition carries
    vLLM's own words, through the terminated container's message as a kubelet writes it."""
    test_nodes("refused", 1)
    operator = engine_operator()
    kube.apply(tiny_model("refused", namespace, model={"maxModelLen": 1048576}))

    def crash_looping() -> dict[str, Any] | None:
        found = condition(kube.get("sm", "refused"), "Ready")
        return found if found and found["status"] == "False" and found["reason"] == "CrashLoopBackOff" \
            and "max_model_len" in found["message"] else None

    found = wait_for("Ready=False CrashLoopBackOff with vLLM's message", crash_looping, ENGINE_READY_S, 2,
                     describe=lambda: [(p["status"].get("containerStatuses")) for p in runtime_pods(kube, "refused")])
    print(f"Ready condition: {found['message']}")
    terminated = runtime_pods(kube, "refused")[0]["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert terminated["exitCode"] != 0 and "max_model_len" in terminated["message"], terminated
    assert operator.process is not None and operator.process.poll() is None


@pytest.fixture(scope="module")
def gateway_standin(cluster: LocalCluster, engine_driver: EngineFleetDriver) -> Iterator[GatewayStandIn]:
    standin = GatewayStandIn(cluster, name="gateway-standin-engine").start()
    yield standin
    standin.stop()


def canary_model(name: str, namespace: str) -> dict[str, Any]:
    """One replica behind an HTTPRoute, changes rolled out as a canary judged on routed requests. A CPU engine
    serves a few requests a second, so the step needs few of them; TPOT is loose (two engines share two busy cores,
    so step times say little), and acceptance decides."""
    return tiny_model(name, namespace, rollout={"strategy": "Canary", "canary": {
        "steps": [{"weight": 50, "pauseSeconds": 10}, {"weight": 100, "pauseSeconds": 0}],
        "analysis": {"minAcceptedLengthRatio": 0.9, "maxTpotRatio": 10.0, "maxErrorRate": 0.05, "minRequests": 8,
                     "minDrafts": 100, "timeoutSeconds": 900},
        "traffic": {"httpRouteRef": {"name": name}},
    }})


# The Gateway the routes attach to, served by the stand-in (tests/e2e/traffic.py).
GATEWAY = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "inference-gateway"},
           "spec": {"gatewayClassName": STANDIN_GATEWAY_CLASS,
                    "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}


def http_route(name: str) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name},
            "spec": {"parentRefs": [{"name": "inference-gateway"}], "hostnames": [f"{name}.models.test"],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                                "backendRefs": [{"name": f"{name}-stable", "port": 8000, "weight": 100}]}]}}


def one_revision_left(kube: Kube, name: str) -> bool:
    """The swap is over: every pod of the model (Terminating ones too) runs one revision."""
    pods = kube.items("pods", f"specdec.io/model={name}")
    return len({pod["metadata"]["labels"].get(contract.LABEL_REVISION) for pod in pods}) == 1 and not any(
        pod["metadata"].get("deletionTimestamp") for pod in pods)


def assert_every_request_answered(load: BackgroundLoad, cluster: LocalCluster, standin: GatewayStandIn) -> None:
    """Through the canary and the swap after it (the loser's pods leave while requests flow): no request failed.
    Deleted pods serve through their preStop wait and then drain what they have in flight (docs/runtime-pods.md).
    On a failure: what the stand-in logged of its endpoints and 502s, and each engine's shutdown, to tell a late
    Gateway from a drain that ran out."""
    assert load.report is not None
    if not load.report.failures:
        return
    standin_log = (cluster.paths.logs / f"{standin.name}.log").read_text(errors="replace").splitlines()
    lines = [line for line in standin_log if "endpoints:" in line or " 502 for " in line][-30:]
    for log in sorted((cluster.paths.logs / "engines").glob("*/engine.log")):
        lines += [f"{log.parent.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                  if "[shutdown]" in line or line.startswith("--- start")][-12:]
    joined = "\n".join(lines)
    raise AssertionError(f"{load.report.statuses}: {load.report.failures.most_common(5)}\n{joined}")


def canary_phase(kube: Kube, name: str) -> str | None:
    canary = ((kube.get("sm", name) or {}).get("status") or {}).get("canary")
    return canary.get("phase") if canary else None


def test_a_much_worse_drafter_under_routed_load_is_rolled_back_citing_acceptance(
    cluster: LocalCluster, kube: Kube, namespace: str, engine_driver: EngineFleetDriver,
    gateway_standin: GatewayStandIn,
    engine_operator: Callable[..., OperatorProcess],
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
    tmp_path: Path,
) -> None:
    """drafter-good (greedy agreement 0.8) to drafter-poor (0.2) as a canary, under open-loop load through the
    Gateway stand-in: the stable and the canary engine each serve their share, the analysis reads both engines'
    real spec-decode counters, and the canary is rolled back with the acceptance numbers in the event."""
    test_nodes("canary", 1)
    engine_operator(SPECDEC_STATUS_STATS_PERIOD_SECONDS="5")
    name = "worse"
    kube.apply(GATEWAY)
    body = canary_model(name, namespace)
    kube.apply([http_route(name), body])
    wait_for(f"{name} Ready", lambda: ready(kube, name), ENGINE_READY_S, 2)
    served = body["spec"]["model"]["name"]  # the served name defaults to the hub id
    # Recorded beside the operator as a platform engineer would from Prometheus: the engines' own /metrics.
    recorder = CanaryRecorder(kube, name, RECORD_PERIOD_S, route=name)
    with BackgroundLoad(gateway_standin.url, f"{name}.models.test", seed=3, model=served, rate=1.0) as load, recorder:
        body["spec"]["drafters"][0]["model"] = POOR
        kube.apply(body)
        wait_for("the canary decided", lambda: canary_phase(kube, name) in ("Promoted", "RolledBack", "Aborted"),
                 ENGINE_READY_S + 900, 3,
                 describe=lambda: ((kube.get("sm", name) or {}).get("status", {}).get("canary"),
                                   [e["message"] for e in kube.events(name)][-3:]))
        wait_for("the canary's pods gone", lambda: one_revision_left(kube, name), POD_GONE_S, 2,
                 describe=lambda: runtime_pods(kube, name))
        wait_for("the recorder's rounds after the outcome", lambda: recorder.done or recorder.error, 60)
    events = [e["message"] for e in kube.events(name) if e["reason"] in ("CanaryFailed", "CanaryTimedOut")]
    print(f"verdict {canary_phase(kube, name)}: {events}; load {load.report.statuses if load.report else None}")
    assert canary_phase(kube, name) == "RolledBack", events
    assert any("acceptance" in m or "accepted length" in m for m in events), events
    assert any(ch.isdigit() for ch in events[-1]), events
    assert_every_request_answered(load, cluster, gateway_standin)
    # The same scrapes of vLLM's own counters, replayed through `canary replay`, give the operator's verdict.
    assert_replay_agrees(recorder, body, kube.get("sm", name)["status"], tmp_path / f"{name}.jsonl", __name__)
    leaks = not_loopback(inet_sockets(engine_driver.pids()))
    assert not leaks, f"sockets off 127.0.0.0/8: {leaks}"



# The K test_a_k_change... starts its drafter-poor pool at (also its maxK: any change goes down).
STARTING_K = 4


def last_decision(kube: Kube, name: str) -> dict[str, Any] | None:
    speculation = ((kube.get("sm", name) or {}).get("status") or {}).get("speculation") or {}
    decision: dict[str, Any] | None = speculation.get("lastDecision")
    return decision


def test_a_k_change_the_tuner_proposes_from_vllms_counters_rolls_out_as_a_canary_to_a_verdict(
    cluster: LocalCluster, kube: Kube, namespace: str, engine_driver: EngineFleetDriver,
    gateway_standin: GatewayStandIn,
    engine_operator: Callable[..., OperatorProcess],
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    """The loop closed on the real engine: a pool started at K=4 with drafter-poor (greedy agreement 0.2: drafts
    past the first position are all but never accepted), under open-loop load through the Gateway stand-in. The
    tuner reads vLLM's counters, records a K change in status (every position is measured, so nothing rests on
    an extrapolation: the drafts it drops buy nothing), and that change is rolled out as a canary (stable at
    K=4, canary at the new K, each an engine of its own) that the analysis judges on both engines' counters to a
    verdict."""
    test_nodes("ktune", 1)
    engine_operator(SPECDEC_STATUS_STATS_PERIOD_SECONDS="5")
    name = "ktune"
    kube.apply(GATEWAY)
    body = canary_model(name, namespace)
    body["spec"]["drafters"][0]["model"] = POOR
    # Tuning from the first few hundred drafts, every 30 s. The first change has no cooldown to wait for; the
    # hour's cooldown after it keeps the pool's K where the canary left it while the test reads it.
    body["spec"]["speculation"] = {"initialK": STARTING_K, "minK": 1, "maxK": STARTING_K, "autotune": {
        "enabled": True, "intervalSeconds": EVALUATION_S, "minSamples": 300, "cooldownSeconds": 3600}}
    kube.apply([http_route(name), body])
    wait_for(f"{name} Ready", lambda: ready(kube, name), ENGINE_READY_S, 2)
    served = body["spec"]["model"]["name"]
    with BackgroundLoad(gateway_standin.url, f"{name}.models.test", seed=5, model=served, rate=1.0) as load:
        decision = wait_for("a K change recorded from vLLM's counters",
                            lambda: (d := last_decision(kube, name)) is not None and d["toK"] != d["fromK"] and d,
                            600, 3, describe=lambda: last_decision(kube, name))
        canary = wait_for("the K change's canary", lambda: ((kube.get("sm", name) or {}).get("status") or {}).get(
            "canary"), 120, 2)
        wait_for("the canary decided", lambda: canary_phase(kube, name) in ("Promoted", "RolledBack", "Aborted"),
                 ENGINE_READY_S + 900, 3,
                 describe=lambda: ((kube.get("sm", name) or {}).get("status", {}).get("canary"),
                                   [e["message"] for e in kube.events(name)][-3:]))
        wait_for("the losing revision's pods gone", lambda: one_revision_left(kube, name), POD_GONE_S, 2,
                 describe=lambda: runtime_pods(kube, name))
    status = (kube.get("sm", name) or {}).get("status") or {}
    print(f"decision {decision}; canary {status.get('canary')}; "
          f"load {load.report.statuses if load.report else None}; failures "
          f"{load.report.failures.most_common(5) if load.report else None}")
    assert decision["fromK"] == STARTING_K and decision["action"] in ("Change", "Explore"), decision
    # The canary is the decision's: it runs the decided K against the stable at STARTING_K.
    assert canary["canaryK"] == decision["toK"] and canary.get("decisionId") == decision["id"], (canary, decision)
    final = status["canary"]
    assert final["verdict"] in ("Pass", "Fail") and any(ch.isdigit() for ch in final["message"]), final
    pool_k = status["pools"][0]["effectiveK"]
    assert pool_k == (decision["toK"] if final["phase"] == "Promoted" else STARTING_K), (pool_k, final)
    assert_every_request_answered(load, cluster, gateway_standin)
    leaks = not_loopback(inet_sockets(engine_driver.pids()))
    assert not leaks, f"sockets off 127.0.0.0/8: {leaks}"
