"""The tuner's and the canary's part of gathering: scrape Ready runtime pods, feed the model's windows.

This is I/O and memory only: the scrape round's results and health probes feed the tuner's counter windows
and the canary's evidence (caches), and `observe_tuning` hands them to the pass as `TuningInputs`. The K
decision and the canary verdict are made by the pure evaluation (reconcile/tuning_policy.py); what it
proposes is committed to the tuner's memory only after status holds it (`commit_tuning`).

What must survive a restart (each pool's K, the last decision with its time, the canary step and its timers)
is in status. Canary windows (canary/evidence.py) restart with the process; a process that takes over a step
restarts the step's clock with them, which delays a verdict but never skips, repeats or times out a step.
Time comes from the context's injected clocks: monotonic for the windows and the pacing, wall clock where
the canary windows compare with stamps in status.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp
from pydantic import ValidationError

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import SpeculativeModelStatus
from specdec_operator.canary.evidence import pod_restarts
from specdec_operator.canary.plan import IN_FLIGHT_PHASES
from specdec_operator.handlers.context import Logger, OperatorContext
from specdec_operator.handlers.model_memory import ModelTuner
from specdec_operator.kube.api import KubeApiError
from specdec_operator.reconcile.observed import ObservedModel, TuningInputs
from specdec_operator.reconcile.plan import read_status
from specdec_operator.reconcile.tuning_inputs import pool_contexts, rolling_pools, scrape_targets
from specdec_operator.reconcile.tuning_policy import TuningOutcome
from specdec_operator.render.names import label_value
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.exporter import publish_exclusions
from specdec_operator.tuner.scraper import probe_health
from specdec_operator.tuner.window import QUARANTINE_S

logger = logging.getLogger(__name__)


async def _observe_round(
    ctx: OperatorContext,
    session: aiohttp.ClientSession,
    tuner: ModelTuner,
    namespace: str,
    name: str,
    uid: str,
    previous: SpeculativeModelStatus,
    contexts: list[PoolContext],
    max_k: int,
) -> None:
    """Tell the scrape scheduler which pods the model has now; feed the tuner every round it finished since.

    The scheduler scrapes on its own operator-wide schedule (handlers/services/scrapes.py); this only reads. A pod the
    tuner's windows exclude (counters vLLM cannot produce) is logged once when it is excluded, and exported in
    specdec_pod_metrics_excluded while it stays out.
    """
    assert ctx.scrapes is not None  # started in configure(), before any model loop
    tuner.next_scrape_at = ctx.clock() + ctx.settings.scrape_interval_seconds
    key = (namespace, name)
    pods = ctx.cache.pods(namespace, label_value(name), uid)
    targets = scrape_targets(pods)
    ctx.scrapes.want(key, targets)
    allow = not ctx.settings.scrape_loopback_only
    for results in ctx.scrapes.take(key):
        excluded_before = tuner.state.excluded_pods()
        report = tuner.state.observe(contexts, results, ctx.clock(), max_k=max_k)
        for pod, reason in sorted(report.violations.items()):
            if pod not in excluded_before:
                logger.warning("%s/%s: pod %s left out of tuning and canary analysis for %ds: its /metrics is not "
                               "what vLLM produces: %s", namespace, name, pod, QUARANTINE_S, reason)
        if tuner.canary.step is not None and previous.canary is not None:
            compared = {previous.canary.canary_revision, previous.canary.stable_revision}
            watched = [target for target in targets if target.revision in compared]
            health = await probe_health(watched, session, ctx.settings.scrape_timeout_seconds, allow)
            tuner.canary.add(report, results, health, pod_restarts(pods))
    publish_exclusions(namespace, name, tuner.state.exclusions)


async def scrape_tick(ctx: OperatorContext, session: aiohttp.ClientSession, body: Mapping[str, Any]) -> None:
    """A scrape between full reconciles: the tuner a full reconcile set up is fed, nothing is decided or written."""
    meta = body["metadata"]
    known = ctx.known(meta["namespace"], meta["name"])
    tuner = known.tuner if known is not None else None
    if tuner is None or ctx.clock() < tuner.next_scrape_at:
        return
    tuner.next_scrape_at = ctx.clock() + ctx.settings.scrape_interval_seconds
    try:
        spec = SpeculativeModelSpec.model_validate(dict(body.get("spec", {})))
    except ValidationError:
        return
    read = read_status(body.get("status") or {})
    if read.problems:
        return
    contexts = pool_contexts(read.status.pools, spec.tensor_parallel, tuner.rolling)
    await _observe_round(ctx, session, tuner, meta["namespace"], meta["name"], str(meta["uid"]), read.status,
                         contexts, spec.speculation.max_k)


def next_wake(ctx: OperatorContext, namespace: str, name: str) -> tuple[float, float] | None:
    """(next scrape, next evaluation) of the model's tuner, monotonic; None without a tuner."""
    known = ctx.known(namespace, name)
    tuner = known.tuner if known is not None else None
    return None if tuner is None else (tuner.next_scrape_at, tuner.next_evaluation_at)


