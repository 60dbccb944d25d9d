"""The observation step of a reconcile: scrape Ready runtime pods, feed the model's tuner and canary windows.

The tuner's memory lives here per model; what must survive a restart (effective K, last change time,
last decision, the canary step and its timers) is in status. Canary windows (canary/evidence.py)
restart with the process; a process that takes over a step restarts the step's clock with them, which
delays a verdict but never skips, repeats or times out a step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import SpeculationStatus, SpeculativeModelStatus
from specdec_operator.canary.analysis import Verdict
from specdec_operator.canary.evidence import CanaryWindows, canary_verdicts, pod_restarts
from specdec_operator.canary.plan import IN_FLIGHT_PHASES
from specdec_operator.handlers.context import OperatorContext
from specdec_operator.handlers.health import probe_health
from specdec_operator.reconcile.observed import EventRecord, ObservedModel
from specdec_operator.reconcile.tuning_inputs import pool_contexts, scrape_targets, speculation_status
from specdec_operator.render.names import label_value
from specdec_operator.tuner.engine import TunerState
from specdec_operator.tuner.exporter import publish
from specdec_operator.tuner.scraper import scrape
from specdec_runtime import contract


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
    tuner.canary.follow(
        previous.canary if previous.canary and previous.canary.phase in IN_FLIGHT_PHASES else None,
        time.time(),
        max_gap_s=2 * ctx.settings.reconcile_interval_seconds + ctx.settings.scrape_interval_seconds,
    )
    now = time.time()
    contexts = pool_contexts(previous.pools, spec.model.tensor_parallel_size, rolling)
    if now >= tuner.next_scrape_at:
        tuner.next_scrape_at = now + ctx.settings.scrape_interval_seconds
        model_label = label_value(observed.name)
        selector = f"{contract.LABEL_MODEL}={model_label},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
        pods = await ctx.api.list("Pod", observed.namespace, selector)
        targets = scrape_targets(pods)
        allow = not ctx.settings.scrape_loopback_only
        results = await scrape(targets, timeout_s=ctx.settings.scrape_timeout_seconds,
                               concurrency=ctx.settings.scrape_concurrency, session=session, allow_non_loopback=allow)
        report = tuner.state.observe(contexts, results)
        if tuner.canary.step is not None and previous.canary is not None:
            compared = {previous.canary.canary_revision, previous.canary.stable_revision}
            watched = [target for target in targets if target.revision in compared]
            health = await probe_health(watched, session, ctx.settings.scrape_timeout_seconds, allow)
            tuner.canary.add(report, results, health, pod_restarts(pods))
    thresholds = spec.rollout.canary.analysis if spec.rollout.canary else None
    verdicts = route_hold(
        canary_verdicts(tuner.canary, previous.canary, thresholds, spec.model.tensor_parallel_size,
                        spec.speculation.initial_k),
        ctx.route_rejections.get(key),
    )
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
