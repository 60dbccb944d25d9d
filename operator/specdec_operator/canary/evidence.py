"""The evidence of one canary step, per revision, built from the same scrapes the tuner reads.

Pure: the handler hands in counter deltas (tuner/window.py), scrape results and /health answers;
this module turns them into the `WindowStats` the analysis compares:

- speed and acceptance from vLLM's spec-decode and generation-token counters;
- TPOT from bucket increases of vllm:request_time_per_output_token_seconds;
- the error rate from vLLM's own request counters: requests the engine finished with
  finished_reason="error" among all it finished, or 5xx answers among the API server's requests
  (prometheus-fastapi-instrumentator's http_requests_total), whichever is worse: the engine sees
  errors inside streams that were already answered 200, the API server sees failures that never
  reached the engine;
- container restarts from pod status (restartCount increases while the step runs);
- /health failures from probes.

Evidence lives in memory. A process that takes over a step it did not see start (a failover)
cannot know what its predecessor saw, so it opens a fresh window and says so in the verdict
(`Verdict.evidence_since`); the canary state machine then counts the step's pause and timeout from
that moment (docs/canary.md). A failover therefore delays a step; it never ends one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specdec_operator.api.spec import CanaryAnalysis
from specdec_operator.api.status import CanaryStatus, TuningDecision
from specdec_operator.canary.analysis import Cell, KChange, Verdict, WindowStats, analyse
from specdec_operator.canary.histogram import Buckets, merge_histograms
from specdec_operator.canary.plan import IN_FLIGHT_PHASES
from specdec_operator.timestamps import format_stamp, stamp_seconds
from specdec_operator.tuner.samples import HistogramSnapshot, ScrapeResult, ScrapeTarget
from specdec_operator.tuner.window import CounterWindows, WindowDelta, WindowReport
from specdec_runtime import contract

SCRAPED_OK = ("ok", "incomplete")
FAILURES_IN_A_ROW = 3

StepKey = tuple[str, str, int]  # (canary revision, stepStartedAt, step)
# Cells kept per pod and step: beyond this, adjacent intervals merge pairwise (longer blocks), so memory is
# bounded however long a step runs, and blocks grow past the time over which a pod's load stays correlated.
CELLS_PER_POD = 64


@dataclass(frozen=True)
class PodRestarts:
    """A runtime pod's containers' restartCount, summed, from pod status."""

    uid: str
    revision: str
    restart_count: int


def pod_restarts(pods: Iterable[Mapping[str, Any]]) -> list[PodRestarts]:
    """Every runtime pod's restarts, Ready or not: a crash-looping canary is rarely Ready to be scraped."""
    found = []
    for pod in pods:
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        revision = meta.get("labels", {}).get(contract.LABEL_REVISION)
        if not revision or not meta.get("uid"):
            continue
        counts = [c.get("restartCount", 0) for c in status.get("containerStatuses", []) or []]
        found.append(PodRestarts(str(meta["uid"]), str(revision), sum(int(n) for n in counts if isinstance(n, int))))
    return found


