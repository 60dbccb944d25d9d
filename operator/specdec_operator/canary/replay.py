"""Replay a recorded canary through the operator's own path: /metrics parsing, counter windows, canary
evidence, analysis and the step machine, exactly as the operator runs them, with the recording's clock.

A recording is JSON lines, one per pod per scrape (docs/canary.md, "Replaying a canary"):

    {"t": 1764500000.0, "pod": "llama-canary-0", "role": "canary", "phase": "Running", "ready": true,
     "restarts": 0, "weight": 10, "metrics": "# HELP vllm:...\\n..."}

`t` is Unix seconds (or RFC 3339); `role` is stable, canary or baseline (a stable-revision Deployment of the
canary's size; when the recording has one, the canary is compared with it and not with the stable);
`weight` is the canary's percent in the route as it was in force (null or absent: replica-ratio split);
`metrics` is the pod's /metrics text as scraped (absent or null: the scrape failed); `health` (optional)
the pod's /health answer (absent: healthy when its /metrics was scraped). A scrape round is each pod once,
stamped within half the scrape period of each other (`rounds`); a verdict and a step of the state machine
follow each round, as a reconcile follows a scrape in the operator. The canary starts with the first round
that has a canary pod; rounds before it (an export from before the change) only start the counters.

The steps and the analysis come from a YAML header before the first JSON line (the fields of
`spec.rollout.canary`, or a mapping with a `canary:` key and optional `pool`, `gpusPerPod`, `replicas`, `stableK`,
`canaryK`, `predictedGain`, or a whole SpeculativeModel with its status: `_manifest_settings`), or from a separate
file (`--spec`).

Pure: no I/O but what the caller hands in. The bench (bench/canary.py) drives `Replayer.round` with
generated rounds; the CLI and the tests call `replay` on a file's lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

import yaml
from pydantic import ValidationError

from specdec_operator.api.spec import Canary, Rollout, SpeculativeModelSpec
from specdec_operator.api.status import CanaryStatus, TuningDecision
from specdec_operator.api.vocabulary import MAX_K
from specdec_operator.canary.analysis import Verdict, WindowStats
from specdec_operator.canary.evidence import CanaryWindows, PodRestarts
from specdec_operator.canary.plan import (
    IN_FLIGHT_PHASES,
    CanaryProgress,
    CanaryTarget,
    equal_load_percent,
    replica_share_percent,
    step_canary_replicas,
)
from specdec_operator.canary.progress import StepObservation, advance, follow_recorded_step
from specdec_operator.canary.verdict import VerdictInputs, step_verdicts
from specdec_operator.timestamps import parse_stamp
from specdec_operator.tuner.samples import MetricsParseError, ScrapeResult, ScrapeTarget, parse_metrics
from specdec_operator.tuner.window import CounterWindows

Role = Literal["stable", "canary", "baseline"]
ROLES: tuple[Role, ...] = ("stable", "canary", "baseline")
STABLE_REVISION = "stable"
CANARY_REVISION = "canary"
MAX_NOTES = 20  # `note:` lines in the output at most
# A pod whose latest line is older than this many scrape periods is gone (deleted, or no longer exported); one
# scraped late, or whose line a round left out, is not.
PODS_SEEN_PERIODS = 1.5


class RecordingError(ValueError):
    """A recording or spec the replay cannot read; the message names the line and the field."""


@dataclass(frozen=True)
class Record:
    """One pod at one scrape."""

    at: float
    pod: str
    role: Role
    metrics: str | None = None
    phase: str = "Running"
    ready: bool = True
    restarts: int = 0
    weight: int | None = None
    health: bool | None = None
    line: int = field(default=0, compare=False)  # the recording's line, for messages (0: not from a file)


@dataclass(frozen=True)
class ReplaySpec:
    """What the operator would know besides the pods: the canary settings and the K change under test."""

    canary: Canary = field(default_factory=Canary)
    pool: str = "pool"
    gpus_per_pod: int = 1
    stable_k: int | None = None
    canary_k: int | None = None
    predicted_gain: float | None = None
    # The pool's replicas (spec.placement.replicasPerPool): the route a step needs is the replica split's percent
    # (`equal_load_percent`), as in the operator. None: read from the round's pods (what the step runs).
    replicas: int | None = None

    def rollout(self) -> Rollout:
        return Rollout(strategy="Canary", canary=self.canary)

    def decision(self) -> TuningDecision | None:
        if self.predicted_gain is None or self.stable_k is None or self.canary_k is None:
            return None
        return TuningDecision(id="replay", time="1970-01-01T00:00:00Z", pool=self.pool, from_k=self.stable_k,
                              to_k=self.canary_k, action="Change", reason="recorded",
                              predicted_gain=self.predicted_gain, confidence=1.0)


# The events that end a step, and how a replay names that end (`StepResult.ended`).
STEP_ENDINGS = {"CanaryStepPassed": "Passed", "CanaryStepUndecided": "Undecided", "CanaryFailed": "Failed",
                "CanaryTimedOut": "TimedOut", "CanaryPromoted": "Promoted", "CanaryAborted": "Aborted",
                "CanaryCancelled": "Aborted", "CanaryStepFollowed": "Followed"}


@dataclass(frozen=True)
class StepResult:
    """How one step ended (or where the recording left it), with the last verdict on its window."""

    step: int
    weight: int
    # Passed, Undecided (moved on), Followed (the recording moved on first: `_follow_the_recording`), Failed,
    # TimedOut, Promoted, RolledBack, Aborted, Unfinished
    ended: str
    seconds: float
    verdict: Verdict | None
    event: str


@dataclass(frozen=True)
class ReplayResult:
    outcome: str  # Promoted, RolledBack, Aborted, Unfinished
    reason: str  # the closing event's reason, e.g. CanaryFailed; with the verdict's reason for a failure
    message: str
    seconds: float  # from the canary's start to the outcome (or the last round)
    steps: tuple[StepResult, ...]
    # Scrapes the operator's path could not use, per pod and kind, with the first line and why: a recording whose
    # every canary scrape is unreadable ends Unfinished for want of requests, and says why here.
    notes: tuple[str, ...] = ()


VerdictHook = Callable[[int, WindowStats, WindowStats | None, Verdict], None]


# Unix seconds the replay can turn into a moment: 1970 up to the end of year 9999 (what datetime holds). A stamp
# past it is most likely milliseconds (as Prometheus and OpenMetrics timestamps are written) or nanoseconds.
LATEST_STAMP = 253402300799.0


def _stamp(value: Any, where: str) -> float:
    if isinstance(value, bool) or value is None:
        raise RecordingError(f"{where}: t must be Unix seconds or an RFC 3339 time, got {value!r}")
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)  # Unix seconds written as a string, as some exports do
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise RecordingError(f"{where}: t must be finite")
        if not 0 <= value <= LATEST_STAMP:
            raise RecordingError(f"{where}: t {value!r} is not Unix seconds between 1970 and 9999 (milliseconds?)")
        return float(value)
    try:
        # RFC 3339 lets the "T" and "Z" be lower case (section 5.6); Python's reader takes upper case only.
        moment = parse_stamp(str(value).strip().upper(), assume_utc=True)
    except ValueError as err:
        raise RecordingError(f"{where}: t {value!r} is not an RFC 3339 time") from err
    return moment.timestamp()


def _optional(line: Mapping[str, Any], key: str, default: Any) -> Any:
    """A field's value; JSON null reads as the field left out."""
    value = line.get(key)
    return default if value is None else value


