"""The tuner's K decision and the canary step's verdict for one pass, decided from the gathered model (pure).

`evaluate` (reconcile/plan.py) calls `decide_tuning` first: a proposed K change is recorded in status on its
own (`proposal_status`, reconcile/status_build.py), before anything renders it; otherwise the verdict and the
live statistics feed the rest of the plan. Nothing here is remembered: the outcome says what the handler commits
to the tuner's memory once status holds it (`TuningOutcome.proposal`, `next_evaluation_at`) and what it publishes
(`report`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import CanaryStatus, SpeculationStatus, SpeculativeModelStatus, TuningDecision
from specdec_operator.canary.analysis import Verdict
from specdec_operator.canary.plan import IN_FLIGHT_PHASES
from specdec_operator.canary.traffic import expected_canary_share
from specdec_operator.canary.verdict import VerdictInputs, step_verdicts
from specdec_operator.reconcile.observed import EventRecord, ObservedModel, TuningInputs
from specdec_operator.reconcile.route_status import gathered_rejection
from specdec_operator.reconcile.tuning_inputs import pool_contexts, pool_ready_seconds, speculation_status
from specdec_operator.render.names import deployment_name, service_name
from specdec_operator.tuner.engine import TunerReport


@dataclass(frozen=True)
class TuningOutcome:
    speculation: SpeculationStatus | None = None
    events: tuple[EventRecord, ...] = ()
    verdicts: dict[str, Verdict | None] = field(default_factory=dict)
    # A K change the tuner proposes: it is written to status first, then committed to the tuner's memory.
    proposal: TuningDecision | None = None
    proposed_at: float = 0.0  # monotonic time of the proposal, the cooldown's start once committed
    # With strategy Canary a recorded decision is not a K change yet: the canary's promotion makes it one
    # (reconcile/rollout.py posts KChanged then, handlers/reconciler.py counts it).
    rolls_out_now: bool = True
    # What the tuner's evaluation reported this pass (exported on /metrics by the handler), if it ran.
    report: TunerReport | None = None
    # When the tuner evaluates next (monotonic; math.inf while autotune is off); None: unchanged.
    next_evaluation_at: float | None = None
    # (reason, message) of a Gateway that refuses the model's HTTPRoute as gathered this pass (what the step's
    # verdict held on): the handler remembers it for a pass that cannot read the route.
    route_rejection: tuple[str, str] | None = None
    # The K change a change freeze held back this pass (reconcile/freeze.py): not recorded, so the tuner proposes
    # it again at its next evaluation; Progressing names it meanwhile.
    k_waiting: str | None = None


def stable_serving(observed: ObservedModel, canary: CanaryStatus | None) -> bool:
    """Whether the canary pool's stable Deployment keeps a replica: a one-replica pool canaried in place has
    none, so its steps have no baseline (canary/analysis.py)."""
    if canary is None:
        return True
    stable = observed.children.get(("Deployment", deployment_name(canary.pool, "stable")))
    if stable is None:
        return True
    return int((stable.get("spec") or {}).get("replicas", 0) or 0) > 0


def canary_step_verdicts(
    observed: ObservedModel, inputs: TuningInputs, spec: SpeculativeModelSpec, previous: SpeculativeModelStatus,
    rejection: tuple[str, str] | None = None,
) -> dict[str, Verdict | None]:
    """The verdict on the canary step in flight, from the windows this pass's scrape round fed; `rejection`: a
    Gateway's refusal of the route as gathered this pass (the step holds)."""
    in_flight = previous.canary if previous.canary and previous.canary.phase in IN_FLIGHT_PHASES else None
    routed = spec.rollout.canary is not None and spec.rollout.canary.traffic.http_route_ref is not None
    canary_gfx = next((pool.gfx_target for pool in previous.pools
                       if previous.canary is not None and pool.name == previous.canary.pool), None)
    tensor_parallel = spec.tensor_parallel_of(canary_gfx) if canary_gfx else spec.model.tensor_parallel_size
    return step_verdicts(VerdictInputs(
        inputs.windows, previous.canary, spec.rollout.canary.analysis if spec.rollout.canary else None,
        tensor_parallel, spec.speculation.initial_k,
        last_decision=previous.speculation.last_decision, stable_serving=stable_serving(observed, in_flight),
        expected_share=_expected_share(observed) if routed else None, route_rejection=rejection,
    ))


