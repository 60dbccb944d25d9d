"""The observation step of a reconcile: scrape Ready runtime pods, feed the model's tuner and canary windows.

The tuner's memory lives here per model; what must survive a restart (each pool's K, the last decision
with its time, the canary step and its timers) is in status. A proposed K change is committed to the
tuner's memory only after the reconciler has written it to status (`TuningOutcome.commit`). Canary
windows restart with the process, which delays a verdict but never skips or repeats a step.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from pydantic import ValidationError

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import CanaryStatus, SpeculationStatus, SpeculativeModelStatus, TuningDecision
from specdec_operator.canary.analysis import Verdict, WindowStats, analyse
from specdec_operator.canary.plan import IN_FLIGHT_PHASES
from specdec_operator.handlers.context import OperatorContext
from specdec_operator.handlers.health import probe_health
from specdec_operator.reconcile.observed import EventRecord, ObservedModel
from specdec_operator.reconcile.plan import read_status
from specdec_operator.reconcile.tuning_inputs import pool_contexts, scrape_targets, speculation_status
from specdec_operator.render.names import label_value
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.exporter import count_k_change, publish
from specdec_operator.tuner.samples import ScrapeResult, ScrapeTarget
from specdec_operator.tuner.scraper import scrape
from specdec_operator.tuner.window import WindowDelta, WindowReport
from specdec_runtime import contract

SCRAPED_OK = ("ok", "incomplete")
FAILURES_IN_A_ROW = 3


@dataclass
class CanaryWindows:
    """Counter increases per revision since the current canary step started, plus health failures."""

    step: tuple[str, str, int] | None = None  # (canary revision, stepStartedAt, step)
    deltas: dict[str, WindowDelta] = field(default_factory=dict)
    health_failures: Counter[str] = field(default_factory=Counter)
    ks: dict[str, int] = field(default_factory=dict)  # the K each revision's counters came from
    # Pods that have answered /health once. Before that a pod is still loading its model: vLLM answers
    # 503 until then, and a real cluster's readiness probe would keep it out of traffic anyway.
    healthy_once: set[str] = field(default_factory=set)
    # Failed probes in a row per pod; one blip (a pod IP handed over between processes) is not a failure.
    failing: Counter[str] = field(default_factory=Counter)

    def follow(self, canary: CanaryStatus | None) -> None:
        key = (canary.canary_revision, canary.step_started_at, canary.step) if canary else None
        if key != self.step:
            self.step, self.deltas, self.health_failures = key, {}, Counter()

    def add(self, report: WindowReport, results: list[ScrapeResult], health: list[tuple[ScrapeTarget, bool]]) -> None:
        for key, delta in report.deltas.items():
            self.ks[key.revision] = key.k
            self.deltas[key.revision] = self.deltas[key.revision].plus(delta) if key.revision in self.deltas else delta
        # A served /metrics proves the engine loaded; only /health itself clears a run of failures,
        # since a dead engine's HTTP server may still answer /metrics.
        for result in results:
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

    def _failed(self, target: ScrapeTarget) -> None:
        if target.uid in self.healthy_once:
            self.failing[target.uid] += 1
            if self.failing[target.uid] == FAILURES_IN_A_ROW:
                self.health_failures[target.revision] += 1

    def stats(self, revision: str, k: int, gpus: int) -> WindowStats:
        delta = self.deltas.get(revision, WindowDelta())
        return WindowStats(
            seconds=delta.pod_seconds,
            gpus=gpus,
            k=k,
            drafts=delta.drafts,
            draft_tokens=delta.draft_tokens,
            accepted_tokens=delta.accepted,
            generation_tokens=delta.generation_tokens,
            health_failures=self.health_failures[revision],
        )


@dataclass
class ModelTuner:
    state: TunerState
    next_scrape_at: float = 0.0  # monotonic
    next_evaluation_at: float = 0.0  # monotonic
    canary: CanaryWindows = field(default_factory=CanaryWindows)


@dataclass(frozen=True)
class TuningOutcome:
    speculation: SpeculationStatus | None = None
    events: tuple[EventRecord, ...] = ()
    verdicts: dict[str, Verdict | None] = field(default_factory=dict)
    # A K change the tuner proposes: it is written to status first, then committed with `commit`.
    proposal: TuningDecision | None = None
    proposed_at: float = 0.0  # monotonic time of the proposal, the cooldown's start once committed

    def commit(self, tuner: ModelTuner | None, namespace: str, name: str) -> None:
        """The proposal is in status: the tuner may now remember it, and it counts as a K change."""
        if self.proposal is None:
            return
        if tuner is not None:
            tuner.state.commit(self.proposal, self.proposed_at)
        count_k_change(namespace, name, self.proposal)


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _verdicts(tuner: ModelTuner, spec: SpeculativeModelSpec, canary: CanaryStatus | None) -> dict[str, Verdict | None]:
    if canary is None or canary.phase not in IN_FLIGHT_PHASES or canary.weight == 0:
        return {}
    thresholds = spec.rollout.canary.analysis if spec.rollout.canary else None
    if thresholds is None:
        return {}
    gpus = spec.model.tensor_parallel_size
    fallback_k = canary.canary_k if canary.canary_k is not None else spec.speculation.initial_k
    windows = tuner.canary
    verdict = analyse(
        windows.stats(canary.canary_revision, windows.ks.get(canary.canary_revision, fallback_k), gpus),
        windows.stats(canary.stable_revision, windows.ks.get(canary.stable_revision, fallback_k), gpus),
        thresholds,
    )
    return {canary.canary_revision: verdict}


async def _observe_round(
    ctx: OperatorContext,
    session: aiohttp.ClientSession,
    tuner: ModelTuner,
    namespace: str,
    name: str,
    previous: SpeculativeModelStatus,
    contexts: list[PoolContext],
) -> None:
    """One scrape of the model's Ready pods into the tuner (and the canary windows); reads only."""
    tuner.next_scrape_at = time.monotonic() + ctx.settings.scrape_interval_seconds
    selector = f"{contract.LABEL_MODEL}={label_value(name)},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
    targets = scrape_targets(await ctx.api.list("Pod", namespace, selector))
    allow = not ctx.settings.scrape_loopback_only
    results = await scrape(targets, timeout_s=ctx.settings.scrape_timeout_seconds,
                           concurrency=ctx.settings.scrape_concurrency, session=session, allow_non_loopback=allow)
    report = tuner.state.observe(contexts, results)
    if tuner.canary.step is not None and previous.canary is not None:
        compared = {previous.canary.canary_revision, previous.canary.stable_revision}
        watched = [target for target in targets if target.revision in compared]
        health = await probe_health(watched, session, ctx.settings.scrape_timeout_seconds, allow)
        tuner.canary.add(report, results, health)


