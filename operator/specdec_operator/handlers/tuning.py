"""The observation step of a reconcile: scrape Ready runtime pods, feed the model's tuner and canary windows.

The tuner's memory lives here per model; what must survive a restart (each pool's K, the last decision
with its time, the canary step and its timers) is in status. A proposed K change is committed to the
tuner's memory only after the reconciler has written it to status (`TuningOutcome.commit`). Canary
windows (canary/evidence.py) restart with the process; a process that takes over a step restarts the
step's clock with them, which delays a verdict but never skips, repeats or times out a step.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import ValidationError

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import CanaryStatus, SpeculationStatus, SpeculativeModelStatus, TuningDecision
from specdec_operator.canary.analysis import Verdict
from specdec_operator.canary.evidence import pod_restarts
from specdec_operator.canary.plan import IN_FLIGHT_PHASES
from specdec_operator.canary.verdict import VerdictInputs, step_verdicts
from specdec_operator.handlers.context import OperatorContext
from specdec_operator.handlers.health import probe_health
from specdec_operator.handlers.model_memory import ModelTuner
from specdec_operator.reconcile.observed import EventRecord, ObservedModel
from specdec_operator.reconcile.plan import read_status
from specdec_operator.reconcile.tuning_inputs import pool_contexts, scrape_targets, speculation_status
from specdec_operator.render.names import deployment_name, label_value
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.exporter import count_k_change, publish, publish_exclusions
from specdec_operator.tuner.window import QUARANTINE_S

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TuningOutcome:
    speculation: SpeculationStatus | None = None
    events: tuple[EventRecord, ...] = ()
    verdicts: dict[str, Verdict | None] = field(default_factory=dict)
    # A K change the tuner proposes: it is written to status first, then committed with `commit`.
    proposal: TuningDecision | None = None
    proposed_at: float = 0.0  # monotonic time of the proposal, the cooldown's start once committed
    # With strategy Canary a recorded decision is not a K change yet: the canary's promotion makes it one
    # (reconcile/rollout.py posts KChanged then, handlers/reconciler.py counts it).
    rolls_out_now: bool = True
    # Pods whose /metrics vLLM cannot produce, left out of tuning and canary analysis: (pod, why), sorted.
    excluded_pods: tuple[tuple[str, str], ...] = ()

    def commit(self, tuner: ModelTuner | None, namespace: str, name: str) -> None:
        """The proposal is in status: the tuner may now remember it; a rolling K change counts now."""
        if self.proposal is None:
            return
        if tuner is not None:
            tuner.state.commit(self.proposal, self.proposed_at)
        if self.rolls_out_now:
            count_k_change(namespace, name, self.proposal)


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
    contexts = pool_contexts(read.status.pools, spec.model.tensor_parallel_size, tuner.rolling)
    await _observe_round(ctx, session, tuner, meta["namespace"], meta["name"], str(meta["uid"]), read.status,
                         contexts, spec.speculation.max_k)


def next_wake(ctx: OperatorContext, namespace: str, name: str) -> tuple[float, float] | None:
    """(next scrape, next evaluation) of the model's tuner, monotonic; None without a tuner."""
    known = ctx.known(namespace, name)
    tuner = known.tuner if known is not None else None
    return None if tuner is None else (tuner.next_scrape_at, tuner.next_evaluation_at)


def _stable_serving(observed: ObservedModel, canary: CanaryStatus | None) -> bool:
    """Whether the canary pool's stable Deployment keeps a replica: a one-replica pool canaried in place has
    none, so its steps have no baseline (canary/analysis.py)."""
    if canary is None:
        return True
    stable = observed.children.get(("Deployment", deployment_name(canary.pool, "stable")))
    if stable is None:
        return True
    return int((stable.get("spec") or {}).get("replicas", 0) or 0) > 0


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
        ctx.forget_tuner(*key)
        return TuningOutcome()
    now = ctx.clock()
    memory = ctx.model(*key)
    tuner = memory.tuner
    if tuner is None:
        state = TunerState.from_status(previous.speculation, wall_now=ctx.wall_clock(), monotonic_now=now)
        tuner = memory.tuner = ModelTuner(state)
        tuner.next_evaluation_at = now + autotune.interval_seconds
    in_flight = previous.canary if previous.canary and previous.canary.phase in IN_FLIGHT_PHASES else None
    # The canary windows compare against stamps in status: they keep wall-clock time.
    tuner.canary.follow(
        in_flight, ctx.wall_clock(),
        max_gap_s=2 * ctx.settings.reconcile_interval_seconds + ctx.settings.scrape_interval_seconds,
    )
    if in_flight is not None:
        # No K decision while a canary is in flight: its verdict (and a rollback to the K the decision record
        # says it left) must concern one decision only.
        rolling = rolling | {pool.name for pool in previous.pools}
    tuner.rolling = set(rolling)
    contexts = pool_contexts(previous.pools, spec.model.tensor_parallel_size, rolling,
                             previous.speculation.rejected_ks)
    if now >= tuner.next_scrape_at:
        await _observe_round(ctx, session, tuner, observed.namespace, observed.name, observed.uid, previous,
                             contexts, spec.speculation.max_k)
    excluded = tuple(sorted(tuner.state.excluded_pods().items()))
    thresholds = spec.rollout.canary.analysis if spec.rollout.canary else None
    verdicts = step_verdicts(VerdictInputs(
        tuner.canary, previous.canary, thresholds, spec.model.tensor_parallel_size, spec.speculation.initial_k,
        last_decision=previous.speculation.last_decision, stable_serving=_stable_serving(observed, in_flight),
        route_rejection=memory.route_rejection,
    ))
    if not autotune.enabled:
        tuner.next_evaluation_at = math.inf  # nothing to evaluate: the loop must not wake for it
        return TuningOutcome(verdicts=verdicts, excluded_pods=excluded)
    if tuner.next_evaluation_at == math.inf:
        tuner.next_evaluation_at = now + autotune.interval_seconds
    if now < tuner.next_evaluation_at:
        return TuningOutcome(verdicts=verdicts, excluded_pods=excluded)
    tuner.next_evaluation_at = now + autotune.interval_seconds
    report_ = tuner.state.evaluate(now, contexts, spec.speculation)
    publish(observed.namespace, observed.name, report_)
    proposed = report_.decision
    events: list[EventRecord] = []
    decision = None
    if proposed is not None and proposed.to_k != proposed.from_k:
        # The record users (and a restarted operator) read: wall-clock stamp, an id for the audit trail.
        decision = proposed.model_copy(update={"time": ctx.stamp_now(), "id": uuid.uuid4().hex[:12]})
        if canary_mode:
            # Not a change until its canary promotes it (then KChanged); announced as what it is now.
            reason, after = "KProposed", "; it rolls out through a canary"
        else:
            reason, after = ("KChanged" if decision.action == "Change" else "KExplore"), ""
        events.append(EventRecord(
            "Normal", reason,
            f"{decision.pool}: K {decision.from_k} -> {decision.to_k}, predicted gain {decision.predicted_gain:+.1%}, "
            f"confidence {decision.confidence:.0%}: {decision.reason} (decision {decision.id}){after}",
        ))
    status = speculation_status(previous.speculation, report_.stats, decision)
    return TuningOutcome(speculation=status, events=tuple(events), verdicts=verdicts, proposal=decision,
                         proposed_at=now, rolls_out_now=not canary_mode, excluded_pods=excluded)