@dataclass
class CanaryWindows:
    """Counter increases per revision since the current canary step started, plus health and restarts."""

    step: StepKey | None = None
    deltas: dict[str, WindowDelta] = field(default_factory=dict)
    health_failures: Counter[str] = field(default_factory=Counter)
    ks: dict[str, int] = field(default_factory=dict)  # the K each revision's counters came from
    # Pods that have answered /health once. Before that a pod is still loading its model: vLLM answers
    # 503 until then, and a real cluster's readiness probe would keep it out of traffic anyway.
    healthy_once: set[str] = field(default_factory=set)
    # Failed probes in a row per pod; one blip (a pod IP handed over between processes) is not a failure.
    failing: Counter[str] = field(default_factory=Counter)
    # restartCount per pod when this window first saw it, and the revision the pod runs.
    restart_base: dict[str, int] = field(default_factory=dict)
    restarts_seen: dict[str, int] = field(default_factory=dict)
    pod_revision: dict[str, str] = field(default_factory=dict)
    # Wall clock (Unix seconds): since when this process has been watching without a gap, its last
    # look, and when the current window opened.
    watching_since: float | None = None
    last_look_at: float | None = None
    opened_at: float | None = None
    taken_over: bool = False
    # Deltas of the first scrape after a takeover may reach back before the window (stale baselines).
    drop_next_deltas: bool = False
    # The same increases per pod and scrape interval (the units standard errors are estimated over), from
    # a counter window fed one pod at a time; and the prompt/output length histograms' increases.
    per_pod: CounterWindows = field(default_factory=CounterWindows)
    cells: dict[str, dict[str, list[Cell]]] = field(default_factory=dict)
    lengths: dict[str, tuple[Buckets, Buckets]] = field(default_factory=dict)
    last_lengths: dict[str, tuple[HistogramSnapshot | None, HistogramSnapshot | None]] = field(default_factory=dict)

    def follow(self, canary: CanaryStatus | None, now: float, max_gap_s: float | None = None) -> None:
        """Track the step in flight; a new step (or a resumed one) starts an empty window at `now`.

        A look more than `max_gap_s` after the previous one means this process was not watching in
        between (a paused HA replica that leads again), exactly like a process that just started.
        """
        if self.last_look_at is None or (max_gap_s is not None and now - self.last_look_at > max_gap_s):
            self.watching_since = now
        self.last_look_at = now
        key = (canary.canary_revision, canary.step_started_at, canary.step) if canary else None
        if key == self.step:
            return
        self.step, self.deltas, self.health_failures = key, {}, Counter()
        self.restart_base, self.restarts_seen, self.pod_revision = {}, {}, {}
        self.cells, self.lengths = {}, {}
        self.opened_at = now
        watching_since = self.watching_since if self.watching_since is not None else now
        # Stamps are whole seconds: a step this process started in its first second reads as its own.
        self.taken_over = canary is not None and stamp_seconds(canary.step_started_at) < math.floor(watching_since)
        self.drop_next_deltas = self.taken_over

    @property
    def evidence_since(self) -> str | None:
        """When this window opened, if the step started before this process looked: a takeover."""
        return format_stamp(self.opened_at) if self.taken_over and self.opened_at is not None else None

    def add(
        self,
        report: WindowReport,
        results: list[ScrapeResult],
        health: list[tuple[ScrapeTarget, bool]],
        restarts: Sequence[PodRestarts] = (),
    ) -> None:
        dropping = self.drop_next_deltas
        deltas = {} if dropping else report.deltas
        self.drop_next_deltas = False
        for scraped in results:
            self._cell(scraped, keep=not dropping)
        for key, delta in deltas.items():
            self.ks[key.revision] = key.k
            self.deltas[key.revision] = self.deltas[key.revision].plus(delta) if key.revision in self.deltas else delta
        # A served /metrics proves the engine loaded; only /health itself clears a run of failures,
        # since a dead engine's HTTP server may still answer /metrics.
        for result in results:
            self._restarts(PodRestarts(result.target.uid, result.target.revision, result.target.restart_count))
            if result.outcome in SCRAPED_OK:
                self.healthy_once.add(result.target.uid)
            else:
                self._failed(result.target)
        for target, healthy in health:
            if healthy:
                self.healthy_once.add(target.uid)
                self.failing[target.uid] = 0
            else:
                self._failed(target)
        for pod in restarts:
            self._restarts(pod)

    def _cell(self, scraped: ScrapeResult, keep: bool) -> None:
        """One pod's increases over its last interval, as a unit of the analysis' standard errors."""
        sample = scraped.sample
        if scraped.outcome != "ok" or sample is None or not sample.complete:
            return
        uid = scraped.target.uid
        lengths = (sample.prompt_tokens, sample.output_tokens)
        before = self.last_lengths.get(uid)
        self.last_lengths[uid] = lengths
        report = self.per_pod.observe([scraped])
        if not keep:
            return
        for key, delta in report.deltas.items():
            requests, errors = _requests_and_errors(delta)
            cell = Cell(
                pod=uid, seconds=delta.pod_seconds, generation_tokens=delta.generation_tokens,
                busy_seconds=delta.itl_sum if delta.itl_count > 0 else delta.running_seconds,
                requests=requests, errors=errors, drafts=delta.drafts, accepted_tokens=delta.accepted,
                accepted_per_position=delta.accepted_per_position, tpot_buckets=delta.tpot_buckets,
                start=scraped.at - delta.pod_seconds,
            )
            pods = self.cells.setdefault(key.revision, {})
            cells = pods.setdefault(uid, [])
            cells.append(cell)
            if len(cells) > CELLS_PER_POD:
                pods[uid] = [a.plus(b) for a, b in zip(cells[0::2], cells[1::2], strict=False)] + (
                    [cells[-1]] if len(cells) % 2 else [])
            if before is not None:
                prompt, output = self.lengths.get(key.revision, ((), ()))
                self.lengths[key.revision] = (_grown(prompt, before[0], lengths[0]),
                                              _grown(output, before[1], lengths[1]))

    def _restarts(self, pod: PodRestarts) -> None:
        # The first sight of a pod is its baseline: restarts before this window are not the step's.
        base = self.restart_base.setdefault(pod.uid, pod.restart_count)
        self.restarts_seen[pod.uid] = max(self.restarts_seen.get(pod.uid, 0), pod.restart_count - base)
        self.pod_revision[pod.uid] = pod.revision

    def _failed(self, target: ScrapeTarget) -> None:
        if target.uid in self.healthy_once:
            self.failing[target.uid] += 1
            if self.failing[target.uid] == FAILURES_IN_A_ROW:
                self.health_failures[target.revision] += 1

    def stats(self, revision: str, k: int, gpus: int) -> WindowStats:
        delta = self.deltas.get(revision, WindowDelta())
        requests, errors = _requests_and_errors(delta)
        return WindowStats(
            seconds=delta.pod_seconds,
            gpus=gpus,
            k=k,
            drafts=delta.drafts,
            draft_tokens=delta.draft_tokens,
            accepted_tokens=delta.accepted,
            generation_tokens=delta.generation_tokens,
            tpot_buckets=delta.tpot_buckets,
            requests=requests,
            errors=errors,
            health_failures=self.health_failures[revision],
            restarts=sum(n for uid, n in self.restarts_seen.items() if self.pod_revision.get(uid) == revision),
            busy_seconds=delta.itl_sum if delta.itl_count > 0 else delta.running_seconds,
            accepted_per_position=delta.accepted_per_position,
            cells=tuple(cell for cells in self.cells.get(revision, {}).values() for cell in cells),
            prompt_buckets=self.lengths.get(revision, ((), ()))[0],
            output_buckets=self.lengths.get(revision, ((), ()))[1],
            pods=len(self.cells.get(revision, {})),
        )