async def scrape_tick(ctx: OperatorContext, session: aiohttp.ClientSession, body: Mapping[str, Any]) -> None:
    """A scrape between full reconciles: the tuner a full reconcile set up is fed, nothing is decided or written."""
    meta = body["metadata"]
    tuner = ctx.tuners.get((meta["namespace"], meta["name"]))
    if tuner is None or time.monotonic() < tuner.next_scrape_at:
        return
    tuner.next_scrape_at = time.monotonic() + ctx.settings.scrape_interval_seconds
    try:
        spec = SpeculativeModelSpec.model_validate(dict(body.get("spec", {})))
    except ValidationError:
        return
    read = read_status(body.get("status") or {})
    if read.problems:
        return
    contexts = pool_contexts(read.status.pools, spec.model.tensor_parallel_size, set())
    await _observe_round(ctx, session, tuner, meta["namespace"], meta["name"], read.status, contexts)


def next_wake(ctx: OperatorContext, namespace: str, name: str) -> tuple[float, float] | None:
    """(next scrape, next evaluation) of the model's tuner, monotonic; None without a tuner."""
    tuner = ctx.tuners.get((namespace, name))
    return None if tuner is None else (tuner.next_scrape_at, tuner.next_evaluation_at)


async def tuning_step(
    ctx: OperatorContext,
    session: aiohttp.ClientSession,
    observed: ObservedModel,
    spec: SpeculativeModelSpec,
    previous: SpeculativeModelStatus,
    rolling: set[str],
) -> TuningOutcome:
    autotune = spec.speculation.autotune
    key = (observed.namespace, observed.name)
    canary_mode = spec.rollout.strategy == "Canary"
    if not previous.pools or not (autotune.enabled or canary_mode):
        ctx.tuners.pop(key, None)
        return TuningOutcome()
    now = time.monotonic()
    tuner = ctx.tuners.get(key)
    if tuner is None:
        state = TunerState.from_status(previous.speculation, wall_now=time.time(), monotonic_now=now)
        tuner = ctx.tuners[key] = ModelTuner(state)
        tuner.next_evaluation_at = now + autotune.interval_seconds
    in_flight = previous.canary if previous.canary and previous.canary.phase in IN_FLIGHT_PHASES else None
    tuner.canary.follow(in_flight)
    if in_flight is not None:
        # No K decision while a canary is in flight: its verdict (and a rollback to the K the decision record
        # says it left) must concern one decision only.
        rolling = rolling | {pool.name for pool in previous.pools}
    contexts = pool_contexts(previous.pools, spec.model.tensor_parallel_size, rolling)
    if now >= tuner.next_scrape_at:
        await _observe_round(ctx, session, tuner, observed.namespace, observed.name, previous, contexts)
    verdicts = _verdicts(tuner, spec, previous.canary)
    if not autotune.enabled:
        tuner.next_evaluation_at = math.inf  # nothing to evaluate: the loop must not wake for it
        return TuningOutcome(verdicts=verdicts)
    if tuner.next_evaluation_at == math.inf:
        tuner.next_evaluation_at = now + autotune.interval_seconds
    if now < tuner.next_evaluation_at:
        return TuningOutcome(verdicts=verdicts)
    tuner.next_evaluation_at = now + autotune.interval_seconds
    report_ = tuner.state.evaluate(now, contexts, spec.speculation)
    publish(observed.namespace, observed.name, report_)
    proposed = report_.decision
    events: list[EventRecord] = []
    decision = None
    if proposed is not None and proposed.to_k != proposed.from_k:
        # The record users (and a restarted operator) read: wall-clock stamp, an id for the audit trail.
        decision = proposed.model_copy(update={"time": _rfc3339(time.time()), "id": uuid.uuid4().hex[:12]})
        events.append(EventRecord(
            "Normal", "KChanged" if decision.action == "Change" else "KExplore",
            f"{decision.pool}: K {decision.from_k} -> {decision.to_k}, predicted gain {decision.predicted_gain:+.1%}, "
            f"confidence {decision.confidence:.0%}: {decision.reason} (decision {decision.id})",
        ))
    status = speculation_status(previous.speculation, report_.stats, decision)
    return TuningOutcome(speculation=status, events=tuple(events), verdicts=verdicts, proposal=decision,
                         proposed_at=now)