def parse_record(line: Mapping[str, Any], where: str, number: int = 0) -> Record:
    role = line.get("role")
    if isinstance(role, str):
        role = role.strip().lower()  # "Canary", as a label value or a spreadsheet may write it
    if role not in ROLES:
        raise RecordingError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
    pod = line.get("pod")
    if not isinstance(pod, str) or not pod:
        raise RecordingError(f"{where}: pod must be a non-empty string")
    metrics = line.get("metrics")
    if metrics is not None and not isinstance(metrics, str):
        raise RecordingError(f"{where}: metrics must be the /metrics text or null")
    weight = line.get("weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                               or not 0 <= weight <= 100):
        raise RecordingError(f"{where}: weight must be a percent 0..100 or null, got {weight!r}")
    if weight is not None:
        # A share read from the route's backend weights may be fractional (1 of 8 is 12.5%): the operator reads a
        # route to the whole percent, half up (canary/traffic.py, `canary_percent`).
        weight = math.floor(weight + 0.5)
    restarts = _optional(line, "restarts", 0)
    # JSON has one number type: 2.0 is the integer 2 (a Prometheus export writes every value as a float).
    if (isinstance(restarts, bool) or not isinstance(restarts, (int, float)) or not math.isfinite(restarts)
            or restarts < 0 or restarts != int(restarts)):
        raise RecordingError(f"{where}: restarts must be a non-negative integer, got {restarts!r}")
    health = line.get("health")
    if health is not None and not isinstance(health, bool):
        raise RecordingError(f"{where}: health must be true, false or null, got {health!r}")
    ready = _optional(line, "ready", True)
    if not isinstance(ready, bool):
        raise RecordingError(f"{where}: ready must be true or false, got {ready!r}")
    return Record(at=_stamp(line.get("t"), where), pod=pod, role=cast(Role, role), metrics=metrics,
                  phase=str(_optional(line, "phase", "Running")), ready=ready, restarts=int(restarts),
                  weight=weight, health=health, line=number)


def parse_recording(text: str) -> tuple[dict[str, Any] | None, list[Record]]:
    """(the YAML header, if any, and the records) of a recording."""
    # A byte-order mark (Windows tools write one) is no part of the first line: left there, a first JSON line
    # would read as a YAML header, and its record would be lost.
    lines = text.removeprefix("\ufeff").splitlines()
    first = next((index for index, line in enumerate(lines) if line.lstrip().startswith("{")), len(lines))
    header_text = "\n".join(line for line in lines[:first] if line.strip() != "---")
    header: dict[str, Any] | None = None
    if header_text.strip():
        try:
            loaded = yaml.safe_load(header_text)
        except yaml.YAMLError as err:
            raise RecordingError(f"header: not YAML: {err}") from err
        if loaded is not None and not isinstance(loaded, dict):
            raise RecordingError("header: must be a YAML mapping")
        header = loaded
    records = []
    for number, line in enumerate(lines[first:], start=first + 1):
        if not line.strip():
            continue
        try:
            decoded = json.loads(line)
        except json.JSONDecodeError as err:
            raise RecordingError(f"line {number}: not JSON: {err.msg}") from err
        if not isinstance(decoded, dict):
            raise RecordingError(f"line {number}: must be a JSON object")
        records.append(parse_record(decoded, f"line {number}", number))
    return header, records


def load_spec(header: Mapping[str, Any] | None) -> ReplaySpec:
    """The replay settings from a header or spec file: `spec.rollout.canary`'s fields, or a mapping with a
    `canary:` key (also accepted under `spec.rollout`) and the optional replay keys."""
    if header is None:
        return ReplaySpec()
    body: Mapping[str, Any] = header
    spec = body.get("spec")
    if isinstance(spec, Mapping) and isinstance(spec.get("rollout"), Mapping):
        body = spec["rollout"]
    canary_body = body.get("canary", body if "steps" in body or "analysis" in body else {})
    if not isinstance(canary_body, Mapping):
        raise RecordingError("spec: canary must be a mapping (the fields of spec.rollout.canary)")
    try:
        canary = Canary.model_validate(dict(canary_body))
    except ValidationError as err:
        raise RecordingError(f"spec.rollout.canary: {err}") from err

    def number(key: str, kind: type, low: float, high: float = math.inf) -> Any:
        value = header.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordingError(f"spec: {key} must be a number, got {value!r}")
        # Read as the operator's API reads it: a whole number where it takes one (2.0 is 2, 2.5 is no count of
        # pods), within its bounds; a value it would refuse must not give a verdict silently.
        if not math.isfinite(value) or (kind is int and value != int(value)) or not low <= value <= high:
            bounds = f"{low:g}..{high:g}" if math.isfinite(high) else f">= {low:g}"
            what = "a whole number" if kind is int else "a finite number"
            raise RecordingError(f"spec: {key} must be {what} {bounds}, got {value!r}")
        return kind(value)

    manifest = _manifest_settings(header)
    pool = header.get("pool", manifest.get("pool", "pool"))
    gpus = number("gpusPerPod", int, 1)
    replicas = number("replicas", int, 1)
    decision = {key: number(key, kind, low, high) for key, kind, low, high in (
        ("stableK", int, 0, MAX_K), ("canaryK", int, 0, MAX_K), ("predictedGain", float, -math.inf, math.inf))}
    if all(value is None for value in decision.values()):
        decision = {key: manifest.get(key) for key in decision}
    return ReplaySpec(canary=canary, pool=str(pool), gpus_per_pod=gpus or manifest.get("gpusPerPod", 1),
                      stable_k=decision["stableK"], canary_k=decision["canaryK"],
                      predicted_gain=decision["predictedGain"], replicas=replicas or manifest.get("replicas"))


def _manifest_settings(header: Mapping[str, Any]) -> dict[str, Any]:
    """What a whole SpeculativeModel (as applied, or as `kubectl get -o yaml` prints it) says beside its canary:
    the pool (the canary's in status, else the tuner's last decision's, else the first gfx target), its replicas
    (`replicasPerPool`, a pool's own entry first) and GPUs per pod (its tensor parallelism), and, for a tuner K
    change in flight, the decision under test (`status.speculation.lastDecision`, when the canary runs its K). The
    header's own keys come first. A partial spec (only `spec.rollout`, say) gives nothing here; nor does one the
    operator's API would refuse, whose pool settings the replay could not read as the operator does."""
    def mapping(value: Any) -> Mapping[str, Any]:
        return value if isinstance(value, Mapping) else {}

    spec = header.get("spec")
    status = mapping(header.get("status"))
    canary = mapping(status.get("canary"))
    decision = mapping(mapping(status.get("speculation")).get("lastDecision"))
    settings: dict[str, Any] = {}
    model = None
    if isinstance(spec, Mapping) and "placement" in spec:
        with contextlib.suppress(ValidationError):
            model = SpeculativeModelSpec.model_validate(dict(spec))
    pool = canary.get("pool") or decision.get("pool") or (model.placement.targets[0] if model is not None else None)
    if isinstance(pool, str):
        settings["pool"] = pool
    # Status names a pool `<model>-<gfx>` and lists its gfx target (`status.pools`); a status without that list
    # (a partial dump) leaves the name's suffix (render/names.py, `pool_name`, keeps the gfx target whole).
    listed = {entry.get("name"): entry.get("gfxTarget") for entry in status.get("pools") or ()
              if isinstance(entry, Mapping)}
    gfx = None if model is None or not isinstance(pool, str) else listed.get(pool) or next(
        (target for target in model.placement.targets if pool == target or pool.endswith(f"-{target}")), None)
    if model is not None and gfx is not None:
        per_pool = model.for_pool(gfx)
        settings["gpusPerPod"] = int(per_pool.model.tensor_parallel_size)
        if per_pool.placement.replicas_per_pool:
            settings["replicas"] = per_pool.placement.replicas_per_pool
    gain, from_k, to_k = decision.get("predictedGain"), decision.get("fromK"), decision.get("toK")
    if canary.get("canaryK") is not None and canary.get("canaryK") == to_k and decision.get("pool") in (None, pool) \
            and isinstance(gain, (int, float)) and isinstance(from_k, int) and isinstance(to_k, int):
        settings.update(stableK=from_k, canaryK=to_k, predictedGain=float(gain))
    return settings


def rounds(records: Iterable[Record], period: float | None = None) -> Iterator[list[Record]]:
    """Records grouped into scrape rounds, in time order. A round holds each pod at most once, stamped within half
    the recording's scrape period (`scrape_period`, unless given) of the round's first record: a recorder beside
    the cluster stamps each pod when its own scrape answered, so one round's stamps differ by up to a scrape's
    duration, and an export may list the lines pod by pod. Equal stamps are always one round. (Prometheus spreads
    its pods over the whole period: a round of its export holds some of them, `Replayer._pods`.)"""
    ordered = sorted(records, key=lambda record: record.at)
    tolerance = (scrape_period(ordered) if period is None else period) / 2
    batch: list[Record] = []
    pods: set[str] = set()
    for record in ordered:
        if batch and (record.pod in pods or record.at - batch[0].at > tolerance):
            yield batch
            batch, pods = [], set()
        batch.append(record)
        pods.add(record.pod)
    if batch:
        yield batch


def scrape_period(records: Iterable[Record]) -> float:
    """The median interval between one pod's consecutive records; 0 when no pod was recorded twice."""
    last: dict[str, float] = {}
    intervals = []
    for record in sorted(records, key=lambda record: record.at):
        if record.pod in last and record.at > last[record.pod]:
            intervals.append(record.at - last[record.pod])
        last[record.pod] = record.at
    return statistics.median(intervals) if intervals else 0.0


def _moment(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


class Replayer:
    """The operator's canary path for one pool, fed one scrape round at a time."""

    def __init__(self, spec: ReplaySpec, *, compare_with: Role = "stable", on_verdict: VerdictHook | None = None,
                 period: float | None = None):
        self.spec = spec
        # The recording's scrape period, when its pods are scraped at moments of their own: a round then holds only
        # some of them, and the pods' state is each one's latest line (`_pods`). None: every round holds every pod.
        self.period = period
        self._latest: dict[str, Record] = {}
        self.compare_with = compare_with
        self.on_verdict = on_verdict
        self.rollout = spec.rollout()
        self.thresholds = spec.canary.analysis
        self.target = CanaryTarget(pool=spec.pool, stable_revision=STABLE_REVISION, desired_revision=CANARY_REVISION,
                                   desired_k=spec.canary_k, decision_id="replay" if spec.predicted_gain else None)
        self.windows = CanaryWindows()
        self.counters = CounterWindows()
        self.status: CanaryStatus | None = None
        self.started_at: float | None = None
        self.last_at: float | None = None
        self.step_started: float | None = None
        self.last_verdict: Verdict | None = None
        self.steps: list[StepResult] = []
        self.result: ReplayResult | None = None
        self.last_decision = spec.decision()
        # (pod, what) -> [scrapes, first line, first reason]: what the operator's path could not use (`notes`).
        self._unused: dict[tuple[str, str], list[Any]] = {}

    @property
    def weight(self) -> int:
        """The canary's weight in force: what a traffic source must send it now."""
        return self.status.weight if self.status is not None and self.status.phase in IN_FLIGHT_PHASES else 0

    @property
    def finished(self) -> bool:
        return self.result is not None

    def _revision(self, role: Role) -> str | None:
        if role == "canary":
            return CANARY_REVISION
        return STABLE_REVISION if role == self.compare_with else None

    def round(self, records: list[Record]) -> None:
        """One scrape round, then one reconcile: the verdict on the step's window and the step machine."""
        if self.result is not None or not records:
            return
        # The reconcile follows the round's last scrape; each scrape keeps its own stamp for the counter windows.
        at = max(record.at for record in records)
        now = _moment(at)
        starting = self.status is None
        if starting and not any(record.role == "canary" for record in records):
            # Before the canary revision shows: history (a recording exported from before the change). Its
            # scrapes only give the other pods' counters a start, as the operator has them when a canary begins.
            history = [(target, record) for record in records if record.ready
                       and (target := self._target(record)) is not None]
            before = [self._scrape(target, record) for target, record in history]
            self._note_left_out(self.counters.observe(before).violations, records)
            return
        if starting:
            # The reconcile that sees the new revision starts its canary; the next ones step it.
            self.started_at = at
            self._advance(None, at, now, canary_ready=False, route_percent=None)
        pods = self._pods(records, at)
        weights = [record.weight for record in records if record.weight is not None]
        route_percent = weights[0] if weights else None
        self._follow_the_recording(route_percent, pods, records[0], at, now)
        in_flight = self.status if self.status is not None and self.status.phase in IN_FLIGHT_PHASES else None
        self.windows.follow(in_flight, at)
        results: list[ScrapeResult] = []
        health = []
        restarts = []
        for record in records:
            target = self._target(record)
            if target is None:
                continue
            revision = target.revision
            restarts.append(PodRestarts(record.pod, revision, record.restarts))
            if not record.ready:
                continue  # the operator scrapes Ready pods only
            scraped = self._scrape(target, record)
            results.append(scraped)
            # The operator probes /health every round; a recording without the answer counts a pod whose
            # /metrics was scraped as healthy, and leaves one whose scrape failed unprobed.
            if record.health is not None:
                health.append((target, record.health))
            elif scraped.outcome in ("ok", "incomplete"):
                health.append((target, True))
        report = self.counters.observe(results)
        self._note_left_out(report.violations, records)
        if in_flight is not None:
            self.windows.add(report, results, health, restarts)
        canary_ready = self._canary_ready(pods)
        compared = [record for record in pods if record.role == self.compare_with and record.ready]
        stable_serving = bool(compared) and (self.status is None or self.status.weight < 100
                                             or self.compare_with == "baseline")
        if starting:
            return
        if in_flight is not None and in_flight.weight < 100 and not stable_serving:
            # The operator judges so only where nothing of the stable's revision serves (a one-replica pool
            # replaced in place); in a recording it is more often an export that left those pods out.
            self._note(dataclasses.replace(records[0], pod=f"step {in_flight.step + 1} ({in_flight.weight}%)"),
                       f"judged without a Ready {self.compare_with} pod",
                       "health, restarts and errors only (NoBaselineHealthy), as a one-replica pool replaced in "
                       "place is; an export that left those pods out is judged so too")
        verdict = self._verdict(route_percent, stable_serving)
        self._advance(verdict, at, now, canary_ready=canary_ready, route_percent=route_percent,
                      route_target=self._route_target(pods) if route_percent is not None else None,
                      pool_replicas=self._pool_replicas(pods))

    def _follow_the_recording(self, route_percent: int | None, pods: list[Record], first: Record, at: float,
                              now: datetime) -> None:
        """Go on to the step the recording shows, when it is past the replay's (`follow_recorded_step`). The
        operator decides on its own scrapes, a recorder's come at other moments: a step the operator passed may
        still be undecided on the recorded window when the canary moves on, and the rounds after carry the next
        step's traffic (on 2 replicas the 10% and 50% steps route and size alike, so only the 100% step shows it).
        Added to this step's window, a canary that fails at 100% failed the 50% step in the replay. A step whose
        own verdict failed never gets here: the replay rolled it back when it failed."""
        while self.status is not None and self.status.phase in IN_FLIGHT_PHASES and self.status.weight > 0:
            shown = self._step_shown(route_percent, pods)
            if shown is None:
                return
            following, what = shown
            before = self.status
            self._note(dataclasses.replace(first, pod=f"step {before.step + 1} ({before.weight}%)"),
                       "followed the recording",
                       f"{what}, step {following + 1}'s share, before the replay's window decided the step: the "
                       f"operator passed it on scrapes of its own")
            self._took(before, follow_recorded_step(before, self.rollout, self.last_verdict, now, what),
                       self.last_verdict, at)
            self.last_verdict = None  # the next step's window has none yet

    def _step_shown(self, route_percent: int | None, pods: list[Record]) -> tuple[int, str] | None:
        """(the first step after the one in flight that the recording shows, and what shows it), when no step up to
        the one in flight looks so and it is more than the step in flight's: the recording is past the replay.
        What shows a step is the route's share of the canary when the recording has a route; without one, the
        canary pods Ready (a Service splits by them), read only when the header gives the pool's replicas (surge
        and pending pods make the listed pods no count of it)."""
        status = self.status
        if status is None:
            return None
        steps = self.spec.canary.steps
        if route_percent is not None:
            replicas = self._pool_replicas(pods)
            if replicas is None:
                return None
            looks = [equal_load_percent(replicas, step.weight) for step in steps]
            seen, what = route_percent, f"the recorded route gave the canary {route_percent}%"
        else:
            if self.spec.replicas is None:
                return None
            looks = [step_canary_replicas(self.spec.replicas, steps, index) for index in range(len(steps))]
            seen = sum(record.role == "canary" and record.ready for record in pods)
            what = f"{seen} of the pool's {self.spec.replicas} replicas served the canary Ready"
        current = min(status.step, len(looks) - 1)
        if seen <= looks[current] or seen in looks[:current + 1]:
            return None
        following = next((step for step in range(current + 1, len(looks)) if looks[step] == seen), None)
        return None if following is None else (following, what)

    def _pods(self, records: list[Record], at: float) -> list[Record]:
        """The pods as the operator's cache would hold them at this round: each pod's latest line, for pods seen
        within PODS_SEEN_PERIODS scrape periods. Prometheus scrapes each target at an offset of its own, spread over
        the whole scrape interval (a hash of the target), so a round of its export holds only the pods whose
        offsets fall together; reading the pods from the round alone, a step whose canary replicas were all Ready
        read as "canary pods not ready" half the time and timed out. A recording whose rounds hold every pod (the
        e2e recorder's) reads the same, but for a pod whose lines stop: it counts for up to PODS_SEEN_PERIODS more.
        Without a period (the bench hands in whole rounds), the round's own lines."""
        if self.period is None:
            return records
        self._latest.update((record.pod, record) for record in records)
        horizon = at - PODS_SEEN_PERIODS * self.period
        self._latest = {pod: record for pod, record in self._latest.items() if record.at >= horizon}
        return list(self._latest.values())

    def _pool_replicas(self, pods: list[Record]) -> int | None:
        """The pool's replicas: the recording's `replicas`, else its canary and stable pods (`_pods`) (a
        one-replica pool's surge reads as two, whose steps run one canary pod each as one replica's do)."""
        if self.spec.replicas is not None:
            return self.spec.replicas
        canary = sum(record.role == "canary" for record in pods)
        stable = sum(record.role == "stable" for record in pods)
        return canary + stable if canary and stable else None

    def _canary_ready(self, pods: list[Record]) -> bool:
        """Whether the step's canary replicas serve, as the operator reads it from the canary Deployment: at least
        the step's share of the pool Ready (`step_canary_replicas`) when the recording gives the pool's size, so a
        pod of the canary's revision beyond the step's (a surge pod, the stable Deployment rolling to it once
        promoted) does not hold the step; without the size, every canary pod (`_pods`)."""
        canary_pods = [record for record in pods if record.role == "canary"]
        if not canary_pods:
            return False
        ready = sum(record.ready for record in canary_pods)
        if self.spec.replicas is None or self.status is None:
            return ready == len(canary_pods)
        return ready >= max(1, step_canary_replicas(self.spec.replicas, self.spec.canary.steps, self.status.step))

    def _target(self, record: Record) -> ScrapeTarget | None:
        """The pod as a scrape target of its revision; None for a role the canary is not compared with."""
        revision = self._revision(record.role)
        if revision is None:
            return None
        return ScrapeTarget(pod=record.pod, uid=record.pod, ip="127.0.0.1", port=0, pool=self.spec.pool,
                            revision=revision, k=0, restart_count=record.restarts)

    def _note(self, record: Record, what: str, reason: str) -> None:
        entry = self._unused.get((record.pod, what))
        if entry is None:
            self._unused[(record.pod, what)] = [1, record.line, reason]
        else:
            entry[0] += 1

    def _note_left_out(self, violations: Mapping[str, str], records: list[Record]) -> None:
        """Pods the counter windows left out this round (values vLLM cannot produce, a bucket layout changed
        without a restart...), as the operator names them in its status."""
        for record in records:
            reason = violations.get(record.pod)
            if reason is not None:
                self._note(record, "left out of the counter windows", reason)

    def notes(self) -> tuple[str, ...]:
        """One line per pod and kind of scrape the operator's path could not use, first line first."""
        ordered = sorted(self._unused.items(), key=lambda item: (item[1][1], item[0]))
        lines = []
        for (pod, what), (count, line, reason) in ordered[:MAX_NOTES]:
            where = f", first at line {line}" if line else ""
            lines.append(f"{pod}: {count} scrape{'s' if count != 1 else ''} {what}{where}: {reason}")
        if len(ordered) > MAX_NOTES:
            lines.append(f"and {len(ordered) - MAX_NOTES} more pods or kinds")
        return tuple(lines)

    def _scrape(self, target: ScrapeTarget, record: Record) -> ScrapeResult:
        if record.metrics is None:
            return ScrapeResult(target, record.at, "http_error", error="no /metrics in the recording")
        try:
            sample = parse_metrics(record.metrics)
        except MetricsParseError as err:
            self._note(record, "unreadable", str(err))
            return ScrapeResult(target, record.at, "parse_error", error=str(err))
        if sample.problems:
            self._note(record, "incomplete", "; ".join(sample.problems))
        with_k = ScrapeTarget(target.pod, target.uid, target.ip, target.port, target.pool, target.revision,
                              sample.k, target.restart_count)
        return ScrapeResult(with_k, record.at, "ok" if sample.complete else "incomplete", sample)

    def _verdict(self, route_percent: int | None, stable_serving: bool) -> Verdict | None:
        status = self.status
        if status is None:
            return None
        expected = None
        if route_percent is not None and self.compare_with == "stable" and 0 < route_percent < 100:
            expected = route_percent / 100
        verdicts = step_verdicts(VerdictInputs(
            self.windows, status, self.thresholds, self.spec.gpus_per_pod, self.spec.canary_k or 1,
            last_decision=self.last_decision, stable_serving=stable_serving, expected_share=expected))
        verdict = verdicts.get(status.canary_revision)
        if verdict is not None:
            self.last_verdict = verdict
            if self.on_verdict is not None:
                fallback = status.canary_k if status.canary_k is not None else 1
                canary = self.windows.stats(CANARY_REVISION, self.windows.ks.get(CANARY_REVISION, fallback),
                                            self.spec.gpus_per_pod)
                stable = self.windows.stats(STABLE_REVISION, self.windows.ks.get(STABLE_REVISION, fallback),
                                            self.spec.gpus_per_pod) if stable_serving else None
                self.on_verdict(status.step, canary, stable, verdict)
        return verdict

    def _route_target(self, pods: list[Record]) -> int | None:
        """The percent the route must carry before the step may pass, as the operator asks it: the step's replica
        split (`equal_load_percent`), not its nominal weight (10% of 12 replicas is one pod: the route gives 8%)."""
        status = self.status
        if status is None or status.weight <= 0:
            return None
        if self.spec.replicas is not None:
            return equal_load_percent(self.spec.replicas, status.weight)
        canary = sum(record.role == "canary" for record in pods)
        stable = sum(record.role == "stable" for record in pods)
        if canary == 0 or stable == 0:
            return None
        return replica_share_percent(stable, canary)

    def _advance(self, verdict: Verdict | None, at: float, now: datetime, *, canary_ready: bool,
                 route_percent: int | None, route_target: int | None = None,
                 pool_replicas: int | None = None) -> None:
        before = self.status
        progress = advance(before, target=self.target, rollout=self.rollout, now=now, action=None,
                           seen=StepObservation(verdict, canary_ready, route_percent=route_percent,
                                                route_target=route_target, pool_replicas=pool_replicas))
        self._took(before, progress, verdict, at)

    def _took(self, before: CanaryStatus | None, progress: CanaryProgress, verdict: Verdict | None,
              at: float) -> None:
        """The step machine's move: the new status, and how a step or the canary ended."""
        after = progress.status
        self.status = after
        self.last_at = at
        event = progress.event
        if after is None or event is None:
            return
        if event.reason == "CanaryStepStarted":
            self.step_started = at
            self.last_verdict = None
            return
        if before is None or event.reason == "CanaryStarted":
            return
        steps = self.spec.canary.steps
        weight = steps[min(before.step, len(steps) - 1)].weight
        seconds = at - (self.step_started if self.step_started is not None else at)
        ended = STEP_ENDINGS.get(event.reason)
        if ended is not None:
            self.steps.append(StepResult(before.step, weight, ended, seconds, verdict, event.message))
            self.step_started = at
        if after.phase not in IN_FLIGHT_PHASES:
            reason = event.reason
            if event.reason == "CanaryFailed" and verdict is not None:
                reason = f"{event.reason}/{verdict.reason}"
            self.result = ReplayResult(after.phase, reason, event.message, at - (self.started_at or at),
                                       tuple(self.steps))

    def finish(self) -> ReplayResult:
        """The outcome; a recording that ends mid-canary is Unfinished, with where it stood. Both with the notes
        on scrapes the operator's path could not use."""
        if self.result is not None:
            return dataclasses.replace(self.result, notes=self.notes())
        status = self.status
        steps = list(self.steps)
        if status is not None and status.phase in IN_FLIGHT_PHASES:
            weight = self.spec.canary.steps[min(status.step, len(self.spec.canary.steps) - 1)].weight
            seconds = (self.last_at or 0.0) - (self.step_started or self.last_at or 0.0)
            message = self.last_verdict.message if self.last_verdict is not None else "no verdict yet"
            steps.append(StepResult(status.step, weight, "Unfinished", seconds, self.last_verdict, message))
        verdict = self.last_verdict
        return ReplayResult("Unfinished", verdict.reason if verdict is not None else "NoVerdict",
                            "the recording ends before the canary does",
                            (self.last_at or 0.0) - (self.started_at or 0.0), tuple(steps), self.notes())


def replay(records: Iterable[Record], spec: ReplaySpec, on_verdict: VerdictHook | None = None) -> ReplayResult:
    """Replay a whole recording; the canary is compared with `baseline` pods when the recording has any."""
    listed = list(records)
    compare_with: Role = "baseline" if any(record.role == "baseline" for record in listed) else "stable"
    period = scrape_period(listed)
    replayer = Replayer(spec, compare_with=compare_with, on_verdict=on_verdict, period=period or None)
    for batch in rounds(listed, period):
        replayer.round(batch)
        if replayer.finished:
            break
    return replayer.finish()


def format_result(result: ReplayResult, spec: ReplaySpec) -> str:
    """Each step's end with its verdict and numbers, then the outcome."""
    lines = []
    total = len(spec.canary.steps)
    for step in result.steps:
        verdict = step.verdict
        head = f"step {step.step + 1}/{total} ({step.weight}%) {step.ended} after {step.seconds:.0f} s"
        if verdict is not None:
            load = ""
            if verdict.canary_load is not None:
                stable = f" vs {verdict.stable_load:.2f}" if verdict.stable_load is not None else ""
                load = f"; per-pod load {verdict.canary_load:.2f}{stable} requests/s"
            lines.append(f"{head}: {verdict.outcome} ({verdict.reason}){load}\n  {verdict.message}")
        else:
            lines.append(f"{head}: no verdict\n  {step.event}")
    lines += [f"note: {note}" for note in result.notes]
    lines.append(f"outcome: {result.outcome} ({result.reason}) after {result.seconds:.0f} s: {result.message}")
    return "\n".join(lines) + "\n"
