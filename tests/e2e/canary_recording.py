"""Record a canary from the local cluster in `specdec-operator canary replay`'s format, as a platform engineer would
record one from Prometheus (docs/canary.md, "Replaying a canary"), and replay it.

A `CanaryRecorder` runs beside the operator: every period it reads the model, its pods and its HTTPRoute, and
scrapes each pod's /metrics itself (fake pods answer on loopback IPs; nothing else is dialled). A line per pod:
the time its own scrape answered, its role from the revisions in `status.canary` (stable or canary), its phase,
readiness and restarts as the API shows them, the route's canary weight as read, and the vLLM families of its
/metrics text. Rounds start once the operator has started the canary and end a few rounds after the operator
has decided it (the replay's rounds fall between the operator's scrapes, so it may need one round more).

Besides every period, a round is taken as soon as the set of pods the operator would scrape changes: the operator
acts on a pod's readiness at once (a step starts, or passes, when its canary replicas are ready), and a pod that
became ready and the promotion it allowed can both fall between two sampled rounds, a moment no sampled recording
holds (seen with 8 replicas swapped in place one at a time). Prometheus with kube-state-metrics samples readiness
too; this recorder is a test tool that keeps the moment the operator acted on.
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from specdec_operator.canary.replay import ReplayResult, format_result, load_spec, parse_recording, replay
from specdec_operator.canary.traffic import canary_percent, route_weights
from specdec_operator.reconcile.tuning_inputs import scrape_targets
from specdec_runtime import contract
from tests.e2e.kube import Kube
from tests.e2e.operator_process import SCRAPE_INTERVAL_S

IN_FLIGHT = ("Progressing", "Paused")
# The recorder's period: the operator's scrape interval in e2e (tests/e2e/operator_process.py).
RECORD_PERIOD_S = float(SCRAPE_INTERVAL_S)
# Rounds recorded after the operator's outcome: the replay scrapes between the operator's scrapes, and its last
# round before the operator's decision may lack the one scrape that decided it.
ROUNDS_AFTER_OUTCOME = 3
# How often, between rounds, the recorder reads which pods are ready (one LIST of the model's pods).
READINESS_POLL_S = 0.25


def vllm_families(text: str) -> str:
    """The vLLM families of a /metrics text, with their TYPE lines (what the replay reads; the simulator's HTTP and
    process families would only make the recording larger)."""
    kept = []
    for line in text.splitlines():
        if line.startswith("vllm:") or line.startswith("# TYPE vllm:"):
            kept.append(line)
    return "\n".join(kept) + "\n"


def scrape(ip: str) -> str | None:
    """The pod's /metrics text, or None when the scrape failed. Loopback only (fake pods' IPs)."""
    if not ipaddress.ip_address(ip).is_loopback:
        raise AssertionError(f"refusing to dial {ip}: e2e tests connect to loopback only")
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return None


class CanaryRecorder:
    """Records one model's canary (see the module docstring). Use as a context manager around the change."""

    def __init__(self, kube: Kube, model: str, period_s: float, route: str | None = None) -> None:
        self.kube = kube
        self.model = model
        self.period_s = period_s
        self.route = route
        self.lines: list[dict[str, Any]] = []
        self.round_weights: list[int | None] = []  # the route's canary weight as each round read it
        self.revisions: tuple[str, str] | None = None  # (stable, canary) of the canary recorded
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"record-{model}", daemon=True)
        self._after_outcome = 0
        self._serving_at_round: frozenset[str] | None = None  # what the last round saw the operator would scrape
        self.error: BaseException | None = None

    def __enter__(self) -> CanaryRecorder:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    @property
    def done(self) -> bool:
        """The operator decided the canary, and the rounds after its decision are recorded."""
        return self._after_outcome >= ROUNDS_AFTER_OUTCOME

    def _run(self) -> None:
        try:
            # A sampling period, as Prometheus' scrape interval: what the test waits on is the operator's status.
            while not self._stop.is_set() and not self.done:
                self._round()
                self._until_next_round()
        except BaseException as err:  # surfaced by `recording()`
            self.error = err

    def _until_next_round(self) -> None:
        """Until the period is over, or sooner once the canary has started and the pods the operator would
        scrape (Ready, not terminating) are no longer the ones the last round saw (the module's docstring)."""
        deadline = time.monotonic() + self.period_s
        seen = self._serving_at_round
        while not self._stop.wait(max(0.0, min(READINESS_POLL_S, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or (seen is not None and self._serving(self._pods()) != seen):
                return

    def _pods(self) -> list[dict[str, Any]]:
        """The model's pods of the recorded canary's two revisions."""
        assert self.revisions is not None
        return [pod for pod in self.kube.items("pods", f"{contract.LABEL_MODEL}={self.model}")
                if pod["metadata"]["labels"].get(contract.LABEL_REVISION) in self.revisions]

    @staticmethod
    def _serving(pods: list[dict[str, Any]]) -> frozenset[str]:
        """The names of the pods the operator would scrape (Ready, with an IP, not terminating), by its own rule."""
        return frozenset(pod["metadata"]["name"] for pod in pods if scrape_targets([pod]))

    def _round(self) -> None:
        canary = ((self.kube.get("sm", self.model) or {}).get("status") or {}).get("canary") or {}
        if self.revisions is None:
            if canary.get("phase") not in IN_FLIGHT or not canary.get("canaryRevision"):
                return  # the operator has not started the canary yet
            self.revisions = (str(canary["stableRevision"]), str(canary["canaryRevision"]))
        if canary.get("phase") not in IN_FLIGHT:
            self._after_outcome += 1
        roles = {self.revisions[0]: "stable", self.revisions[1]: "canary"}
        weight = self._route_weight()
        pods = self._pods()
        serving = self._serving(pods)
        self._serving_at_round = serving
        for pod in pods:
            status = pod.get("status") or {}
            ready = pod["metadata"]["name"] in serving
            text = scrape(status["podIP"]) if ready else None
            self.lines.append({
                "t": round(time.time(), 3), "pod": pod["metadata"]["name"],
                "role": roles[pod["metadata"]["labels"][contract.LABEL_REVISION]],
                "phase": status.get("phase", "Pending"), "ready": ready,
                "restarts": sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or []),
                "weight": weight, "metrics": vllm_families(text) if text is not None else None,
            })
        self.round_weights.append(weight)

    def rounds_at(self, weight: int) -> int:
        """How many rounds recorded the route giving the canary `weight` percent."""
        return sum(seen == weight for seen in self.round_weights)

    def _route_weight(self) -> int | None:
        """The canary's percent of the route as read, as the operator reads it (canary/traffic.py)."""
        route = self.kube.get("httproute", self.route) if self.route else None
        if route is None:
            return None
        return canary_percent(route_weights(route, str(self.kube.namespace), f"{self.model}-stable",
                                            f"{self.model}-canary"))

    def recording(self, header: dict[str, Any], comment: str = "") -> str:
        """The recording: `comment` as YAML comment lines, the header, then the JSON lines."""
        if self.error is not None:
            raise AssertionError(f"the recorder failed: {self.error!r}") from self.error
        comments = "".join(f"# {line}\n" for line in comment.splitlines())
        body = "\n".join(json.dumps(line, separators=(",", ":")) for line in self.lines)
        return f"{comments}{yaml.safe_dump(header, sort_keys=False)}---\n{body}\n"


def replay_header(model: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    """The replay's header from the SpeculativeModel as applied and its status, read as `canary replay --spec` reads
    a whole SpeculativeModel (`load_spec`): the canary's steps and analysis, the pool and its replicas, and for a
    tuner K change the decision under test. Written out compactly, so the kept recording says what it was judged
    on."""
    read = load_spec({"spec": model["spec"], "status": status or {}})
    header: dict[str, Any] = {"pool": read.pool, "replicas": read.replicas}
    if read.gpus_per_pod != 1:
        header["gpusPerPod"] = read.gpus_per_pod
    if read.decision() is not None:
        header.update({"stableK": read.stable_k, "canaryK": read.canary_k, "predictedGain": read.predicted_gain})
    rollout = dict(model["spec"]["rollout"]["canary"])
    rollout.pop("traffic", None)
    header["canary"] = rollout
    return header


def replay_text(text: str) -> tuple[ReplayResult, str]:
    """Replay a recording's text through `canary replay`'s entry point: (the result, the printed report)."""
    header, records = parse_recording(text)
    spec = load_spec(header)
    result = replay(records, spec)
    return result, format_result(result, spec)


def save(text: str, path: Path, test: str) -> None:
    """Write the recording to `path`, and a copy to $SPECDEC_E2E_RECORDINGS when set (hack/test keeps it with the
    clusters' logs: pytest's temporary directories do not outlive a few runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    kept = os.environ.get("SPECDEC_E2E_RECORDINGS")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        (Path(kept) / f"{test}.{path.name}").write_text(text)


def assert_replay_agrees(recorder: CanaryRecorder, body: dict[str, Any], status: dict[str, Any], path: Path,
                         test: str) -> None:
    """`canary replay` on this canary, recorded beside the operator as a platform engineer would record it, gives
    the operator's verdict: the same outcome, at the same step, for the same reason."""
    text = recorder.recording(replay_header(body, status),
                              comment=f"recorded by {test} on the local cluster; the operator's outcome: "
                                      f"{status['canary']['phase']} at step {status['canary']['step'] + 1}: "
                                      f"{status['canary']['message']}")
    save(text, path, test)
    result, report = replay_text(text)
    print(f"replay of {path} ({len(recorder.lines)} lines):\n{report}")  # shown with -rA
    operator = status["canary"]
    assert result.outcome == operator["phase"], (operator, report)
    assert result.steps and result.steps[-1].step == operator["step"], (operator, report)
    if operator["phase"] == "RolledBack":
        verdict = result.steps[-1].verdict
        assert verdict is not None and f"({verdict.reason})" in operator["message"], (
            operator, report)
