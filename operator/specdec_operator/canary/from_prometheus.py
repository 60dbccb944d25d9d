"""A canary recording (`canary replay`'s JSON lines, docs/canary.md) from what Prometheus stored of its pods.

Prometheus keeps every scrape's samples stamped with the scrape's time, so the raw samples of a pod's vLLM series
(an instant query of a range selector, `{__name__=~"vllm:.+", pod=~"llama8b-gfx942-.*"}[2h]`, answers with them)
are its /metrics at each scrape, less the comments. Written back as exposition text, one line per pod per scrape,
they are a recording the replay reads as it reads one taken beside the cluster. A `query_range` answer (values at
the query's steps, each the last scrape before it) reads the same, stamped at the steps.

What each line holds:
- `metrics`: the pod's series with a sample at that moment, their labels as Prometheus stored them (the target's
  labels, `pod` among them, ride along: constant per pod, they change no series the replay reads);
- `role`: from the pod's name (`PodRoles`): the operator names a pool's canary Deployment `<pool>-canary` and its
  stable one `<pool>`, so their pods are `<pool>-canary-<hash>-<hash>` and `<pool>-<hash>-<hash>`;
- `ready`, `phase` and `restarts` from kube-state-metrics' `kube_pod_status_ready`, `kube_pod_status_phase` and
  `kube_pod_container_status_restarts_total` when the answers hold them, each as of the scrape (its last sample
  at or before it); without them a pod Prometheus scraped is Ready and Running, never restarted;
- a scrape `up` reports failed (0) is a line without metrics, as the replay reads a failed scrape.
No route weight: Prometheus does not store the HTTPRoute's. The replay then splits by the canary pods Ready, and
reads the step's pool size from `--spec` (the SpeculativeModel gives `replicasPerPool`).

Pure: the caller reads the answers and writes the lines.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# kube-state-metrics' families the recording reads pod state from; `up` is Prometheus' own per scrape.
READY = "kube_pod_status_ready"
PHASE = "kube_pod_status_phase"
RESTARTS = "kube_pod_container_status_restarts_total"
UP = "up"
# The label naming the pod, as the usual Kubernetes scrape configs write it (kube-prometheus and the Prometheus
# chart: `pod`; older relabelings: `kubernetes_pod_name`).
POD_LABELS = ("pod", "kubernetes_pod_name")


class PrometheusExportError(ValueError):
    """An answer the conversion cannot read; the message names the answer and the field."""


@dataclass(frozen=True)
class PodRoles:
    """Which pods are the canary's, the stable's and a baseline's: by pattern (`re.fullmatch` on the pod's name)."""

    canary: re.Pattern[str]
    stable: re.Pattern[str]
    baseline: re.Pattern[str] | None = None

    @classmethod
    def of_pool(cls, pool: str) -> PodRoles:
        """The operator's Deployments of a pool (`<model>-<gfx>`): `<pool>-canary` and `<pool>`. A Deployment's
        pods are `<deployment>-<ReplicaSet hash>-<suffix>`, of consonants and digits, so a stable pod's name never
        reads `<pool>-canary-...`."""
        name = re.escape(pool)
        return cls(canary=re.compile(rf"{name}-canary-[a-z0-9]+-[a-z0-9]+"),
                   stable=re.compile(rf"{name}-[a-z0-9]+-[a-z0-9]+"))

    def role(self, pod: str) -> str | None:
        if self.canary.fullmatch(pod):
            return "canary"
        if self.baseline is not None and self.baseline.fullmatch(pod):
            return "baseline"
        if self.stable.fullmatch(pod):
            return "stable"
        return None


@dataclass
class _Pod:
    scrapes: dict[float, list[str]] = field(default_factory=lambda: defaultdict(list))
    failed: set[float] = field(default_factory=set)
    # (stamp, value) of each kube-state-metrics reading, per what it reads.
    ready: list[tuple[float, bool]] = field(default_factory=list)
    phase: list[tuple[float, str]] = field(default_factory=list)
    restarts: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))


def _series(answer: Any, where: str) -> list[Mapping[str, Any]]:
    """The series of a Prometheus HTTP API answer (`/api/v1/query` or `/api/v1/query_range`) of type matrix."""
    if not isinstance(answer, Mapping):
        raise PrometheusExportError(f"{where}: not a Prometheus API answer (a JSON object with status and data)")
    if answer.get("status") != "success":
        raise PrometheusExportError(f"{where}: status is {answer.get('status')!r}, not success: "
                                    f"{answer.get('error', 'no error given')}")
    data = answer.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
        kind = data.get("resultType") if isinstance(data, Mapping) else None
        raise PrometheusExportError(
            f"{where}: data.resultType is {kind!r}: ask for samples over time, a range selector "
            f"(`...[2h]`) in /api/v1/query or any query in /api/v1/query_range")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusExportError(f"{where}: data.result must be a list of series")
    return result


def _label_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample_line(name: str, labels: Mapping[str, str], value: str) -> str:
    inner = ",".join(f'{key}="{_label_text(str(labels[key]))}"' for key in sorted(labels))
    return f"{name}{{{inner}}} {value}" if inner else f"{name} {value}"


def _values(series: Mapping[str, Any], where: str) -> list[tuple[float, str]]:
    values = series.get("values")
    if not isinstance(values, list):
        raise PrometheusExportError(f"{where}: a series has no values list (native histograms are not read)")
    pairs = []
    for pair in values:
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
            raise PrometheusExportError(f"{where}: a value must be [unix seconds, \"number\"], got {pair!r}")
        stamp = pair[0]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
            raise PrometheusExportError(f"{where}: a sample's time must be Unix seconds, got {stamp!r}")
        pairs.append((float(stamp), pair[1]))
    return pairs


def _as_of(readings: list[tuple[float, Any]], at: float) -> Any:
    """The last reading at or before `at`, or None."""
    latest = None
    for stamp, value in readings:
        if stamp > at:
            break
        latest = value
    return latest


def recording_lines(answers: Iterable[tuple[str, Any]], roles: PodRoles,
                    pod_label: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(the recording's lines in time order, notes on what was left out) from (name, answer) pairs."""
    pods: dict[str, _Pod] = defaultdict(_Pod)
    unmatched: set[str] = set()
    unnamed = 0
    for where, answer in answers:
        for series in _series(answer, where):
            labels = series.get("metric")
            if not isinstance(labels, Mapping):
                raise PrometheusExportError(f"{where}: a series has no metric labels")
            labels = {str(key): str(value) for key, value in labels.items()}
            name = labels.pop("__name__", None)
            pod = labels.get(pod_label) if pod_label else next(
                (labels[key] for key in POD_LABELS if key in labels), None)
            if name is None or pod is None:
                unnamed += 1
                continue
            if roles.role(pod) is None:
                unmatched.add(pod)
                continue
            state = pods[pod]
            values = _values(series, where)
            if name == UP:
                state.failed.update(stamp for stamp, value in values if float(value) == 0)
            elif name == READY:
                if labels.get("condition") == "true":
                    state.ready += [(stamp, float(value) == 1) for stamp, value in values]
            elif name == PHASE:
                state.phase += [(stamp, labels.get("phase", "Running")) for stamp, value in values if float(value) == 1]
            elif name == RESTARTS:
                state.restarts[labels.get("container", "")] += [(stamp, float(value)) for stamp, value in values]
            else:
                for stamp, value in values:
                    state.scrapes[stamp].append(_sample_line(name, labels, value))
    lines = []
    for pod, state in pods.items():
        role = roles.role(pod)
        state.ready.sort()
        state.phase.sort()
        for readings in state.restarts.values():
            readings.sort()
        for at in sorted(set(state.scrapes) | state.failed):
            ready = _as_of(state.ready, at)
            restarts = sum(_as_of(readings, at) or 0.0 for readings in state.restarts.values())
            metrics = None if at in state.failed and at not in state.scrapes else \
                "\n".join(sorted(state.scrapes[at])) + "\n"
            lines.append({"t": at, "pod": pod, "role": role, "phase": _as_of(state.phase, at) or "Running",
                          "ready": True if ready is None else ready, "restarts": int(restarts), "weight": None,
                          "metrics": metrics})
    lines.sort(key=lambda line: (line["t"], line["pod"]))
    notes = []
    if unmatched:
        shown = ", ".join(sorted(unmatched)[:5]) + (", ..." if len(unmatched) > 5 else "")
        notes.append(f"{len(unmatched)} pods are neither canary nor stable by name, left out: {shown}")
    if unnamed:
        label = pod_label or " or ".join(POD_LABELS)
        notes.append(f"{unnamed} series without a {label} label (or a name), left out")
    if not lines:
        notes.append("no series of a canary or stable pod: check the pool name and the pod label")
    return lines, notes