def _tuned_status(observed: ObservedModel) -> tuple[SpeculativeModelSpec, SpeculativeModelStatus] | None:
    """Tuning needs known pods, a valid spec and a readable status; anything else is the plan's to report."""
    if not observed.children_known:
        return None
    try:
        spec = SpeculativeModelSpec.model_validate(dict(observed.spec))
    except ValidationError:
        return None
    read = read_status(observed.status)
    return None if read.problems else (spec, read.status)  # no K decision on a status we cannot fully read


async def observe_tuning(
    ctx: OperatorContext, observed: ObservedModel, wall_now: float, logger: Logger
) -> ObservedModel:
    """Gather: the model's scrape round (when due) into its tuner and canary windows, and what the pure decision
    reads from them (`observed.tuning`) with the pods they leave out (`observed.excluded_pod_metrics`).

    A model with no pools yet, or neither tuned nor canaried, keeps no tuner and is not scraped."""
    valid = _tuned_status(observed)
    if valid is None:
        return observed
    spec, previous = valid
    key = (observed.namespace, observed.name)
    autotune = spec.speculation.autotune
    memory = ctx.model(*key)
    if not previous.pools or not (autotune.enabled or spec.rollout.strategy == "Canary"):
        ctx.forget_tuner(*key)
        return observed
    now = ctx.clock()
    tuner = memory.tuner
    if tuner is None:
        state = TunerState.from_status(previous.speculation, wall_now=wall_now, monotonic_now=now)
        tuner = memory.tuner = ModelTuner(state)
        tuner.next_evaluation_at = now + autotune.interval_seconds
    in_flight = previous.canary if previous.canary and previous.canary.phase in IN_FLIGHT_PHASES else None
    # The canary windows compare against stamps in status: they keep wall-clock time.
    tuner.canary.follow(
        in_flight, wall_now,
        max_gap_s=2 * ctx.settings.reconcile_interval_seconds + ctx.settings.scrape_interval_seconds,
    )
    rolling = rolling_pools(observed.children_of_kind("Deployment"))
    if in_flight is not None:
        # No K decision while a canary is in flight: its verdict (and a rollback to the K the decision record
        # says it left) must concern one decision only.
        rolling |= {pool.name for pool in previous.pools}
    tuner.rolling = set(rolling)
    if now >= tuner.next_scrape_at:
        contexts = pool_contexts(previous.pools, spec.tensor_parallel, rolling,
                                 previous.speculation.rejected_ks)
        try:
            await _observe_round(ctx, ctx.http, tuner, observed.namespace, observed.name, observed.uid, previous,
                                 contexts, spec.speculation.max_k)
        except KubeApiError as error:
            logger.warning("tuning skipped this round: %s", error)
            return observed
    inputs = TuningInputs(
        state=tuner.state, windows=tuner.canary, now=now, next_evaluation_at=tuner.next_evaluation_at,
        rolling=frozenset(rolling), route_rejection=memory.route_rejection,
        decision_id=uuid.uuid4().hex[:12],
    )
    excluded = tuple(sorted(tuner.state.excluded_pods().items()))
    return dataclasses.replace(observed, tuning=inputs, excluded_pod_metrics=excluded)


def pace_tuning(ctx: OperatorContext, observed: ObservedModel, outcome: TuningOutcome) -> None:
    """What the pass's evaluation did to the tuner that holds whatever is written: its next evaluation time, and
    the route's rejection as gathered (the pass's writes publish its report on /metrics)."""
    known = ctx.known(observed.namespace, observed.name)
    tuner = known.tuner if known is not None else None
    if known is not None and observed.tuning is not None:
        known.route_rejection = outcome.route_rejection  # as gathered this pass, kept for a pass that cannot read
    if tuner is not None and outcome.next_evaluation_at is not None:
        tuner.next_evaluation_at = outcome.next_evaluation_at


def commit_tuning(ctx: OperatorContext, namespace: str, name: str, outcome: TuningOutcome) -> None:
    """The proposal is in status: the tuner may now remember it (its cooldown runs from it)."""
    if outcome.proposal is None:
        return
    known = ctx.known(namespace, name)
    tuner = known.tuner if known is not None else None
    if tuner is not None:
        tuner.state.commit(outcome.proposal, outcome.proposed_at)