def _grown(total: Buckets, before: HistogramSnapshot | None, after: HistogramSnapshot | None) -> Buckets:
    """`total` plus what a length histogram gained between two scrapes of one pod (nothing across a reset)."""
    if before is None or after is None:
        return total
    grown = after.minus(before)
    if grown is None or any(count < 0 for _, count in grown.buckets):
        return total
    return merge_histograms([total, grown.buckets])


def _requests_and_errors(delta: WindowDelta) -> tuple[float, float]:
    """(requests, errors) from the engine's or the API server's counters, whichever shows the higher rate."""
    counted = delta.requests
    engine = (counted.finished, counted.errored)
    http = (counted.http, counted.http_5xx)

    def rate(pair: tuple[float, float]) -> float:
        return pair[1] / pair[0] if pair[0] > 0 else -1.0

    return http if rate(http) > rate(engine) else engine


def k_change_under_test(canary: CanaryStatus, decision: TuningDecision | None, stable_k: int | None) -> KChange | None:
    """The tuner's K change this canary tests, from the decision record in status: same pool, the stable
    revision runs the K the decision left and the canary the K it chose. A spec change at an unchanged K is
    not one, whatever an older decision says."""
    if canary.canary_k is None or decision is None or decision.action == "Hold":
        return None
    if decision.pool != canary.pool or decision.to_k != canary.canary_k or decision.from_k != stable_k:
        return None
    return KChange(predicted_gain=decision.predicted_gain)


@dataclass(frozen=True)
class VerdictInputs:
    """What a step's verdict is computed from."""

    windows: CanaryWindows
    canary: CanaryStatus | None  # the canary as status records it before this pass
    thresholds: CanaryAnalysis | None  # spec.rollout.canary.analysis
    gpus: int  # per pod (tensor parallel size): throughput figures are per GPU
    initial_k: int  # the K a revision's counters came from when the windows never saw one
    last_decision: TuningDecision | None = None  # the tuner decision the canary may be testing
    # False: the stable Deployment has no replica in this step, so there is no baseline to compare with.
    stable_serving: bool = True
    # The canary's share of requests the route's weights promise (None: unknown, no sample-ratio check).
    expected_share: float | None = None
    # (reason, message) of a Gateway that refuses the route as last read: a Pass becomes Inconclusive.
    route_rejection: tuple[str, str] | None = None


def canary_verdicts(inputs: VerdictInputs) -> dict[str, Verdict | None]:
    """The verdict on the canary revision of the step in flight; empty before traffic reaches it.

    `inputs.stable_serving` False: the stable Deployment has no replica in this step (a one-replica pool
    canaried in place), so there is no baseline to compare against (see `analyse`). `inputs.expected_share`:
    the canary's share of both sides' requests the route's weights promise, for the sample-ratio check (None:
    unknown).
    """
    windows, canary, thresholds, gpus = inputs.windows, inputs.canary, inputs.thresholds, inputs.gpus
    if canary is None or canary.phase not in IN_FLIGHT_PHASES or canary.weight == 0 or thresholds is None:
        return {}
    fallback_k = canary.canary_k if canary.canary_k is not None else inputs.initial_k
    stable = windows.stats(canary.stable_revision, windows.ks.get(canary.stable_revision, fallback_k), gpus)
    verdict = analyse(
        windows.stats(canary.canary_revision, windows.ks.get(canary.canary_revision, fallback_k), gpus),
        stable if inputs.stable_serving else None,
        thresholds,
        k_change_under_test(canary, inputs.last_decision, windows.ks.get(canary.stable_revision)),
        expected_share=inputs.expected_share,
    )
    since = windows.evidence_since if windows.step == (canary.canary_revision, canary.step_started_at, canary.step) \
        else None
    return {canary.canary_revision: replace(verdict, evidence_since=since) if since else verdict}
