"""The tuning step of a reconcile: scrape Ready runtime pods, feed the model's tuner, take its decision.

The tuner's memory lives here per model; what must survive a restart (effective K, last change time,
last decision) is in status, from which a fresh tuner is rebuilt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import SpeculationStatus, SpeculativeModelStatus
from specdec_operator.handlers.context import OperatorContext
from specdec_operator.reconcile.observed import EventRecord, ObservedModel
from specdec_operator.reconcile.tuning_inputs import pool_contexts, scrape_targets, speculation_status
from specdec_operator.tuner.engine import TunerState
from specdec_operator.tuner.exporter import publish
from specdec_operator.tuner.scraper import scrape
from specdec_runtime import contract


@dataclass
class ModelTuner:
    state: TunerState
    next_scrape_at: float = 0.0
    next_evaluation_at: float = 0.0


@dataclass(frozen=True)
class TuningOutcome:
    k_overrides: dict[str, int] = field(default_factory=dict)
    speculation: SpeculationStatus | None = None
    events: tuple[EventRecord, ...] = ()


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    if not autotune.enabled or not previous.pools:
        ctx.tuners.pop(key, None)
        return TuningOutcome()
    tuner = ctx.tuners.get(key)
    if tuner is None:
        tuner = ctx.tuners[key] = ModelTuner(TunerState.from_status(previous.speculation))
        tuner.next_evaluation_at = time.time() + autotune.interval_seconds
    now = time.time()
    contexts = pool_contexts(previous.pools, spec.model.tensor_parallel_size, rolling)
    if now >= tuner.next_scrape_at:
        tuner.next_scrape_at = now + ctx.settings.scrape_interval_seconds
        selector = f"{contract.LABEL_MODEL}={observed.name},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
        pods = await ctx.api.list("Pod", observed.namespace, selector)
        results = await scrape(
            scrape_targets(pods),
            timeout_s=ctx.settings.scrape_timeout_seconds,
            concurrency=ctx.settings.scrape_concurrency,
            session=session,
            allow_non_loopback=not ctx.settings.scrape_loopback_only,
        )
        tuner.state.observe(contexts, results)
    if now < tuner.next_evaluation_at:
        return TuningOutcome()
    tuner.next_evaluation_at = now + autotune.interval_seconds
    report = tuner.state.evaluate(now, contexts, spec.speculation)
    publish(observed.namespace, observed.name, report)
    decision = report.decision
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
    status = speculation_status(previous.speculation, report.stats, decision, change_time)
    return TuningOutcome(k_overrides=overrides, speculation=status, events=tuple(events))
