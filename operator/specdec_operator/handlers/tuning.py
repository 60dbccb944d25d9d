"""The observation step of a reconcile: scrape Ready runtime pods, feed the model's tuner and canary windows.

The tuner's memory lives here per model; what must survive a restart (effective K, last change time,
last decision, the canary step and its timers) is in status. Canary windows restart with the process,
which delays a verdict but never skips or repeats a step.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import CanaryStatus, SpeculationStatus, SpeculativeModelStatus
from specdec_operator.canary.analysis import Verdict, WindowStats, analyse
from specdec_operator.canary.plan import IN_FLIGHT_PHASES
from specdec_operator.handlers.context import OperatorContext
from specdec_operator.handlers.health import probe_health
from specdec_operator.reconcile.observed import EventRecord, ObservedModel
from specdec_operator.reconcile.tuning_inputs import pool_contexts, scrape_targets, speculation_status
from specdec_operator.render.names import label_value
from specdec_operator.tuner.engine import TunerState
from specdec_operator.tuner.exporter import publish
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
    next_scrape_at: float = 0.0
    next_evaluation_at: float = 0.0
    canary: CanaryWindows = field(default_factory=CanaryWindows)


@dataclass(frozen=True)
class TuningOutcome:
    k_overrides: dict[str, int] = field(default_factory=dict)
    speculation: SpeculationStatus | None = None
    events: tuple[EventRecord, ...] = ()
    verdicts: dict[str, Verdict | None] = field(default_factory=dict)


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def route_hold(verdicts: dict[str, Verdict | None], rejection: tuple[str, str] | None) -> dict[str, Verdict | None]:
    """A Gateway that refuses the route turns a canary's Pass into Inconclusive: a step must not pass on
    traffic that never reached the canary. The step holds; if the route stays refused it times out with the
    Gateway's reason in the rollback event and in status.canary. A Fail stays a Fail (a dead canary rolls
    back whatever the route says)."""
    if rejection is None:
        return verdicts
    reason, message = rejection
    held = Verdict("Inconclusive", reason, f"HTTPRoute not usable for the canary: {message}")
    return {revision: verdict if verdict is not None and verdict.outcome == "Fail" else held
            for revision, verdict in verdicts.items()}


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
    tuner = ctx.tuners.get(key)
    if tuner is None:
        tuner = ctx.tuners[key] = ModelTuner(TunerState.from_status(previous.speculation))
        tuner.next_evaluation_at = time.time() + autotune.interval_seconds
    tuner.canary.follow(previous.canary if previous.canary and previous.canary.phase in IN_FLIGHT_PHASES else None)
    now = time.time()
    contexts = pool_contexts(previous.pools, spec.model.tensor_parallel_size, rolling)
    if now >= tuner.next_scrape_at:
        tuner.next_scrape_at = now + ctx.settings.scrape_interval_seconds
        model_label = label_value(observed.name)
        selector = f"{contract.LABEL_MODEL}={model_label},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
        targets = scrape_targets(await ctx.api.list("Pod", observed.namespace, selector))
        allow = not ctx.settings.scrape_loopback_only
        results = await scrape(targets, timeout_s=ctx.settings.scrape_timeout_seconds,
                               concurrency=ctx.settings.scrape_concurrency, session=session, allow_non_loopback=allow)
        report = tuner.state.observe(contexts, results)
        if tuner.canary.step is not None and previous.canary is not None:
            compared = {previous.canary.canary_revision, previous.canary.stable_revision}
            watched = [target for target in targets if target.revision in compared]
            health = await probe_health(watched, session, ctx.settings.scrape_timeout_seconds, allow)
            tuner.canary.add(report, results, health)
    verdicts = route_hold(_verdicts(tuner, spec, previous.canary), ctx.route_rejections.get(key))
    if not autotune.enabled or now < tuner.next_evaluation_at:
        return TuningOutcome(verdicts=verdicts)
    tuner.next_evaluation_at = now + autotune.interval_seconds
    report_ = tuner.state.evaluate(now, contexts, spec.speculation)
    publish(observed.namespace, observed.name, report_)
    decision = report_.decision
    events: list[EventRecord] = []
    overrides: dict[str, int] = {}
    change_time = None
    if decision is not None and decision.to_k != decision.from_k:
        overrides[decision.pool] = decision.to_k
        change_time = _rfc3339(now)
        events.append(EventRecord(
            "Normal", "KChanged" if decision.action == "Change" else "KExplore",
            f"{decision.pool}: K {decision.from_k} -> {decision.to_k}, predicted gain {decision.predicted_gain:+.1%}, "
            f"confidence {decision.confidence:.0%}: {decision.reason}",
        ))
    status = speculation_status(previous.speculation, report_.stats, decision, change_time)
    return TuningOutcome(k_overrides=overrides, speculation=status, events=tuple(events), verdicts=verdicts)