def _expected_share(observed: ObservedModel) -> float | None:
    """The canary's share of requests the route as read this pass promises (canary/traffic.py); None when the
    route was not read this pass."""
    if not observed.route_read or observed.route is None:
        return None
    return expected_canary_share(dict(observed.route), observed.namespace, service_name(observed.name, "stable"),
                                 service_name(observed.name, "canary"))


def _due_at(inputs: TuningInputs, interval_s: float) -> float:
    """The evaluation's due time: autotune just switched on starts a fresh interval."""
    return inputs.now + interval_s if inputs.next_evaluation_at == math.inf else inputs.next_evaluation_at


def decide_tuning(
    observed: ObservedModel, spec: SpeculativeModelSpec, previous: SpeculativeModelStatus, stamp: str,
    frozen: str | None = None,
) -> TuningOutcome:
    """The canary's verdict, and when the tuner's evaluation is due its statistics and at most one proposed K
    change, stamped `stamp` (the pass's wall-clock time) with the gathered audit id. Under a change freeze
    (`frozen`: its source) the K change is not proposed but named as waiting."""
    inputs = observed.tuning
    if inputs is None:
        return TuningOutcome()
    rejection = gathered_rejection(inputs.route_rejection, observed.route, observed.route_read, observed.route_error)
    verdicts = canary_step_verdicts(observed, inputs, spec, previous, rejection)
    autotune = spec.speculation.autotune
    if not autotune.enabled:  # the loop must not wake for it
        return TuningOutcome(verdicts=verdicts, next_evaluation_at=math.inf, route_rejection=rejection)
    due_at = _due_at(inputs, autotune.interval_seconds)
    if inputs.now < due_at:
        # Under a freeze the change the last evaluation proposed still waits: Progressing keeps saying so.
        return TuningOutcome(verdicts=verdicts, next_evaluation_at=due_at, route_rejection=rejection,
                             k_waiting=_waiting(inputs.state.proposed) if frozen is not None else None)
    contexts = pool_contexts(previous.pools, spec.tensor_parallel, set(inputs.rolling),
                             previous.speculation.rejected_ks, ready_s=pool_ready_seconds(observed.pods),
                             max_unavailable=spec.rollout.max_unavailable)
    report = inputs.state.evaluate(inputs.now, contexts, spec.speculation)
    canary_mode = spec.rollout.strategy == "Canary"
    decision, events = _proposal(report.decision, stamp, inputs.decision_id, canary_mode)
    waiting = None
    if frozen is not None and decision is not None:
        waiting, decision, events = _waiting(decision), None, ()
    return TuningOutcome(
        speculation=speculation_status(previous.speculation, report.stats, decision), events=events,
        verdicts=verdicts, proposal=decision, proposed_at=inputs.now, rolls_out_now=not canary_mode,
        report=report, next_evaluation_at=inputs.now + autotune.interval_seconds, route_rejection=rejection,
        k_waiting=waiting,
    )


def _waiting(decision: TuningDecision | None) -> str | None:
    """How Progressing names a K change a freeze holds back."""
    if decision is None or decision.to_k == decision.from_k:
        return None
    return (f"a K change of pool {decision.pool} {decision.from_k} -> {decision.to_k} (predicted "
            f"{decision.predicted_gain:+.1%}) waits")


def _proposal(
    proposed: TuningDecision | None, stamp: str, decision_id: str, canary_mode: bool
) -> tuple[TuningDecision | None, tuple[EventRecord, ...]]:
    """A K change worth recording, with its audit record (wall-clock stamp, id) and the event announcing it."""
    if proposed is None or proposed.to_k == proposed.from_k:
        return None, ()
    decision = proposed.model_copy(update={"time": stamp, "id": decision_id})
    if canary_mode:
        # Not a change until its canary promotes it (then KChanged); announced as what it is now.
        reason, after = "KProposed", "; it rolls out through a canary"
    else:
        reason, after = ("KChanged" if decision.action == "Change" else "KExplore"), ""
    return decision, (EventRecord(
        "Normal", reason,
        f"{decision.pool}: K {decision.from_k} -> {decision.to_k}, predicted gain {decision.predicted_gain:+.1%}, "
        f"confidence {decision.confidence:.0%}: {decision.reason} (decision {decision.id}){after}",
    ),)


def recorded_decision_id(status: Mapping[str, Any]) -> str | None:
    """The id of the decision a stored status records, if any."""
    recorded = (status.get("speculation") or {}).get("lastDecision") or {}
    decision_id = recorded.get("id")
    return str(decision_id) if decision_id else None
