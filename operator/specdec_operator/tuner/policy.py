"""The K policy: a pure function from per-pool evidence to at most one K change per model.

For every K in [minK, maxK] it predicts the objective from the acceptance estimate (tokens per step)
and the step-time model (seconds per step): tokens/s per pod = B * E(K) / step(B, K), and time per
output token = step(B, K) / E(K). A restart costs minutes of serving, so it acts only with enough
samples, a predicted gain above the threshold, a confidence that the gain is real, and the cooldown
elapsed. When the doubt alone blocks a promising move it explores one K step towards it instead,
which turns the doubt into a measurement. Going back to the K it just left needs twice the gain.

The threshold is minGain plus the restart's own cost (`restart_cost`): K is in the pod template, so a change
restarts every pod of the pool, and an in-place rollout serves without some of them until they are Ready again.
That lost capacity, as a fraction of what the pool serves until its next K change, is added to minGain: a
change must pay for its restart before it pays at all.

A K must serve the load the pool will see while it holds, not only the load of the last interval: each K's tokens/s
is its mean over the levels of the pool's load forecast (`LoadLevel`, tuner/loadforecast.py), so a load that flips
faster than a K change pays back is served by the K that is best over the flips instead of being chased (each chase
restarts the pool's pods). A steady load is one level: the current batch.

A K whose canary was rolled back on the pool's current revision (status.speculation.rejectedKs) is not
proposed again until the evidence says otherwise: the tuner, from acceptance and step times measured since,
predicts for it a gain at least REJECTED_MARGIN above the gain it predicted when the canary failed, with
confidence CONFIDENT. Until then it is neither a target nor an exploration step.

At K=0 (speculation off) no pod drafts, so nothing measures acceptance: only running K=1 can tell whether
speculation pays. A pool that never measured it (a new model started at K=0) explores K=1 once it has minSamples
and the cooldown allows. A pool that came down to K=0 from a K>0 measured speculation not paying; its evidence fades
(tuner/engine.py halves it every few minutes) but the finding stands until something changes that no pod at K=0
can show (the traffic mix, the drafter's weights). It re-probes K=1 by a ski-rental rule (`_reprobe_k1`): once the
probe's restart, spread over the time K=0 has held since the model's last K change, costs at most minGain (the
restart cost every K change is charged, its horizon the whole time held), and never within MIN_HORIZON_S of the
change. Holding K=0 risks, per second, the smallest gain worth a change (minGain) should acceptance have risen;
re-probing once that adds up to the restart's price spends on re-measuring in proportion to the time that passed,
so a pool whose restart is dear re-probes rarely, a cheap one more often, and none stays at K=0 for good. The
moment follows from the restart cost and the time alone, never from when old evidence decays below a numerical
floor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from specdec_operator.api.spec import Speculation
from specdec_operator.api.status import TuningDecision
from specdec_operator.decisions.legal_k import nearest_legal_k, next_legal_k
from specdec_operator.timestamps import format_stamp
from specdec_operator.tuner.costmodel import MIN_RELATIVE_SD, StepPrediction
from specdec_operator.tuner.estimator import AcceptanceEstimate, Interval

# Probability that the gain is positive needed to change K outright; below it the tuner explores.
CONFIDENT = 0.9
# Going back to the K a pool just left needs this multiple of min_gain (hysteresis against flapping).
RETURN_GAIN_FACTOR = 2.0
# A K rolled back by its canary comes back only with a predicted gain this much above the failed prediction.
REJECTED_MARGIN = 0.05
# A pod's start-to-Ready time when none of the pool's pods shows one (pod status startTime and the Ready
# condition's lastTransitionTime): five minutes, a large model loading its weights with no cache. Conservative:
# an observed time replaces it as soon as one pod of the pool is Ready.
DEFAULT_READY_S = 300.0
# How long the K a change sets is expected to hold, over which the restart is spread. The horizon is the time the
# pool's current K has held so far (the time since the model's last K change): a model whose K has held for hours
# is taken to hold the next one for hours, one that changes often to change again soon. One interval is a noisy
# estimate, and right after a change it would say "again as soon as the cooldown allows", which makes correcting a
# misstep dearest exactly when it is needed; so the horizon is at least MIN_HORIZON_S (a quick flip back is still
# charged an hour's share, on top of the doubled minGain) and at most MAX_HORIZON_S. With no K change on record (a
# new model) it is MAX_HORIZON_S: the first correction of the initial K is charged as a change that lasts.
MIN_HORIZON_S = 3600.0
MAX_HORIZON_S = 6 * 3600.0

Action = Literal["Hold", "Change", "Explore"]


@dataclass(frozen=True)
class LoadLevel:
    """A batch size of the pool's load forecast, weighted by the seconds of the next hour expected at it
    (tuner/loadforecast.py), with the predicted step time of every K in range at it."""

    batch: float
    weight: float
    steps: Mapping[int, StepPrediction]


@dataclass(frozen=True)
class PoolEvidence:
    """Everything the policy knows about one pool."""

    pool: str
    current_k: int
    samples_at_k: float  # drafts (or engine steps at K=0) measured since K last changed
    batch: float | None  # running sequences per pod, recent
    acceptance: AcceptanceEstimate
    steps: Mapping[int, StepPrediction]  # predicted step time for every K in range, at `batch`
    previous_k: int | None = None  # the K this pool ran before its last change
    # The current K is an exploration from previous_k: going back is the answer it was made for, not a flip back.
    explored: bool = False
    weight: float = 1.0  # share of the model's GPUs: ties go to the pool that matters more
    rolling: bool = False  # its pods are still being replaced
    # Ks in bounds that vLLM starts this pool's drafter with (decisions.legal_k); None: every K in bounds.
    legal_ks: tuple[int, ...] | None = None
    # Ks rolled back by their canary on this pool's revision -> the gain the tuner predicted for them then.
    rejected: Mapping[int, float] = field(default_factory=dict)
    replicas: int = 1  # the pool's desired replicas
    # Observed seconds from a pod's start to Ready in this pool (the median of its Ready pods); None: none seen.
    ready_s: float | None = None
    # Replicas a rollout of this pool takes out of service at once: maxUnavailable of an in-place rollout, 0 for a
    # surge rollout (new pods start beside the serving ones).
    out_at_once: int = 1
    # The recent load a K must serve, the current batch among it; empty: the current batch alone (`steps`).
    loads: tuple[LoadLevel, ...] = ()
    # Seconds the samples' window has run: since the pool's K last changed, it was resized or its rollout ended.
    window_s: float = 0.0

    def allowed_ks(self, speculation: Speculation) -> tuple[int, ...]:
        if self.legal_ks is not None:
            return tuple(k for k in self.legal_ks if speculation.min_k <= k <= speculation.max_k)
        return tuple(range(speculation.min_k, speculation.max_k + 1))


@dataclass(frozen=True)
class Candidate:
    k: int
    expected_length: Interval
    step: StepPrediction
    tokens_per_s: float  # per pod, over the recent load levels
    tpot_s: float  # at the current batch
    log_sd: float  # sd of log(objective), from acceptance and step-time doubt


@dataclass(frozen=True)
class RestartCost:
    """What a K change of one pool costs, as a fraction of the pool's goodput until its next change.

    An in-place rollout replaces `out` of `replicas` pods at a time, each wave out of service for the observed
    start-to-Ready time: ceil(replicas / out) waves of `ready_s`, with out / replicas of the capacity gone, which
    is about `ready_s` seconds of the whole pool's capacity. Spread over the horizon (how long the new K is
    expected to hold), that is the share of goodput the change gives up; a surge rollout takes none away. The
    same fraction is compared with a throughput gain and with a latency (TPOT) gain.
    """

    fraction: float
    ready_s: float
    ready_observed: bool  # False: DEFAULT_READY_S, no pod of the pool showed its start-to-Ready time
    out: int
    replicas: int
    horizon_s: float
    held_s: float | None  # how long ago the model's K last changed; None: no change on record

    @property
    def lost_s(self) -> float:
        """Pool-seconds of capacity the restart takes out of service (the fraction's numerator)."""
        return self.fraction * self.horizon_s

    def describe(self) -> str:
        ready = f"pods Ready in {self.ready_s:.0f} s" + ("" if self.ready_observed else " (default, none observed)")
        if self.out == 0:
            rollout = "surge rollout, no replica out of service"
        else:
            rollout = f"{self.out} of {self.replicas} replicas at a time"
        since = "no K change on record" if self.held_s is None else f"K last changed {self.held_s / 3600:.1f} h ago"
        return f"restart cost {self.fraction:.1%} ({ready}, {rollout}, over {self.horizon_s / 3600:.1f} h: {since})"


def restart_cost(
    pool: PoolEvidence, speculation: Speculation, now: float, last_change_at: float | None
) -> RestartCost:
    replicas = max(pool.replicas, 1)
    out = min(max(pool.out_at_once, 0), replicas)
    ready_s = pool.ready_s if pool.ready_s is not None and pool.ready_s >= 0 else DEFAULT_READY_S
    # Pool-seconds of capacity out of service: waves x each wave's time x the share of the pool each takes out.
    lost_s = math.ceil(replicas / out) * ready_s * out / replicas if out else 0.0
    held = None if last_change_at is None else max(now - last_change_at, 0.0)
    if held is None:
        horizon = MAX_HORIZON_S
    else:
        horizon = min(max(held, MIN_HORIZON_S, float(speculation.autotune.interval_seconds)), MAX_HORIZON_S)
    return RestartCost(lost_s / horizon, ready_s, pool.ready_s is not None, out, replicas, horizon, held)


@dataclass(frozen=True)
class Assessment:
    pool: str
    candidates: tuple[Candidate, ...]
    recommended_k: int | None
    decision: TuningDecision
    restart_cost: RestartCost | None = None  # what a K change of the pool was charged; None: not weighed


@dataclass(frozen=True)
class PolicyOutcome:
    assessments: tuple[Assessment, ...]
    decision: TuningDecision | None  # the one Change/Explore to carry out, if any


def decide(
    pools: Sequence[PoolEvidence], speculation: Speculation, *, now: float, last_change_at: float | None
) -> PolicyOutcome:
    assessments = [_assess(pool, speculation, now, last_change_at) for pool in pools]
    if any(pool.rolling for pool in pools):
        rolling = ", ".join(pool.pool for pool in pools if pool.rolling)
        assessments = [_demote(a, f"rollout of pool {rolling} still in progress") for a in assessments]
    acting = [a for a in assessments if a.decision.action != "Hold"]
    if not acting:
        return PolicyOutcome(tuple(assessments), None)
    weights = {pool.pool: pool.weight for pool in pools}
    chosen = max(acting, key=lambda a: (a.decision.predicted_gain * weights[a.pool], a.pool))
    final = [a if a is chosen else _demote(a, f"one pool at a time: {chosen.pool} goes first") for a in assessments]
    return PolicyOutcome(tuple(final), chosen.decision)


def _demote(assessment: Assessment, why: str) -> Assessment:
    decision = assessment.decision
    if decision.action == "Hold":
        return assessment
    held = decision.model_copy(
        update={"to_k": decision.from_k, "action": "Hold", "reason": f"{why}; wanted: {decision.reason}"}
    )
    return replace(assessment, decision=held)


@dataclass(frozen=True)
class _Verdicts:
    """Builds one pool's Assessment around a decision, so every exit carries the same evidence."""

    pool: PoolEvidence
    now: float
    candidates: tuple[Candidate, ...] = ()
    recommended: int | None = None
    restart_cost: RestartCost | None = None

    def give(
        self, action: Action, reason: str, to_k: int | None = None, gain: float = 0.0, confidence: float = 0.0
    ) -> Assessment:
        k = self.pool.current_k
        decision = TuningDecision(
            time=format_stamp(self.now),
            pool=self.pool.pool,
            from_k=k,
            to_k=k if action == "Hold" or to_k is None else to_k,
            action=action,
            reason=reason,
            predicted_gain=round(gain, 4),
            confidence=round(confidence, 3),
        )
        return Assessment(self.pool.pool, self.candidates, self.recommended, decision, self.restart_cost)


def _assess(pool: PoolEvidence, speculation: Speculation, now: float, last_change_at: float | None) -> Assessment:
    """One pool's decision: back into the spec's bounds, hold (not ready, cooling down, best already), explore
    K=1 from off (at once when acceptance was never measured, on the restart-cost schedule of `_reprobe_k1` when
    the pool came down to K=0), or move towards the best K."""
    bounded = _into_bounds(pool, speculation, now)
    if bounded is not None:
        return bounded
    autotune = speculation.autotune
    k = pool.current_k
    candidates = _candidates(pool, speculation)
    current = next((c for c in candidates if c.k == k), None)
    blocked = _still_rejected(pool, candidates, current, autotune.objective, autotune.tpot_target_ms)
    candidates = tuple(c for c in candidates if c.k not in blocked)
    best = _best(candidates, autotune.objective, autotune.tpot_target_ms)
    verdicts = _Verdicts(pool, now, candidates, best.k if best else None)
    cooldown_left = 0.0 if last_change_at is None else max(0.0, last_change_at + autotune.cooldown_seconds - now)

    if not autotune.enabled:
        return verdicts.give("Hold", "autotune disabled")
    if pool.batch is None or current is None:
        return verdicts.give("Hold", "no usable metrics yet at the current K")
    if pool.samples_at_k < autotune.min_samples:
        return verdicts.give("Hold", f"{pool.samples_at_k:.0f} of {autotune.min_samples} samples at K={k}")
    # Off after running another K, with the time of that change on record: re-probing K=1 is scheduled by its
    # restart cost (`_reprobe_k1`), not by whether the old evidence has faded yet.
    came_down = k == 0 and speculation.max_k > 0 and last_change_at is not None and _measured_before(pool, speculation)
    if (k == 0 and not came_down and not pool.acceptance.observed_k and not pool.acceptance.measured_lengths
            and speculation.max_k):
        # Speculation is off and acceptance was never measured: only trying K=1 can tell whether it pays.
        reason = f"no acceptance measured at any K; {_describe(current, pool)}"
        if cooldown_left > 0:
            return verdicts.give("Hold", f"cooldown {cooldown_left:.0f}s left: {reason}")
        if 1 in blocked:
            return verdicts.give("Hold", f"K=1 rolled back by canary on this revision: {reason}")
        return verdicts.give("Explore", f"exploring K=1: {reason}", 1)
    cost = restart_cost(pool, speculation, now, last_change_at)
    if best is None or best.k == k:
        listed = ", ".join(map(str, sorted(blocked)))
        rejected = f"; K={listed} rolled back by canary on this revision" if blocked else ""
        hold = f"K={k} is best: {_describe(current, pool)}{rejected}"
        explored = _explore_prior_doubt(replace(verdicts, restart_cost=cost), speculation, current, cooldown_left, hold)
        assessed = explored or verdicts.give("Hold", hold)
    else:
        assessed = _towards_best(replace(verdicts, restart_cost=cost), speculation, current, best, cooldown_left)
    if came_down and assessed.decision.action == "Hold":
        return _reprobe_k1(replace(verdicts, restart_cost=cost), speculation, cooldown_left, blocked,
                           assessed.decision.reason)
    if k > 0 and assessed.decision.action == "Hold" and not _measured_before(pool, speculation):
        return _probe_neighbour(replace(verdicts, restart_cost=cost), speculation, current, best, cooldown_left,
                                blocked, assessed.decision.reason) or assessed
    return assessed


def _probe_neighbour(
    verdicts: _Verdicts,
    speculation: Speculation,
    current: Candidate,
    best: Candidate | None,
    cooldown_left: float,
    blocked: set[int],
    hold: str,
) -> Assessment | None:
    """A pool that has only ever run one K and would hold there: explore the next legal K once, towards the best
    predicted K (the better-predicted neighbour when that is the current one), so that the step model measures what
    a draft costs instead of taking it from the method's prior.

    At one K the step time cannot tell the drafts' cost from the target's (tuner/costmodel.py): the priors split it,
    and a drafter several times dearer than its method's prior (a small target, a gfx target without tuned draft
    kernels) makes a much lower K look no better. Only a second K measures the split, as only K=1 tells a pool that
    never drafted whether drafting pays. The probe costs two restarts (there and, if it measures worse, back; the
    return needs minGain once, not twice); it is made once per pool, when those restarts cost at most minGain over the
    horizon, or over the time held once that is longer. None: no probe, the caller holds."""
    pool, autotune, cost = verdicts.pool, speculation.autotune, verdicts.restart_cost
    assert cost is not None  # _assess weighs it first
    allowed = pool.allowed_ks(speculation)
    neighbours = [next_legal_k(pool.current_k, allowed, upwards=upwards) for upwards in (False, True)]
    by_k = {c.k: c for c in verdicts.candidates}
    options = [by_k[k] for k in neighbours if k is not None and k in by_k and k not in blocked]
    if not options:
        return None
    toward = best.k if best is not None and best.k != pool.current_k else None
    step = (min(options, key=lambda c: abs(c.k - toward)) if toward is not None
            else _best(options, autotune.objective, autotune.tpot_target_ms))
    if step is None:
        return None
    # The two restarts are spread over the horizon a K change is charged over, or over the time the pool has held
    # its K when that is longer: a pool whose restarts are too dear for the horizon probes later, as K=0's re-probe
    # does (`_reprobe_k1`), instead of never.
    budget = max(autotune.min_gain, MIN_RELATIVE_SD)
    price = 2 * cost.lost_s / max(cost.horizon_s, pool.window_s)
    only = f"K={pool.current_k} is the only K measured"
    if price > budget:
        due_in = 2 * cost.lost_s / budget - pool.window_s
        return verdicts.give("Hold", f"{hold}; {only}: probing K={step.k} once its two restarts "
                                     f"({2 * cost.lost_s:.0f} pool-seconds) cost at most minGain {budget:.1%} of the "
                                     f"time held, in {due_in / 3600:.1f} h")
    # A probe holds the pool at the probed K for a cooldown, so it waits one into the window first: time for the
    # load forecast to see the pool's load, and for the mean to find a move of its own.
    wait = max(cooldown_left, autotune.cooldown_seconds - pool.window_s)
    if wait > 0:
        return verdicts.give("Hold", f"{hold}; {only}: probing K={step.k} in {wait:.0f}s")
    gain = _gain(current, step, autotune.objective, autotune.tpot_target_ms)
    reason = (
        f"probing K={step.k}: K={pool.current_k} is the only K this pool has run, so what a draft costs is the "
        f"method's prior, not a measurement; two restarts cost {price:.1%}, within minGain {budget:.1%}; "
        f"{cost.describe()}; {hold}"
    )
    return verdicts.give("Explore", reason, step.k, gain, _confidence(gain, current, step))


def _measured_before(pool: PoolEvidence, speculation: Speculation) -> bool:
    """Whether the pool ran a K other than the one it runs now: a K change of it is on record (previous_k), or it
    runs a K other than the initialK new pools start at (after an operator restart only status is left, and it keeps
    the previous K of the last decision's pool only)."""
    return pool.previous_k is not None or pool.current_k != speculation.initial_k


def _reprobe_k1(
    verdicts: _Verdicts,
    speculation: Speculation,
    cooldown_left: float,
    blocked: set[int],
    hold: str,
) -> Assessment:
    """A pool that came down to K=0 and would hold: re-probe the lowest K above 0 once the probe pays for itself by
    a ski-rental rule, else hold and say when it will.

    Every second the pool holds K=0 it may miss the smallest gain worth a change, minGain, should its acceptance
    have risen since (no pod at K=0 can show it). The probe costs a restart of the pool, `restart_cost(...).lost_s`
    pool-seconds (the numerator of the fraction every K change is charged). So it is due once that restart costs at
    most minGain of the time K=0 has held, held_s, since the model's last K change: lost_s / held_s <= minGain. The
    horizon is the whole time held, not capped at MAX_HORIZON_S as a change's is, so a pool whose restart costs more
    than minGain of six hours re-probes later instead of never; and it is never within MIN_HORIZON_S of the change
    (a surge rollout's restart is free, the time it then serves at K=1 is not). minGain counts at least the step
    model's noise floor (MIN_RELATIVE_SD), so minGain 0 does not keep a pool at K=0 for good either. Deterministic
    from the evidence's restart inputs and the time; the fading acceptance evidence plays no part.
    """
    cost = verdicts.restart_cost
    assert cost is not None and cost.held_s is not None  # _assess weighs it first, for a K change on record
    held_s = cost.held_s
    pool = verdicts.pool
    budget = max(speculation.autotune.min_gain, MIN_RELATIVE_SD)
    due_s = max(cost.lost_s / budget, MIN_HORIZON_S)
    share = cost.lost_s / held_s if held_s > 0 else math.inf
    step_k = next_legal_k(0, pool.allowed_ks(speculation), upwards=True)
    if step_k is None:
        return verdicts.give("Hold", hold)
    since = f"K=0 since {held_s / 3600:.1f} h ago (the model's last K change)"
    price = f"its restart ({cost.lost_s:.0f} pool-seconds)"
    if held_s < due_s:
        floor = f", not within {MIN_HORIZON_S / 3600:.0f} h of the change" if due_s == MIN_HORIZON_S else ""
        schedule = (
            f"{since}; re-probing K={step_k} once its restart costs at most minGain {budget:.1%} over the time held: "
            f"{price} is now {share:.1%} of it; in {(due_s - held_s) / 3600:.1f} h{floor}"
        )
        return verdicts.give("Hold", f"{hold}; {schedule}")
    if cooldown_left > 0:
        return verdicts.give("Hold", f"cooldown {cooldown_left:.0f}s left before re-probing K={step_k}: {hold}")
    if step_k in blocked:
        return verdicts.give("Hold", f"K={step_k} rolled back by canary on this revision, not re-probed: {hold}")
    reason = (
        f"re-probing K={step_k}: {since}, and {price} is {share:.1%} of that, within minGain {budget:.1%}; "
        f"{cost.describe()}; {hold}"
    )
    return verdicts.give("Explore", reason, step_k)


def _into_bounds(pool: PoolEvidence, speculation: Speculation, now: float) -> Assessment | None:
    """A K outside the spec's bounds, or one vLLM does not accept for the drafter, goes to the nearest legal K
    (or holds when there is none); None: the K is legal."""
    k = pool.current_k
    allowed = pool.allowed_ks(speculation)
    if k in allowed:
        return None
    bounds = f"[{speculation.min_k}, {speculation.max_k}]"
    bounded = nearest_legal_k(min(max(k, speculation.min_k), speculation.max_k), allowed)
    if bounded is None:
        return _Verdicts(pool, now).give("Hold", f"no K in spec bounds {bounds} that vLLM accepts for this drafter")
    if speculation.min_k <= k <= speculation.max_k:
        reason = f"K={k} is not a K vLLM accepts for this drafter (legal in {bounds}: {list(allowed)})"
    else:
        reason = f"K={k} is outside spec bounds {bounds}"
    return _Verdicts(pool, now, (), bounded).give("Change", reason, bounded, confidence=1.0)


def _towards_best(
    verdicts: _Verdicts, speculation: Speculation, current: Candidate, best: Candidate, cooldown_left: float
) -> Assessment:
    """A better K than the current one exists: change to it when the gain is large and sure enough, to the
    cautious best (by its lower bound) when that is sure, else explore one legal step towards it, or hold.
    Every move must clear minGain (doubled back to the K just left) plus the restart's cost."""
    autotune, pool, candidates = speculation.autotune, verdicts.pool, verdicts.candidates
    cost = verdicts.restart_cost
    assert cost is not None  # _assess weighs it before any move
    k = pool.current_k
    gain = _gain(current, best, autotune.objective, autotune.tpot_target_ms)
    min_gain = _min_gain_to(best.k, pool, autotune.min_gain)
    threshold = min_gain + cost.fraction
    confidence = _confidence(gain, current, best)
    evidence = (
        f"{_describe(current, pool)} -> {_describe(best, pool)}, predicted {gain:+.1%}, confidence {confidence:.2f}; "
        f"{cost.describe()}"
    )
    if gain < threshold:
        hold = f"gain below {min_gain:.1%} + {cost.fraction:.1%} restart cost: {evidence}"
        if gain >= autotune.min_gain + cost.fraction:
            return verdicts.give("Hold", hold)  # held only as a return to the K just left: hysteresis, not doubt
        return _explore_prior_doubt(verdicts, speculation, current, cooldown_left, hold) or verdicts.give("Hold", hold)
    if cooldown_left > 0:
        return verdicts.give("Hold", f"cooldown {cooldown_left:.0f}s left: {evidence}")
    if confidence >= CONFIDENT:
        return verdicts.give("Change", evidence, best.k, gain, confidence)
    cautious = _cautious_best(candidates, current, autotune.objective, autotune.tpot_target_ms)
    if cautious is not None and cautious.k != k:
        cautious_gain = _gain(current, cautious, autotune.objective, autotune.tpot_target_ms)
        cautious_confidence = _confidence(cautious_gain, current, cautious)
        if cautious_gain >= threshold and cautious_confidence >= CONFIDENT:
            reason = (
                f"K={cautious.k} is best by its lower bound ({_describe(cautious, pool)}, {cautious_gain:+.1%}, "
                f"confidence {cautious_confidence:.2f}); the mean favours: {evidence}"
            )
            return verdicts.give("Change", reason, cautious.k, cautious_gain, cautious_confidence)
    step_k = next_legal_k(k, pool.allowed_ks(speculation), upwards=best.k > k)
    step = next((c for c in candidates if c.k == step_k), None)
    if step is None:
        return verdicts.give("Hold", f"uncertain and no explorable neighbour: {evidence}")
    step_gain = _gain(current, step, autotune.objective, autotune.tpot_target_ms)
    if step_gain <= 0:
        return verdicts.give("Hold", f"uncertain, and one step to K={step_k} is predicted {step_gain:+.1%}: {evidence}")
    reason = f"exploring K={step_k} (confidence {confidence:.2f} < {CONFIDENT}): {evidence}"
    return verdicts.give("Explore", reason, step_k, step_gain, _confidence(step_gain, current, step))


def _min_gain_to(k: int, pool: PoolEvidence, min_gain: float) -> float:
    """The gain a move to K must predict: minGain, doubled for a flip back to the K the pool just left (hysteresis,
    so that noise does not flap it between two Ks), but not for the return from an exploration that measured the
    explored K worse: that return is what the exploration was for, and holding it would keep the worse K."""
    return min_gain * (RETURN_GAIN_FACTOR if k == pool.previous_k and not pool.explored else 1.0)


def _prior_sd(step: StepPrediction) -> float:
    """The part of a step prediction's doubt that comes from the cost priors (costmodel.predict_at: how far it moves
    when each prior ratio is pushed), without the floor every prediction carries: about 0 at a K the data measured."""
    return math.sqrt(max(step.relative_sd**2 - MIN_RELATIVE_SD**2, 0.0))


def _explore_prior_doubt(
    verdicts: _Verdicts, speculation: Speculation, current: Candidate, cooldown_left: float, hold: str
) -> Assessment | None:
    """The mean says hold, but for another K it rests on the cost priors alone (a drafter's cost is known from its
    method only to a factor, tuner/costmodel.py). Exploring one legal step towards that K measures what the priors
    guess; it pays when the K's expected gain beyond the threshold under the priors' doubt (the expected improvement,
    E[max(0, log(1 + gain) - log(1 + threshold))]) exceeds the restart it costs. Without this, a drafter costlier
    than its prior keeps the pool at the first K it ran: the mean, built on the prior, never finds a move worth the
    restart that would measure it. Only the step model's prior doubt counts: once a second K is measured the data
    decides and that doubt is gone, so this does not repeat (acceptance doubt, which decays in minutes, would).
    None: nothing worth exploring, the caller holds."""
    autotune, pool, candidates = speculation.autotune, verdicts.pool, verdicts.candidates
    cost = verdicts.restart_cost
    if cost is None or cooldown_left > 0:
        return None
    k = pool.current_k

    def expected_improvement(candidate: Candidate) -> float:
        gain = _gain(current, candidate, autotune.objective, autotune.tpot_target_ms)
        doubt = math.hypot(_prior_sd(current.step), _prior_sd(candidate.step))
        min_gain = _min_gain_to(candidate.k, pool, autotune.min_gain)
        if gain <= -1 or doubt <= 0 or gain >= min_gain + cost.fraction:
            return 0.0  # a K the mean already favours is _towards_best's to weigh (and hold at a return)
        z = (math.log1p(min_gain + cost.fraction) - math.log1p(gain)) / doubt
        density = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        upper_tail = 0.5 * math.erfc(z / math.sqrt(2))
        return doubt * (density - z * upper_tail)

    target = max((c for c in candidates if c.k != k), key=lambda c: (expected_improvement(c), -abs(c.k - k)),
                 default=None)
    if target is None:
        return None
    worth = expected_improvement(target)
    # The explored K holds only until it is measured: the change that follows (to the target, or back) is a quick
    # one, charged as one at the shortest horizon. Exploring pays for both restarts.
    # A gain below the step model's noise floor cannot be told apart by measuring: no exploration buys less.
    price = max(cost.fraction + cost.lost_s / MIN_HORIZON_S, MIN_RELATIVE_SD)
    if worth <= price:
        return None
    step_k = next_legal_k(k, pool.allowed_ks(speculation), upwards=target.k > k)
    step = next((c for c in candidates if c.k == step_k), None)
    if step is None or step.k == pool.previous_k:
        return None
    step_gain = _gain(current, step, autotune.objective, autotune.tpot_target_ms)
    if step_gain <= 0:
        return None
    reason = (
        f"exploring K={step_k}: K={target.k}'s step time rests on the cost priors alone, and under their doubt it is "
        f"expected to gain {worth:.1%} beyond the threshold, more than its restart and the next cost ({price:.1%}); "
        f"{hold}"
    )
    return verdicts.give("Explore", reason, step_k, step_gain, _confidence(step_gain, current, step))


def _still_rejected(
    pool: PoolEvidence,
    candidates: Sequence[Candidate],
    current: Candidate | None,
    objective: str,
    tpot_target_ms: float | None,
) -> set[int]:
    """Rejected Ks the evidence has not overturned: without a prediction for a K now, or with one that is
    not REJECTED_MARGIN above the failed one at confidence CONFIDENT, the K stays off the table."""
    blocked = set()
    by_k = {c.k: c for c in candidates}
    for k, failed_gain in pool.rejected.items():
        candidate = by_k.get(k)
        if candidate is None or current is None or k == pool.current_k:
            blocked.add(k)
            continue
        gain = _gain(current, candidate, objective, tpot_target_ms)
        if gain < failed_gain + REJECTED_MARGIN or _confidence(gain, current, candidate) < CONFIDENT:
            blocked.add(k)
    return blocked - {pool.current_k}


def _candidates(pool: PoolEvidence, speculation: Speculation) -> tuple[Candidate, ...]:
    if pool.batch is None:
        return ()
    found = []
    for k in pool.allowed_ks(speculation):
        length, step = pool.acceptance.expected_length(k), pool.steps.get(k)
        if length is None or step is None or step.seconds <= 0:
            continue
        tokens_per_s = _tokens_over_loads(pool, k, length.mean)
        if tokens_per_s is None:
            tokens_per_s = pool.batch * length.mean / step.seconds
        log_sd = math.hypot(length.sd / length.mean, step.relative_sd)
        found.append(Candidate(k, length, step, tokens_per_s, step.seconds / length.mean, log_sd))
    return tuple(found)


def _tokens_over_loads(pool: PoolEvidence, k: int, length: float) -> float | None:
    """Tokens/s per pod at K, the weighted mean over the pool's recent load levels; None without levels (or
    without a step time at one of them)."""
    total = weights = 0.0
    for level in pool.loads:
        step = level.steps.get(k)
        if step is None or step.seconds <= 0:
            return None
        total += level.weight * level.batch * length / step.seconds
        weights += level.weight
    return total / weights if weights > 0 else None


def _score(candidate: Candidate, objective: str, tpot_target_ms: float | None) -> tuple[bool, float]:
    """Ordering key: throughput objective ranks by tokens/s; latency ranks targets met first, then tokens/s,
    and among misses the lowest TPOT."""
    if objective == "Latency" and tpot_target_ms is not None:
        if candidate.tpot_s * 1000 <= tpot_target_ms:
            return True, candidate.tokens_per_s
        return False, 1.0 / candidate.tpot_s
    return True, candidate.tokens_per_s


def _best(candidates: Sequence[Candidate], objective: str, tpot_target_ms: float | None) -> Candidate | None:
    # Ties go to the smaller K: fewer wasted draft tokens for the same result.
    return max(candidates, key=lambda c: (_score(c, objective, tpot_target_ms), -c.k), default=None)


def _cautious_best(
    candidates: Sequence[Candidate], current: Candidate, objective: str, tpot_target_ms: float | None
) -> Candidate | None:
    """The K whose pessimistic outcome (the mean gain less 1.28 sd, a 10th percentile) is best."""

    def pessimistic(candidate: Candidate) -> float:
        sd = math.hypot(current.log_sd, candidate.log_sd)
        return math.log1p(_gain(current, candidate, objective, tpot_target_ms)) - 1.2816 * sd

    return max(candidates, key=pessimistic, default=None)


def _gain(current: Candidate, other: Candidate, objective: str, tpot_target_ms: float | None) -> float:
    met_now, value_now = _score(current, objective, tpot_target_ms)
    met_other, value_other = _score(other, objective, tpot_target_ms)
    if met_now == met_other:
        return value_other / value_now - 1
    # Crossing the TPOT target: express the move as the latency improvement (or loss).
    return current.tpot_s / other.tpot_s - 1


def _confidence(gain: float, current: Candidate, other: Candidate) -> float:
    """P(gain > 0) under a log-normal approximation of both predictions."""
    sd = math.hypot(current.log_sd, other.log_sd)
    if gain <= -1:
        return 0.0
    if sd <= 0:
        return 1.0 if gain > 0 else 0.0
    return 0.5 * (1 + math.erf(math.log1p(gain) / (sd * math.sqrt(2))))


def _describe(candidate: Candidate, pool: PoolEvidence) -> str:
    e = candidate.expected_length
    known = pool.acceptance.observed_k + len(pool.acceptance.faded)
    if candidate.k > known:
        extrapolated = " extrapolated"
    elif candidate.k > pool.acceptance.observed_k:
        extrapolated = " from faded windows"
    else:
        extrapolated = ""
    over = f" over {len(pool.loads)} recent loads" if len(pool.loads) > 1 else ""
    return (
        f"K={candidate.k} E={e.mean:.2f}[{e.low:.2f},{e.high:.2f}]{extrapolated} "
        f"step={candidate.step.seconds * 1000:.1f}ms B={pool.batch:.1f} "
        f"{candidate.tokens_per_s:.0f}tok/s/pod{over} TPOT={candidate.tpot_s * 1000:.1f}ms"
    )
