"""One reconcile, evaluated: observed model in; objects to write, objects to delete, status and events out."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from specdec_operator.api.spec import ObjectRef, SpeculativeModelSpec
from specdec_operator.api.status import (
    CanaryStatus,
    PoolRollout,
    PoolStatus,
    SpeculationStatus,
    SpeculativeModelStatus,
)
from specdec_operator.canary.analysis import Verdict
from specdec_operator.canary.progress import ManualAction, manual_action
from specdec_operator.canary.traffic import RouteError, canary_percent, reaches_canary, route_weights
from specdec_operator.conditions import ConditionFacts, Finding, pod_metrics_finding
from specdec_operator.decisions.absence import AbsenceDecision, HeldPool, held_message, hold_missing_pools
from specdec_operator.decisions.capacity import GpuUsage
from specdec_operator.decisions.placement import PlacementPlan, plan_placement
from specdec_operator.decisions.pod_failures import failure_summaries, pod_failures
from specdec_operator.decisions.runtime_env import RuntimeEnvError
from specdec_operator.reconcile.capacity import (
    capacity_findings,
    model_usage,
    modes_for_rollout,
    rollout_mode_events,
    rollout_modes,
)
from specdec_operator.reconcile.desired import DesiredPool, desired_pools, model_service
from specdec_operator.reconcile.events import pool_events
from specdec_operator.reconcile.freeze import freeze_source, frozen_finding, hold_source
from specdec_operator.reconcile.observed import EvaluationSettings, EventRecord, ObservedModel
from specdec_operator.reconcile.rollout import RolloutInputs, RolloutResult, plan_rollout
from specdec_operator.reconcile.rollout_limit import rolls_out
from specdec_operator.reconcile.route_status import RouteStep, route_step, route_verdict
from specdec_operator.reconcile.status_build import (
    StatusDecision,
    canary_facts,
    decided_status,
    placement_facts,
    pool_status,
)
from specdec_operator.reconcile.tuning_policy import TuningOutcome, decide_tuning
from specdec_operator.reconcile.weights_cache import weights_cache_finding
from specdec_operator.render.drift import covers
from specdec_operator.render.names import TRACKS, service_name
from specdec_operator.render.pool import deployment_revision
from specdec_operator.render.service import service
from specdec_operator.timestamps import parse_stamp
from specdec_runtime import contract

# Old content-addressed ConfigMaps kept per pool so a rollback or a restarting old pod still finds its config.
KEPT_OLD_CONFIG_MAPS = 2


@dataclass(frozen=True)
class ReconcilePlan:
    apply: list[dict[str, Any]] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)
    status: SpeculativeModelStatus | None = None
    events: list[EventRecord] = field(default_factory=list)
    invalid_spec: str | None = None
    pools: list[DesiredPool] = field(default_factory=list)
    route: ObjectRef | None = None  # HTTPRoute whose backend weights we own
    route_weight: int | None = None  # canary percent to set on it
    # What that percent asks of the route as read this pass (reconcile/route_status.py): the route to apply, or
    # the problem to post. Set whenever route_weight is: a route that could not be read holds the whole pass.
    route_step: RouteStep | None = None
    clear_action: bool = False  # remove the one-shot specdec.io/canary-action annotation
    # Fields of the stored status that did not parse: only conditions may be written while this is set.
    status_unreadable: tuple[str, ...] = ()
    # What the conditions were computed from, so a later fact (a refused write) re-runs the one policy.
    conditions: ConditionFacts | None = None
    # Why nothing at all may be decided or written this pass (inputs not known yet); the loop retries soon.
    held: str | None = None
    # The tuner's and the canary's decision this pass (reconcile/tuning_policy.py): what the handler commits
    # to memory once status holds it. With a proposal the plan records that decision alone.
    tuning: TuningOutcome = field(default_factory=TuningOutcome)
    # What `status` is to say, as the policies decided it: `evaluate` builds `status` from it once, at its end
    # (None: nothing is written this pass).
    decided: StatusDecision | None = None
    # Whether the model has a rollout in flight once this plan is applied (reconcile/rollout_limit.py), for the
    # fleet's limit; None when the pass did not get as far as planning Deployments (nothing changes then).
    rolls_out: bool | None = None
    queued: bool = False  # the fleet's rollout limit holds this model's next rollout


def validation_message(error: ValidationError) -> str:
    """First error as `spec.<path>: <message>`; pydantic's own text for model-level rules already names it."""
    first = error.errors()[0]
    path = ".".join(str(part) for part in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    return message if message.startswith("spec.") else f"spec.{path}: {message}"


@dataclass(frozen=True)
class StatusRead:
    """The stored status, parsed field by field: what parsed, and what did not (`status.<path>: why`)."""

    status: SpeculativeModelStatus
    problems: tuple[str, ...] = ()


def read_status(raw: Mapping[str, Any]) -> StatusRead:
    """Parse each top-level status field on its own so one bad field never discards the rest.

    Status holds decisions (each pool's K, the canary step and its clock, the tuner's cooldown): rebuilding
    it from scratch would send every pool back to initialK and restart the fleet, so an unreadable field is
    reported, never silently replaced.
    """
    kept: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in dict(raw).items():
        try:
            SpeculativeModelStatus.model_validate({key: value})
        except ValidationError as error:
            for detail in error.errors():
                path = ".".join(str(part) for part in ("status", *detail["loc"]))
                problems.append(f"{path}: {str(detail['msg']).removeprefix('Value error, ')}")
            continue
        kept[key] = value
    return StatusRead(SpeculativeModelStatus.model_validate(kept), tuple(problems))


def parse_previous_status(raw: Mapping[str, Any]) -> SpeculativeModelStatus:
    """The readable part of the stored status (see `read_status` for what was not readable)."""
    return read_status(raw).status


def _unreadable(read: StatusRead) -> ReconcilePlan:
    """Hold everything: no K changes, no owned object rewritten, until a human repairs (or removes) the field.

    Only the conditions are written: Degraded names the field, and Ready says the model is held.
    """
    message = "status cannot be read, holding every pool and Deployment until it is repaired: " + "; ".join(
        read.problems)
    decided = StatusDecision(read.status, ConditionFacts(status_unreadable=message), conditions_only=True)
    return ReconcilePlan(
        decided=decided, events=[EventRecord("Warning", "StatusUnreadable", message)], status_unreadable=read.problems,
    )


def _invalid(previous: SpeculativeModelStatus, message: str) -> ReconcilePlan:
    """An invalid spec renders nothing: the pools the status records stay, and the conditions say why."""
    return ReconcilePlan(decided=StatusDecision(previous, ConditionFacts(invalid_spec=message)),
                         events=[EventRecord("Warning", "InvalidSpec", message)], invalid_spec=message)


def _pool_of(body: Mapping[str, Any]) -> str:
    return str(body["metadata"].get("labels", {}).get(contract.LABEL_POOL, ""))


def _stale_children(
    observed: ObservedModel, wanted: set[tuple[str, str]], pools: list[DesiredPool], held: Collection[str] = ()
) -> list[tuple[str, str]]:
    """Owned objects no pool wants; a pool held through missing nodes (`held`) keeps every object it has."""
    stale: list[tuple[str, str]] = []
    pool_names = {p.name for p in pools}
    for kind in ("Deployment", "PodDisruptionBudget", "Service"):
        stale += [(kind, body["metadata"]["name"]) for body in observed.children_of_kind(kind)
                  if (kind, body["metadata"]["name"]) not in wanted and _pool_of(body) not in held]
    by_pool: dict[str, list[Mapping[str, Any]]] = {}
    for body in observed.children_of_kind("ConfigMap"):
        if ("ConfigMap", body["metadata"]["name"]) in wanted or _pool_of(body) in held:
            continue
        by_pool.setdefault(body["metadata"].get("labels", {}).get(contract.LABEL_POOL, ""), []).append(body)
    for pool, bodies in by_pool.items():
        newest_first = sorted(bodies, key=lambda b: b["metadata"].get("creationTimestamp", ""), reverse=True)
        keep = KEPT_OLD_CONFIG_MAPS if pool in pool_names else 0
        stale += [("ConfigMap", body["metadata"]["name"]) for body in newest_first[keep:]]
    return stale


@dataclass(frozen=True)
class ParsedModel:
    """An observed model with its spec and stored status each parsed once per pass: the evaluation, and anything
    else in the pass that needs them (the tuner's inputs), read these, never the raw body again."""

    observed: ObservedModel
    status: StatusRead
    spec: SpeculativeModelSpec | None  # None: the spec is invalid, `spec_error` says why
    spec_error: str | None = None


def parse_model(observed: ObservedModel) -> ParsedModel:
    status = read_status(observed.status)
    try:
        return ParsedModel(observed, status, SpeculativeModelSpec.model_validate(dict(observed.spec)))
    except ValidationError as error:
        return ParsedModel(observed, status, None, validation_message(error))


@dataclass(frozen=True)
class PassInputs:
    """One pass's inputs, parsed: what every policy of `evaluate` reads."""

    observed: ObservedModel
    settings: EvaluationSettings
    now: str
    spec: SpeculativeModelSpec
    previous: SpeculativeModelStatus
    speculation: SpeculationStatus | None = None  # the tuner's record this pass, when it has one
    verdicts: Mapping[str, Verdict | None] = field(default_factory=dict)
    refusals: tuple[str, ...] = ()
    not_owned: tuple[str, ...] = ()
    k_waiting: str | None = None  # the K change a freeze holds back this pass (TuningOutcome.k_waiting)

    @cached_property
    def moment(self) -> datetime:
        return parse_stamp(self.now)

    @cached_property
    def frozen(self) -> str | None:
        """What holds the model's rollouts and K changes: a change freeze (reconcile/freeze.py), or the fleet's
        rollout limit while it has no slot (reconcile/rollout_limit.py); None when nothing does."""
        return hold_source(self.spec, self.settings.freeze_rollouts, self.observed.rollouts_in_flight)

    @cached_property
    def queued(self) -> bool:
        """The hold is the fleet's rollout limit, not a freeze."""
        return self.frozen is not None and freeze_source(self.spec, self.settings.freeze_rollouts) is None

    @cached_property
    def route(self) -> ObjectRef | None:
        """The HTTPRoute whose backend weights we own, if the spec names one."""
        return self.spec.rollout.canary.traffic.http_route_ref if self.spec.rollout.canary else None

    @cached_property
    def live_deployments(self) -> dict[str, Mapping[str, Any]]:
        return {body["metadata"]["name"]: body for body in self.observed.children_of_kind("Deployment")}


def evaluate(
    model: ObservedModel | ParsedModel,
    settings: EvaluationSettings,
    now: str,
    verdicts: Mapping[str, Verdict | None] | None = None,
) -> ReconcilePlan:
    """Render from status: each pool's K is `status.pools[].effectiveK` (the tuner writes its decisions there
    first). `model`: the observed model, parsed by the pass already (`parse_model`) or parsed here. Its
    `refusals` are the API server's messages for owned objects it refused on earlier attempts; its `not_owned`
    names objects under our names that someone else holds (left alone, handlers/writes.py). `verdicts` stand in
    for the canary analysis when the model carries no tuning inputs (a test's model).

    The policies decide (`decide`); the status is then built once, here, from what they decided, whatever kind
    of plan they made (`settle`)."""
    parsed = model if isinstance(model, ParsedModel) else parse_model(model)
    plan = decide(parsed, settings, now, verdicts)
    return settle(parsed.observed, plan, now, settings.shard)


def decide(
    parsed: ParsedModel,
    settings: EvaluationSettings,
    now: str,
    verdicts: Mapping[str, Verdict | None] | None = None,
) -> ReconcilePlan:
    """A chain of policies, each a function of its inputs and of what the ones before it decided. The tuner's K
    decision and the canary's verdict come first: a proposed K is recorded alone, before anything renders it.
    Every exit returns what status is to say (`ReconcilePlan.decided`), never a built status."""
    observed = parsed.observed
    gate = gate_inputs(parsed)
    if isinstance(gate, ReconcilePlan):
        return gate
    spec, previous = gate
    tuning = decide_tuning(observed, spec, previous, now,
                           frozen=hold_source(spec, settings.freeze_rollouts, observed.rollouts_in_flight))
    if tuning.proposal is not None:
        return decision_plan(previous, tuning)
    inputs = PassInputs(observed, settings, now, spec, previous, tuning.speculation,
                        tuning.verdicts or verdicts or {}, observed.refusals, observed.not_owned, tuning.k_waiting)
    if (held := hold_without_nodes(inputs)) is not None:
        return replace(held, tuning=tuning)
    placed = place_pools(inputs)
    try:
        rolled = roll_out(inputs, placed)
    except RuntimeEnvError as error:
        return replace(_invalid(previous, str(error)), tuning=tuning)
    owned = desired_objects(inputs, placed, rolled)
    route = judge_route(inputs)
    pools = pool_statuses(inputs, placed, rolled)
    facts = condition_facts(inputs, placed, rolled, owned, route, pools)
    decided = StatusDecision(previous, facts, pools, rolled.speculation, rolled.rollout.canary)
    events = plan_events(inputs, placed, rolled, pools, facts)
    if route.unreadable:
        # Unread is not absent: which canary the route still sends requests to is unknown, so no owned object is
        # written or deleted this pass; the condition says why (the loop retries at its own pace). The status is
        # still written, a canary's step or promotion with it, so the events that announce them go with it: the
        # next pass starts from that status and would never post them.
        unread = [EventRecord("Warning", route.finding.reason, route.finding.message)] if route.finding else []
        return ReconcilePlan(decided=decided, conditions=facts, pools=rolled.pools, tuning=tuning,
                             events=[*unread, *events])
    weight = rolled.rollout.route_weight if inputs.route is not None else None
    return ReconcilePlan(
        apply=owned.to_apply, delete=stale_objects(inputs, placed, rolled, owned), decided=decided, conditions=facts,
        events=events, pools=rolled.pools, route=inputs.route,
        route_weight=weight, route_step=plan_route_step(observed, inputs.route, weight),
        clear_action=rolled.rollout.clear_action or bool(rolled.action_events), tuning=tuning,
        rolls_out=rolls_out(inputs.live_deployments, rolled.rollout.deployments, rolled.rollout.canary),
        queued=_waits_for_slot(inputs, rolled.rollout),
    )


def _waits_for_slot(inputs: PassInputs, rollout: RolloutResult) -> bool:
    """The fleet's rollout limit holds something of this model: a pool's rollout or a K change."""
    return inputs.queued and (bool(rollout.frozen) or inputs.k_waiting is not None)


def _hold_finding(inputs: PassInputs, rollout: RolloutResult) -> Finding | None:
    """Progressing's words for what holds rollouts: a freeze always says so; the rollout limit only while it holds
    something (a model with nothing to roll out is not waiting)."""
    if inputs.queued and not _waits_for_slot(inputs, rollout):
        return None
    return frozen_finding(inputs.frozen, rollout.frozen, inputs.k_waiting, queued=inputs.queued)


def plan_route_step(observed: ObservedModel, route: ObjectRef | None, weight: int | None) -> RouteStep | None:
    """The change `weight` asks of the HTTPRoute as gathered this pass; None when the pass routes nothing."""
    if route is None or weight is None or not observed.route_read:
        return None
    where = f"{route.namespace or observed.namespace}/{route.name}"
    return route_step(observed.route, observed.name, observed.namespace, where, weight)


def settle(observed: ObservedModel, plan: ReconcilePlan, now: str, shard: str = "") -> ReconcilePlan:
    """The plan with the status its policies decided: the one place a pass's status (and its conditions) is
    built, for every kind of plan. A plan that decided nothing (inputs not known yet) writes no status. In a
    sharded fleet every status names the install that wrote it (`shard`)."""
    if plan.decided is None:
        return plan
    status = decided_status(observed, plan.decided, now)
    if shard:
        status.shard = shard
    return replace(plan, status=status)


def decision_plan(previous: SpeculativeModelStatus, tuning: TuningOutcome) -> ReconcilePlan:
    """A pass that proposes a K change records it, and nothing else: the next pass renders from it."""
    decided = StatusDecision(previous, speculation=tuning.speculation, proposal=tuning.proposal)
    return ReconcilePlan(decided=decided, events=list(tuning.events), tuning=tuning)


def gate_inputs(parsed: ParsedModel) -> ReconcilePlan | tuple[SpeculativeModelSpec, SpeculativeModelStatus]:
    """The parsed spec and status, or the plan that holds (inputs unknown) or reports why they cannot be used."""
    observed, read = parsed.observed, parsed
    if not observed.children_known:
        # Not listed is not absent: a pass that took a lagging cache for the cluster would recreate what runs
        # (a stable Deployment at the canary's revision) and delete what it has not seen change.
        return ReconcilePlan(held="owned objects and pods not in the watch cache yet")
    if read.status.problems:
        return _unreadable(read.status)
    if read.spec is None:
        return _invalid(read.status.status, read.spec_error or "spec: invalid")
    return read.spec, read.status.status


def hold_without_nodes(inputs: PassInputs) -> ReconcilePlan | None:
    """No node at all, not even a CPU node, is a watch that has not synced, not a fleet that vanished: hold.
    (GPU nodes that go while others stay are the grace's to handle: decisions/absence.py.)"""
    if inputs.observed.nodes or not inputs.previous.pools:
        return None
    message = "node inventory is empty; keeping existing pools until nodes are observed again"
    previous = inputs.previous
    return ReconcilePlan(decided=StatusDecision(previous, ConditionFacts(inventory_empty=message), previous.pools))


@dataclass(frozen=True)
class PlacedPools:
    usage: GpuUsage
    placement: PlacementPlan  # after the absence grace: pools held through missing nodes keep their placement
    absence: AbsenceDecision
    # Pools with no placement left, kept whole (status entry and every live object) until their grace ends.
    held_whole: list[PoolStatus]


def place_pools(inputs: PassInputs) -> PlacedPools:
    """Where the model's pools go, with pools whose nodes went missing held through their grace."""
    observed, settings, previous = inputs.observed, inputs.settings, inputs.previous
    usage = model_usage(observed)
    placement = plan_placement(
        inputs.spec, observed.nodes, settings.kv_headroom_fraction,
        existing_pools={p.gfx_target for p in previous.pools}, usage=usage, devices=settings.devices,
    )
    absence = hold_missing_pools(previous.pools, placement, inputs.spec, observed.nodes, inputs.moment,
                                 settings.node_missing_grace_s)
    held_whole = [p.model_copy(update={"missing": held.missing}) for p in previous.pools
                  if (held := absence.held_for(p.gfx_target)) is not None and held.whole]
    return PlacedPools(usage, absence.placement, absence, held_whole)


@dataclass(frozen=True)
class RolledOut:
    pools: list[DesiredPool]  # rendered at the K status records (or the stable K a failed tuner canary left)
    rollout: RolloutResult
    modes: dict[str, PoolRollout]  # each pool's rollout mode, as status records it
    speculation: SpeculationStatus | None  # with a failed tuner K recorded as rejected
    action_events: list[EventRecord]  # an unreadable canary-action annotation


def roll_out(inputs: PassInputs, placed: PlacedPools) -> RolledOut:
    """The pools rendered from status, and how their Deployments move: directly or through a canary.

    Raises RuntimeEnvError when the spec's environment cannot be made consistent."""
    observed, spec, previous = inputs.observed, inputs.spec, inputs.previous
    previous_k = {p.name: p.effective_k for p in previous.pools}
    pools = desired_pools(observed, spec, placed.placement, previous_k, inputs.settings)
    action, action_events = _manual_action(observed)
    modes: dict[str, PoolRollout] = {}

    def roll(current_pools: list[DesiredPool], canary: CanaryStatus | None) -> RolloutResult:
        modes.update(rollout_modes(spec, current_pools, observed, placed.usage, previous))
        return plan_rollout(RolloutInputs(
            current_pools, inputs.live_deployments, canary, spec.rollout, inputs.moment,
            routed=inputs.route is not None, verdicts=inputs.verdicts, action=action, modes=modes_for_rollout(modes),
            last_decision=previous.speculation.last_decision, route_percent=_route_percent(observed, inputs.route),
            frozen=inputs.frozen))

    rollout = roll(pools, previous.canary)
    speculation = inputs.speculation
    if rollout.rejected is not None:
        # Written with the rollback itself, so the tuner reads it before its next decision (docs/canary.md).
        recorded = speculation or previous.speculation
        speculation = recorded.model_copy(update={"rejected_ks": [*recorded.rejected_ks, rollout.rejected][-8:]})
    if rollout.k_reverts:
        # The K before the decision (from the decision record) makes the stable revision the desired one again
        # only if K was all the canary changed; a spec change rolled back keeps the K in status.
        reverted = desired_pools(observed, spec, placed.placement, {**previous_k, **rollout.k_reverts},
                                 inputs.settings)
        stable = rollout.canary.stable_revision if rollout.canary is not None else None
        if any(p.name in rollout.k_reverts and p.revision == stable for p in reverted):
            pools = reverted
            # Planned again from the canary as this pass ended it: recorded once, RolledBack with its verdict.
            first = rollout
            rollout = roll(pools, first.canary)
            rollout.events[:0] = first.events
    return RolledOut(pools, rollout, modes, speculation, action_events)


@dataclass(frozen=True)
class DesiredObjects:
    to_apply: list[dict[str, Any]]  # desired objects the live ones do not cover yet
    wanted: set[tuple[str, str]]  # (kind, name) of every object a pool wants, written or kept
    stable_revisions: dict[str, str]  # pool -> the revision its stable Deployment is to serve


def desired_objects(inputs: PassInputs, placed: PlacedPools, rolled: RolledOut) -> DesiredObjects:
    """Every owned object the pools want, and which of them differ from what runs."""
    observed, rollout = inputs.observed, rolled.rollout
    desired: list[dict[str, Any]] = []
    if rolled.pools or placed.held_whole:
        desired.append(model_service(observed))
        if inputs.route is not None:
            desired += [service(observed.namespace, observed.name, observed.uid, track) for track in TRACKS]
    for pool in rolled.pools:
        desired += [pool.config_map, pool.pdb]
    desired += rollout.deployments
    to_apply = [
        obj for obj in desired
        if not covers(observed.children.get((obj["kind"], obj["metadata"]["name"])), obj)
    ]
    wanted = {(obj["kind"], obj["metadata"]["name"]) for obj in [*desired, *rollout.kept]}
    stable_revisions = {
        obj["metadata"]["labels"][contract.LABEL_POOL]: obj["spec"]["template"]["metadata"]["labels"][
            contract.LABEL_REVISION]
        for obj in rollout.deployments if obj["metadata"]["labels"].get(contract.LABEL_TRACK) == "stable"
    }
    if rollout.canary is not None:
        stable_revisions.update({name: rollout.canary.stable_revision for name in rollout.held})
    stable_revisions.update(rollout.frozen_revisions)  # what a freeze keeps is what the pool serves meanwhile
    return DesiredObjects(to_apply, wanted, stable_revisions)


@dataclass(frozen=True)
class RouteJudgement:
    finding: Finding | None = None
    unreadable: bool = False  # the HTTPRoute could not be read: owned objects wait for it


def judge_route(inputs: PassInputs) -> RouteJudgement:
    """What the HTTPRoute we weight says, as read this pass."""
    observed, route = inputs.observed, inputs.route
    if route is None:
        return RouteJudgement()
    if not observed.route_read and observed.route_error is not None:
        reason = "HTTPRouteNotPermitted" if observed.route_not_permitted else "HTTPRouteUnreadable"
        return RouteJudgement(Finding(reason, f"{observed.route_error}; owned objects wait for it"), unreadable=True)
    if not observed.route_read:
        return RouteJudgement()
    verdict = route_verdict(route.namespace or observed.namespace, route.name, observed.route)
    return RouteJudgement(Finding(*verdict) if verdict is not None else None)


def pool_statuses(inputs: PassInputs, placed: PlacedPools, rolled: RolledOut) -> list[PoolStatus]:
    """Each pool's status entry: placed pools as rendered, then pools held whole through missing nodes. A pool a
    change freeze holds shows the revision it keeps, and no rollout."""
    earlier, frozen = {p.name: p for p in inputs.previous.pools}, rolled.rollout.frozen_revisions
    statuses = [_with_absence(pool_status(pool, inputs.live_deployments.get(pool.name)).model_copy(
        update={"rollout": rolled.modes.get(pool.name)} if pool.name not in frozen else
        {"rollout": None, "revision": frozen[pool.name]}), placed.absence.held_for(pool.plan.gfx),
        earlier.get(pool.name)) for pool in rolled.pools]
    return [*statuses, *placed.held_whole]


def condition_facts(
    inputs: PassInputs,
    placed: PlacedPools,
    rolled: RolledOut,
    owned: DesiredObjects,
    route: RouteJudgement,
    pools: Sequence[PoolStatus],
) -> ConditionFacts:
    """Everything the conditions summarise (conditions.summarize ranks them, in one place)."""
    rollout, absence = rolled.rollout, placed.absence
    facts = placement_facts(placed.placement, rolled.pools, inputs.live_deployments, owned.stable_revisions,
                            placed.held_whole)
    canary_progress, canary_failed = canary_facts(rollout.canary, rolled.pools)
    if canary_progress is not None and rollout.held and rollout.canary is not None:
        canary_progress = Finding(canary_progress.reason, f"{canary_progress.message}; {_held_message(rollout)}")
    failures = pod_failures(inputs.observed.pods, contract.LABEL_POOL)
    # Unschedulable pods are reported as PodsUnschedulable once they waited past a replacement's grace.
    failure_findings = tuple(Finding(reason, message)
                             for reason, message in failure_summaries(failures, skip=("Unschedulable",)))
    return ConditionFacts(
        pod_failures=failure_findings,
        no_pools=facts.no_pools, pending=facts.pending, held_waiting=facts.held_waiting, ready=facts.ready,
        reduced=facts.reduced,
        nodes_missing=tuple(held_message(p.name, held, p.replicas, p.effective_k) for p in pools
                            if (held := absence.held_for(p.gfx_target)) is not None),
        canary_progress=canary_progress, canary_failed=canary_failed,
        capacity=capacity_findings(placed.placement, placed.usage, inputs.moment), refusals=inputs.refusals,
        not_owned=inputs.not_owned, route=route.finding,
        pod_metrics_excluded=pod_metrics_finding(inputs.observed.excluded_pod_metrics),
        frozen=_hold_finding(inputs, rollout),
        weights_cache=weights_cache_finding(inputs.spec, inputs.settings.pod),
    )


def stale_objects(
    inputs: PassInputs, placed: PlacedPools, rolled: RolledOut, owned: DesiredObjects
) -> list[tuple[str, str]]:
    """Owned objects to delete: neither wanted, nor mounted by a kept Deployment, nor a canary the route may
    still send requests to, nor an object of a pool held whole."""
    rollout = rolled.rollout
    keep = owned.wanted | _referenced_config_maps([*rollout.deployments, *rollout.kept]) | _draining_canaries(
        inputs.observed, inputs.route)
    return _stale_children(inputs.observed, keep, rolled.pools, {p.name for p in placed.held_whole})


def plan_events(
    inputs: PassInputs,
    placed: PlacedPools,
    rolled: RolledOut,
    pools: Sequence[PoolStatus],
    facts: ConditionFacts,
) -> list[EventRecord]:
    """The pass's events: pool changes, missing nodes, new failures, rollout modes, the canary's steps."""
    previous, live = inputs.previous, inputs.live_deployments
    live_revisions = {p.name: deployment_revision(live.get(p.name)) for p in rolled.pools}
    modes = {pool: mode for pool, mode in rolled.modes.items() if pool not in rolled.rollout.frozen_revisions}
    return [
        *pool_events(previous, pools, placed.placement), *_absence_events(placed.absence, pools),
        *_failure_events(previous, facts.pod_failures, facts.capacity),
        *rollout_mode_events(modes, previous, live_revisions), *rolled.rollout.events, *rolled.action_events,
    ]


def _held_message(rollout: RolloutResult) -> str:
    assert rollout.canary is not None
    return (f"stable Deployment of {', '.join(rollout.held)} not observed: its revision "
            f"{rollout.canary.stable_revision} cannot be rendered from the spec, so the pool is held as it is until "
            f"the Deployment is seen (or the spec asks for {rollout.canary.stable_revision} again)")


def _route_percent(observed: ObservedModel, route: ObjectRef | None) -> int | None:
    """The canary's share of our route as read this pass; None without a route, unread or unparseable (then the
    step is not held on it: the route's own findings report what is wrong)."""
    if route is None or not observed.route_read or observed.route is None:
        return None
    try:
        weights = route_weights(dict(observed.route), observed.namespace, service_name(observed.name, "stable"),
                                service_name(observed.name, "canary"))
    except RouteError:
        return None
    return canary_percent(weights)


def _draining_canaries(observed: ObservedModel, route: ObjectRef | None) -> set[tuple[str, str]]:
    """Canary Deployments kept although no plan wants them: the HTTPRoute as read this pass may still send them
    requests (a promotion or rollback sets the canary's weight to 0 in this same pass, and a Gateway applies it
    some time after). They go in a later pass, once the route gives them nothing and the Gateway says so."""
    if route is None or not observed.route_read:
        return set()
    stable, canary = service_name(observed.name, "stable"), service_name(observed.name, "canary")
    route_body = dict(observed.route) if observed.route is not None else None
    if not reaches_canary(route_body, observed.namespace, stable, canary):
        return set()
    return {("Deployment", body["metadata"]["name"]) for body in observed.children_of_kind("Deployment")
            if body["metadata"].get("labels", {}).get(contract.LABEL_TRACK) == "canary"}


def _with_absence(status: PoolStatus, held: HeldPool | None, before: PoolStatus | None) -> PoolStatus:
    """A pool held at its replicas keeps the node set it waits for, and the record of what is missing."""
    if held is None:
        return status
    nodes = before.node_names if before is not None and before.node_names else status.node_names
    return status.model_copy(update={"missing": held.missing, "node_names": nodes})


def _absence_events(absence: AbsenceDecision, pools: Sequence[PoolStatus]) -> list[EventRecord]:
    """A Warning when a pool's nodes first go missing, and a note when its grace ran out."""
    events = []
    for pool in pools:
        held = absence.held_for(pool.gfx_target)
        if held is not None and pool.gfx_target in absence.first_seen:
            events.append(EventRecord("Warning", "NodesMissing",
                                      held_message(pool.name, held, pool.replicas, pool.effective_k)))
    events += [EventRecord("Warning", "NodesMissingGraceExpired",
                           f"{gfx}: the pool's nodes stayed missing past the grace period; placement now decides")
               for gfx in absence.expired]
    return events


def _failure_events(
    previous: SpeculativeModelStatus, failures: Sequence[Finding], capacity: Sequence[Finding]
) -> list[EventRecord]:
    """A Warning per failing pod cause (the kubelet's message) or unschedulable pods, when it is new: the
    conditions of the last status did not say it yet."""
    said = " ".join(c.message for c in previous.conditions if c.type in ("Ready", "Degraded"))
    found = [*failures, *(f for f in capacity if f.reason == "PodsUnschedulable")]
    return [EventRecord("Warning", f.reason, f.message) for f in found if f.message not in said]


def _referenced_config_maps(deployments: Sequence[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """ConfigMaps a Deployment we keep still mounts (a stable revision held during a canary)."""
    names = set()
    for deployment in deployments:
        for volume in deployment["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in volume:
                names.add(("ConfigMap", volume["configMap"]["name"]))
    return names


def _manual_action(observed: ObservedModel) -> tuple[ManualAction | None, list[EventRecord]]:
    try:
        return manual_action(observed.annotations), []
    except ValueError as error:
        return None, [EventRecord("Warning", "InvalidCanaryAction", str(error))]
