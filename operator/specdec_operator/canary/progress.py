"""The canary step state machine: (status, spec, verdict, clock, manual action) -> next status and a plan.

Durability comes from purity: every timer is derived from `status.canary.stepStartedAt`, so an
operator restarted mid-canary computes exactly what the old process would have, and at most one
transition happens per call, so no step is skipped or repeated.

Status encoding: `weight == 0` on an in-flight canary means its step has not started yet (the canary
pods are not ready, so no traffic goes to them); `stepStartedAt` then marks when the wait began, and
the wait is bounded by the analysis timeout.

Evidence is not in status (docs/canary.md): an operator that takes over a running step opens a new
analysis window and records its start in `evidenceSince`; the step's pause and timeout then count
from there, so a failover delays a step's end but never turns into a timeout or a rollback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal, cast, get_args

from specdec_operator import GROUP
from specdec_operator.api.spec import Canary, CanaryAnalysis, CanaryStep, Rollout
from specdec_operator.api.status import CanaryStatus
from specdec_operator.canary.analysis import (
    Verdict,
    WindowStats,
    error_rate_bound,
    load_beyond_reference,
    tpot_against_reference,
)
from specdec_operator.canary.plan import (
    FULL_WEIGHT,
    IN_FLIGHT_PHASES,
    CanaryEvent,
    CanaryProgress,
    CanaryTarget,
    RolloutPlan,
    split_canary_replicas,
)
from specdec_operator.timestamps import format_stamp, parse_stamp

ManualAction = Literal["pause", "resume", "abort", "promote"]
MANUAL_ACTIONS: tuple[str, ...] = get_args(ManualAction)
CANARY_ACTION_ANNOTATION = f"{GROUP}/canary-action"
# `analyse` says InsufficientSamples when a side has fewer than minRequests finished requests; `judge_step`
# makes it InsufficientTraffic when the canary is also healthy (no failed probe or restart) with errors, if
# any, at a rate within the limit; the same for a window past minRequests that lacks only requests.
INSUFFICIENT_SAMPLES = "InsufficientSamples"
INSUFFICIENT_TRAFFIC = "InsufficientTraffic"
DIFFERENCE_UNCERTAIN = "DifferenceUncertain"
# A step left in doubt by its only canary pod moves on at its timeout only to a step that tells GPUs and revisions
# apart better: the pods' hardware weighs at most this share there of what it weighs here
# (`_next_step_weighs_gpus_less`).
MOVE_ON_POD_VARIANCE = 0.6
ERROR_RATE_UNCERTAIN = "ErrorRateUncertain"


def manual_action(annotations: Mapping[str, str] | None) -> ManualAction | None:
    """The manual action requested through the `specdec.io/canary-action` annotation, if any."""
    value = (annotations or {}).get(CANARY_ACTION_ANNOTATION, "").strip().lower()
    if not value:
        return None
    if value in MANUAL_ACTIONS:
        return cast(ManualAction, value)
    raise ValueError(f"annotation {CANARY_ACTION_ANNOTATION}={value!r} is not one of {', '.join(MANUAL_ACTIONS)}")


def _settings(rollout: Rollout) -> Canary:
    return rollout.canary if rollout.canary is not None else Canary()


def _idle(clear_action: bool) -> RolloutPlan:
    return RolloutPlan(weight=0, sizing_weight=0, keep_canary=False, clear_action=clear_action)


def _terminal_plan(status: CanaryStatus, clear_action: bool) -> RolloutPlan:
    if status.phase == "Promoted":
        return RolloutPlan(status.weight, status.weight, keep_canary=True, promote=True, clear_action=clear_action)
    return RolloutPlan(0, 0, keep_canary=False, roll_back=True, clear_action=clear_action)


def _holding_plan(status: CanaryStatus, step: CanaryStep) -> RolloutPlan:
    return RolloutPlan(status.weight, step.weight, keep_canary=True)


def _step_label(status: CanaryStatus, steps: list[CanaryStep]) -> str:
    return f"step {status.step + 1}/{len(steps)} ({steps[status.step].weight}%)"


def _start(
    target: CanaryTarget, steps: list[CanaryStep], now: datetime, previous: CanaryStatus | None
) -> CanaryProgress:
    status = CanaryStatus(
        pool=target.pool,
        stable_revision=target.stable_revision,
        canary_revision=target.desired_revision,
        step=0,
        weight=0,
        phase="Progressing",
        step_started_at=format_stamp(now),
        canary_k=target.desired_k,
        decision_id=target.decision_id,
    )
    message = f"pool {target.pool}: canary revision {target.desired_revision} against stable {target.stable_revision}"
    if previous is not None and previous.phase in IN_FLIGHT_PHASES:
        message += f"; replaces canary {previous.canary_revision} that was at step {previous.step + 1}"
    # No traffic yet, but the first step's pods must exist before they can become ready.
    return CanaryProgress(
        status,
        RolloutPlan(0, steps[0].weight, keep_canary=True),
        CanaryEvent("Normal", "CanaryStarted", message),
    )


def _clearing(progress: CanaryProgress, clear_action: bool) -> CanaryProgress:
    if not clear_action:
        return progress
    return replace(progress, plan=replace(progress.plan, clear_action=True))


def _finish(
    status: CanaryStatus,
    phase: Literal["Promoted", "RolledBack", "Aborted"],
    event: CanaryEvent,
    *,
    verdict: Verdict | None = None,
    clear_action: bool = False,
) -> CanaryProgress:
    finished = status.model_copy(
        update={
            "phase": phase,
            "weight": status.weight if phase == "Promoted" else 0,
            "verdict": verdict.outcome if verdict is not None else status.verdict,
            "message": event.message,
        }
    )
    return CanaryProgress(finished, _terminal_plan(finished, clear_action), event)


def _window_start(status: CanaryStatus) -> datetime:
    """Where the step's analysis window starts: the step's start, or a later takeover's."""
    started = parse_stamp(status.step_started_at)
    if status.evidence_since is None:
        return started
    return max(started, parse_stamp(status.evidence_since))


def _elapsed_seconds(status: CanaryStatus, now: datetime) -> float:
    # A clock that steps backwards must not make a window look longer than it was.
    return max(0.0, (now - _window_start(status)).total_seconds())


def _take_over(status: CanaryStatus, verdict: Verdict | None, label: str) -> tuple[CanaryStatus, CanaryEvent | None]:
    """Record a verdict's later evidence window: the step's clock restarts with the evidence."""
    if verdict is None or verdict.evidence_since is None or status.weight == 0:
        return status, None
    since = parse_stamp(verdict.evidence_since)
    if since <= _window_start(status):
        return status, None
    restarted = status.model_copy(update={"evidence_since": format_stamp(since)})
    event = CanaryEvent(
        "Normal",
        "CanaryEvidenceRestarted",
        f"{label}: this operator took the step over at {format_stamp(since)} without its predecessor's "
        "measurements; the analysis window, the pause and the timeout restart there",
    )
    return restarted, event


def _with_verdict(status: CanaryStatus, verdict: Verdict | None, **update: object) -> CanaryStatus:
    if verdict is not None:
        update = {"verdict": verdict.outcome, "message": verdict.message, **update}
    return status.model_copy(update=update) if update else status


# Actions the annotation asks for once: the annotation is cleared once the step took them.
_ONE_SHOT_ACTIONS = ("abort", "promote", "resume")


def _step(
    status: CanaryStatus,
    settings: Canary,
    paused_by: str | None,
    now: datetime,
    action: ManualAction | None,
    seen: StepObservation,
) -> CanaryProgress:
    """One pass of a running canary: ended (an action or a failed verdict), paused or resumed, or advanced."""
    steps = settings.steps
    if status.step >= len(steps):
        # The step list shrank under a running canary: hold it at the new last step.
        status = status.model_copy(update={"step": len(steps) - 1})
    label = _step_label(status, steps)
    ended = _ended(status, action, seen.verdict, label)
    if ended is not None:
        return ended
    paused = _paused_or_resumed(status, steps[status.step], paused_by, action, seen.verdict, label, now)
    if paused is not None:
        return paused
    return _advanced(status, settings, label, now, seen, action in _ONE_SHOT_ACTIONS)


def _ended(
    status: CanaryStatus, action: ManualAction | None, verdict: Verdict | None, label: str
) -> CanaryProgress | None:
    """Aborted or promoted by the annotation, or rolled back on a failing verdict; None: the canary goes on."""
    one_shot = action in _ONE_SHOT_ACTIONS
    if action == "abort":
        event = CanaryEvent("Warning", "CanaryAborted", f"aborted by {CANARY_ACTION_ANNOTATION} at {label}")
        return _finish(status, "Aborted", event, clear_action=True)
    if action == "promote":
        event = CanaryEvent(
            "Normal",
            "CanaryPromoted",
            f"promoted by {CANARY_ACTION_ANNOTATION} at {label}: revision {status.canary_revision} "
            f"replaces {status.stable_revision}",
        )
        return _finish(status, "Promoted", event, clear_action=True)
    if verdict is not None and verdict.outcome == "Fail":
        # A failing canary rolls back even while paused: pausing holds progress, not damage.
        event = CanaryEvent("Warning", "CanaryFailed", f"{label} failed ({verdict.reason}): {verdict.message}")
        return _finish(status, "RolledBack", event, verdict=verdict, clear_action=one_shot)
    return None


def _paused_or_resumed(
    status: CanaryStatus,
    step: CanaryStep,
    paused_by: str | None,
    action: ManualAction | None,
    verdict: Verdict | None,
    label: str,
    now: datetime,
) -> CanaryProgress | None:
    """Paused (by the spec, a change freeze, both named in `paused_by`, or the annotation), or resumed from a pause
    with a fresh window; None: neither."""
    one_shot = action in _ONE_SHOT_ACTIONS
    holding = _holding_plan(status, step)
    if paused_by is not None or action == "pause":
        if status.phase == "Paused":
            return CanaryProgress(_with_verdict(status, verdict), holding)
        source = paused_by or CANARY_ACTION_ANNOTATION
        paused = _with_verdict(status, verdict, phase="Paused")
        return CanaryProgress(paused, holding, CanaryEvent("Normal", "CanaryPaused", f"paused by {source} at {label}"))
    if status.phase == "Paused":
        # The window restarts: time spent paused must count neither as analysis nor towards the timeout.
        resumed = _with_verdict(
            status, verdict, phase="Progressing", step_started_at=format_stamp(now), evidence_since=None
        )
        event = CanaryEvent("Normal", "CanaryResumed", f"resumed at {label}; its analysis window restarts")
        return CanaryProgress(
            resumed, RolloutPlan(status.weight, step.weight, keep_canary=True, clear_action=one_shot), event
        )
    return None


def _advanced(
    status: CanaryStatus, settings: Canary, label: str, now: datetime, seen: StepObservation, one_shot: bool
) -> CanaryProgress:
    """A progressing canary: waiting for ready pods, its window opened, passed, still analysed, or timed out."""
    verdict, canary_ready, route_percent = seen.verdict, seen.canary_ready, seen.route_percent
    steps = settings.steps
    step = steps[status.step]
    timeout = settings.analysis.timeout_seconds
    plan = RolloutPlan(status.weight, step.weight, keep_canary=True, clear_action=one_shot)
    if status.weight == 0:
        return _await_ready(status, steps, label, timeout, now, canary_ready, plan)
    status, restarted = _take_over(status, verdict, label)
    if restarted is not None:
        # The window just opened: nothing in it can pass or time out yet.
        return CanaryProgress(_with_verdict(status, verdict), plan, restarted)
    elapsed = _elapsed_seconds(status, now)
    # The step's weight must be in the route as read before the step can pass: a route write lost to an
    # API server outage would otherwise let a step pass that never sent the canary its share.
    wanted = seen.route_target if seen.route_target is not None else status.weight
    routed = route_percent is None or route_percent >= wanted
    window_over = elapsed >= step.pause_seconds
    timed_out = elapsed >= max(step.pause_seconds, timeout)
    # Every step, the 100% one included, passes only on a passing verdict over its own window: at 100% that
    # is `analyse(canary, None)` (minRequests, health, restarts, errors) and `judge_step`'s TPOT against the
    # stable's figures from the previous step. An empty window never passes.
    verdict_ok = verdict is not None and verdict.outcome == "Pass"
    if window_over and canary_ready and routed and verdict_ok:
        return _pass_step(status, steps, label, verdict, now, one_shot)
    quiet = verdict is None or (verdict.outcome == "Inconclusive"
                                and verdict.reason in (INSUFFICIENT_SAMPLES, INSUFFICIENT_TRAFFIC))
    if timed_out and quiet and canary_ready and routed:
        return _quiet(status, settings, label, verdict, elapsed, now, plan)
    if timed_out and canary_ready and routed and verdict is not None and _lone_pod_doubt(verdict, settings.analysis) \
            and _next_step_weighs_gpus_less(status, steps, seen.pool_replicas):
        return _moved_on(status, steps, label, verdict, now, one_shot)
    if timed_out:
        detail = verdict.message if verdict is not None else "no analysis verdict"
        if not canary_ready:
            detail = f"canary pods not ready; {detail}"
        if not routed:
            detail = f"the HTTPRoute gives the canary {route_percent}%, not {status.weight}%; {detail}"
        event = CanaryEvent(
            "Warning",
            "CanaryTimedOut",
            f"{label} still inconclusive after {elapsed:.0f} s (timeout {timeout} s): {detail}",
        )
        return _finish(status, "RolledBack", event, verdict=verdict, clear_action=one_shot)
    return CanaryProgress(_with_verdict(status, verdict), plan)


def _lone_pod_doubt(verdict: Verdict, analysis: CanaryAnalysis) -> bool:
    """The step's doubt is its only canary pod's hardware: one pod served the canary, and what keeps the verdict
    from passing is a comparison beyond its limit but not proven (`DifferenceUncertain`) on goodput, TPOT p90 or
    acceptance, with the error rate known within its limit. Pods of one GPU model differ by several percent
    (analysis.POD_SPREAD), so one canary pod reading a few percent slow is as likely its GPU as its revision,
    and no number of requests tells them apart: only more pods do. A p99 not yet known is a want of requests,
    not of pods, and an error rate in doubt is the revision's, whatever the GPU: neither is this."""
    if verdict.outcome != "Inconclusive" or verdict.reason != DIFFERENCE_UNCERTAIN or verdict.canary_pods != 1:
        return False
    if any(not item.passed and item.excess_bound is not None for item in verdict.comparisons):
        return False
    if analysis.max_error_rate <= 0:
        return verdict.canary_errors == 0
    return verdict.error_rate_bound is not None and verdict.error_rate_bound < analysis.max_error_rate


def _next_step_weighs_gpus_less(status: CanaryStatus, steps: list[CanaryStep], replicas: int | None) -> bool:
    """The next step still compares the canary with the stable (its weight is under 100%), on pods whose GPUs
    weigh at most MOVE_ON_POD_VARIANCE of this step's in the comparison (1 / canary pods + 1 / stable pods):
    from the default steps' 10% to 50%, pools of 6 or more. In a pool of 3 the 50% step compares two canary pods
    with one stable pod, no better than one with two, and a goodput -10% regression moved on there passed its 50%
    step (the canary bench)."""
    following = status.step + 1
    if replicas is None or following >= len(steps) or steps[following].weight >= FULL_WEIGHT:
        return False

    def pod_variance(step: int) -> float:
        stable, canary = split_canary_replicas(replicas, steps[step].weight)
        return 1 / max(canary, 1) + 1 / max(stable, 1)

    return pod_variance(following) <= MOVE_ON_POD_VARIANCE * pod_variance(status.step)


def _moved_on(status: CanaryStatus, steps: list[CanaryStep], label: str, verdict: Verdict, now: datetime,
              clear_action: bool) -> CanaryProgress:
    """A step whose only canary pod left it in doubt (`_lone_pod_doubt`) goes on at its timeout to the next step,
    whose analysis compares more canary pods with the stable and decides: it fails a regression there, or holds
    and times out as every step does. Rolling back here would fail a healthy revision for its pod's GPU about as
    often as it would catch a regression of the same size."""
    event = CanaryEvent(
        "Normal",
        "CanaryStepUndecided",
        f"{label} could not tell its only canary pod's GPU from its revision by the timeout: {verdict.message}; "
        f"step {status.step + 2}/{len(steps)} routes {steps[status.step + 1].weight}% and judges more canary pods",
    )
    return _next_step(status, steps, verdict, now, clear_action, event)


def follow_recorded_step(status: CanaryStatus, rollout: Rollout, verdict: Verdict | None, now: datetime,
                         shown: str) -> CanaryProgress:
    """A replayed step whose recording shows the operator past it (`shown`: how, e.g. the route gives the canary a
    share only a later step sets). The operator passed the step on its own scrapes, which a
    recorder beside it takes at other moments (a round apart on a 2 s period), so the replay's window may lack the
    last requests that decided it while the recording's next rounds carry the next step's traffic. Those rounds
    are not this step's: the replay goes on to the next step, as the operator did, recording the stable's figures
    from this step's window as a pass would (`_stable_reference`). Only `canary replay` calls this; the operator
    reads its own step from status."""
    steps = _settings(rollout).steps
    label = _step_label(status, steps)
    seen = verdict.message if verdict is not None else "no verdict yet"
    event = CanaryEvent(
        "Normal",
        "CanaryStepFollowed",
        f"{label}: {shown}, a later step's share, before this replay's window decided the step ({seen}); step "
        f"{status.step + 2}/"
        f"{len(steps)} follows the recording",
    )
    return _next_step(status, steps, verdict, now, False, event, **_stable_reference(status, verdict))


def _next_step(status: CanaryStatus, steps: list[CanaryStep], verdict: Verdict | None, now: datetime,
               clear_action: bool, event: CanaryEvent, **recorded: object) -> CanaryProgress:
    """The canary goes on to the step after this one, whose window and clock start now; `recorded`: further status
    fields the move writes."""
    following = steps[status.step + 1]
    moved = _with_verdict(
        status, verdict, step=status.step + 1, weight=following.weight, step_started_at=format_stamp(now),
        evidence_since=None, hold_reason="", **recorded,
    )
    return CanaryProgress(
        moved, RolloutPlan(following.weight, following.weight, keep_canary=True, clear_action=clear_action), event
    )


def _quiet(
    status: CanaryStatus, settings: Canary, label: str, verdict: Verdict | None, elapsed: float, now: datetime,
    plan: RolloutPlan,
) -> CanaryProgress:
    """Past the timeout with too few requests: a quiet model. Hold until traffic comes, for at most
    `insufficientTraffic.maxWaitSeconds`, then (`Promote`) a clean canary goes on to the next step, or is
    promoted at the last, or (`RollBack`, or a window that is not clean) it is rolled back."""
    policy = settings.insufficient_traffic
    detail = verdict.message if verdict is not None else "no measurements"
    # What the hold's end will do, said while it holds and done when it ends.
    blemish = _hold_end_blemish(verdict, settings.analysis.max_error_rate)
    moves_on = policy.action == "Promote" and blemish is None
    last = status.step + 1 == len(settings.steps)
    if moves_on:
        then = "Promote" if last else f"go on to step {status.step + 2}/{len(settings.steps)}"
    else:
        then = f"RollBack, as {blemish}" if policy.action == "Promote" else "RollBack"
    if elapsed < policy.max_wait_seconds:
        held = _with_verdict(status, verdict, hold_reason=INSUFFICIENT_TRAFFIC)
        held = held.model_copy(update={"message": f"{INSUFFICIENT_TRAFFIC}: {label} holds for requests "
                                                  f"({elapsed:.0f} s of at most {policy.max_wait_seconds} s, then "
                                                  f"{then}): {detail}"})
        if status.hold_reason == INSUFFICIENT_TRAFFIC:
            return CanaryProgress(held, plan)
        event = CanaryEvent("Normal", "CanaryInsufficientTraffic",
                            f"{label} has too few requests to judge after {elapsed:.0f} s; it holds and carries "
                            f"on when traffic comes (at most {policy.max_wait_seconds} s, then {then}): "
                            f"{detail}")
        return CanaryProgress(held, plan, event)
    if moves_on and not last:
        # Not the last step: the canary goes on to the next, whose own window is judged as every step's is. A
        # hold's end that promoted from here skipped the last step, where failures that only the full load
        # reaches show (the bench's "errors 5% at 100%", promoted in 3 of 40 quiet trials so).
        following = settings.steps[status.step + 1]
        event = CanaryEvent(
            "Normal", "CanaryStepUndecided",
            f"{label}: too few requests to judge after {elapsed:.0f} s (insufficientTraffic.maxWaitSeconds "
            f"{policy.max_wait_seconds}) on a clean window; step {status.step + 2}/{len(settings.steps)} routes "
            f"{following.weight}% and judges its own window: {detail}",
        )
        return _next_step(status, settings.steps, verdict, now, plan.clear_action, event,
                          **_stable_reference(status, verdict))
    if moves_on:
        event = CanaryEvent(
            "Normal", "CanaryPromoted",
            f"{label}: too few requests to judge after {elapsed:.0f} s (insufficientTraffic.maxWaitSeconds "
            f"{policy.max_wait_seconds}); promoted on a clean window (no failed health check or restart, the "
            f"error rate within maxErrorRate, no estimate beyond its limit): revision {status.canary_revision} "
            f"replaces {status.stable_revision}; {detail}",
        )
        return _finish(status, "Promoted", event, verdict=verdict, clear_action=plan.clear_action)
    why = "insufficientTraffic.action is RollBack" if policy.action == "RollBack" else (
        f"its window is not clean: {blemish}")
    event = CanaryEvent(
        "Warning", "CanaryTimedOut",
        f"{label}: {INSUFFICIENT_TRAFFIC}, too few requests to judge after {elapsed:.0f} s "
        f"(insufficientTraffic.maxWaitSeconds {policy.max_wait_seconds}) and {why}: {detail}",
    )
    return _finish(status, "RolledBack", event, verdict=verdict, clear_action=plan.clear_action)


def _hold_end_blemish(verdict: Verdict | None, max_error_rate: float) -> str | None:
    """Why a quiet model's window may not be promoted when its hold ends; None when it is clean: only requests
    were wanting (no failed health check or restart, `judge_step`), its error rate is within the limit, and no
    estimate reads beyond its limit. An hour that left a canary's numbers on the wrong side of a limit, however
    noisy, is no ground to promote it; a stray failed request among hundreds, at the stable's own rate, is no
    ground to roll it back."""
    if verdict is None:
        return "nothing measured"
    if verdict.canary_errors > 0 and (
            verdict.canary_requests <= 0 or verdict.canary_errors / verdict.canary_requests > max_error_rate):
        return (f"its error rate ({verdict.canary_errors} failed of {verdict.canary_requests} requests) is above "
                f"maxErrorRate {max_error_rate:.2%}")
    if verdict.reason != INSUFFICIENT_TRAFFIC:
        # `judge_step` left it short of requests and something more (its failed requests' rate, its health).
        return f"its window lacks more than requests ({verdict.reason})"
    # A tail not yet known but within its limit by every estimate passes with more requests: a model that never
    # gathers the few hundred requests a p99 needs is promoted on its estimates, as the policy says.
    beyond = [item.metric for item in verdict.comparisons if not (item.passed or item.passes_with_more_requests)]
    return "; ".join(f"{metric} reads beyond its limit" for metric in beyond) or None


def _await_ready(
    status: CanaryStatus,
    steps: list[CanaryStep],
    label: str,
    timeout: int,
    now: datetime,
    canary_ready: bool,
    plan: RolloutPlan,
) -> CanaryProgress:
    """The step has not started: traffic waits until the canary pods are ready, for at most the timeout."""
    elapsed = _elapsed_seconds(status, now)
    if canary_ready:
        weight = steps[status.step].weight
        started = status.model_copy(
            update={"weight": weight, "step_started_at": format_stamp(now), "evidence_since": None}
        )
        event = CanaryEvent(
            "Normal", "CanaryStepStarted", f"{label}: {weight}% of traffic to revision {status.canary_revision}"
        )
        return CanaryProgress(
            started, RolloutPlan(weight, weight, keep_canary=True, clear_action=plan.clear_action), event
        )
    if elapsed >= timeout:
        event = CanaryEvent(
            "Warning",
            "CanaryTimedOut",
            f"canary pods of revision {status.canary_revision} not ready after {elapsed:.0f} s "
            f"(timeout {timeout} s) at {label}",
        )
        return _finish(status, "RolledBack", event, clear_action=plan.clear_action)
    return CanaryProgress(status, plan)


def _pass_step(
    status: CanaryStatus,
    steps: list[CanaryStep],
    label: str,
    verdict: Verdict | None,
    now: datetime,
    clear_action: bool,
) -> CanaryProgress:
    evidence = verdict.message if verdict is not None else ""
    if status.step + 1 == len(steps):
        event = CanaryEvent(
            "Normal",
            "CanaryPromoted",
            f"all {len(steps)} steps passed; revision {status.canary_revision} replaces "
            f"{status.stable_revision}: {evidence}",
        )
        return _finish(status, "Promoted", event, verdict=verdict, clear_action=clear_action)
    recorded = _stable_reference(status, verdict)
    event = CanaryEvent(
        "Normal",
        "CanaryStepPassed",
        f"{label} passed: {evidence}; step {status.step + 2}/{len(steps)} routes {steps[status.step + 1].weight}%",
    )
    return _next_step(status, steps, verdict, now, clear_action, event, **recorded)


def _stable_reference(status: CanaryStatus, verdict: Verdict | None) -> dict[str, object]:
    """The stable's figures a step that ends recorded for the 100% step to be judged against, if it had any."""
    reference = _stable_tpot_p90(verdict)
    if not reference or verdict is None:
        return {}
    tokens = verdict.stable_tokens_per_pod_second
    rounded = None if tokens is None else round(tokens, 2)
    return {"stable_tpot_p90_ms": reference, "stable_reference_step": status.step,
            "stable_reference_requests": verdict.stable_requests, "stable_reference_tokens_per_pod_second": rounded}


def _stable_tpot_p90(verdict: Verdict | None) -> float | None:
    """The stable's TPOT p90 (ms) that a passing verdict compared against, if it had one."""
    for comparison in verdict.comparisons if verdict is not None else ():
        if comparison.metric == "TPOT p90" and comparison.stable > 0:
            return comparison.stable
    return None


def _underpowered(verdict: Verdict) -> bool:
    """Inconclusive only for want of requests: every comparison still open has its estimate within the limit
    (the caller checks the error rate's), a bound that more requests would tighten
    (a p99 or a 1% error rate needs a few hundred requests to be known). Such a step is a quiet model's, held
    as `InsufficientTraffic`, never rolled back for lack of requests alone. So is an estimate beyond its limit
    too noisy to weigh (`Comparison.wants_requests`: at 0.2 requests/s a healthy canary's acceptance at its third
    draft position read 0.75-0.8 of the stable's, each as likely its few requests as a regression). An estimate
    beyond its limit without significance whose noise can weigh it (a suspect regression) is not this: it stays
    `DifferenceUncertain` (as does one canary pod's doubt: its GPU's spread is no want of requests); nor is a p99 whose
    ratio reads within its limit while its excess share of requests beyond the limit does not (held as quiet,
    a canary with 2-3% of its requests stalled beyond the limit was promoted at the hold's end)."""
    if verdict.reason == ERROR_RATE_UNCERTAIN:
        return all(item.passed for item in verdict.comparisons)
    if verdict.reason != DIFFERENCE_UNCERTAIN:
        return False
    return all(item.passed or item.passes_with_more_requests or item.wants_requests for item in verdict.comparisons)


def judge_step(
    verdict: Verdict | None,
    canary: WindowStats | None,
    status: CanaryStatus | None,
    thresholds: CanaryAnalysis | None,
) -> Verdict | None:
    """What the step machine needs on top of `analyse`'s verdict; pure, the handler (and a replay) call it.

    - A window that lacks only requests, on a canary with no failed health check or restart and failed
      requests (if any) at a rate it cannot tell from `maxErrorRate`, is `InsufficientTraffic`: a quiet model,
      which `advance` holds rather than rolls back (and promotes at the hold's end only on a clean window:
      the error rate within the limit and no estimate beyond its limit).
    - At 100% the stable serves nothing; `analyse(canary, None, ...)` judged health, restarts and errors over
      `minRequests`. TPOT is judged here against the stable's p90 recorded from the previous step
      (`status.stableTpotP90Ms`, read from `stableReferenceRequests` requests) by the rules of every other
      step's p90 (`tpot_against_reference`): the canary's share of requests slower than that p90 times
      `maxTpotRatio` against 10%, read between bucket bounds as they are everywhere. It fails when that share
      is significantly above 10% (always valid, p < SIGNIFICANCE), passes within the noise of one look, and
      holds as `DifferenceUncertain` in between. Only like with like: while each canary pod
      generates more tokens per second than the stable's did then (beyond REFERENCE_LOAD_TOLERANCE: more
      requests or longer ones), its p90 is no measure of the revision, and the step is judged without it (the
      steps before compared both under the same load). A healthy canary whose traffic doubled as its 100% step
      began was rolled back 16-19 times in 20 (the bench).
    """
    if verdict is None or canary is None or status is None or thresholds is None:
        return verdict
    # Failed requests at a rate the window cannot tell from the limit (the limit within its bounds, the same
    # ERROR_PASS_CONFIDENCE a pass needs) are not a reason to give up on a step that lacks only requests: a
    # healthy canary's 4 errors in 900 requests (0.44%) cannot yet bound the rate below 1%, nor 1 in 90 (1.1%,
    # at 0.1 requests/s) show it above; more requests will. Only a clean window may be promoted when the hold
    # ends (`_hold_end_blemish`).
    errors_within = canary.errors == 0 or error_rate_bound(canary)[0] < thresholds.max_error_rate
    healthy = canary.health_failures == 0 and canary.restarts == 0
    if verdict.outcome == "Inconclusive" and healthy and errors_within and (
            verdict.reason == INSUFFICIENT_SAMPLES or _underpowered(verdict)):
        return replace(verdict, reason=INSUFFICIENT_TRAFFIC)
    reference = status.stable_tpot_p90_ms
    if status.weight != FULL_WEIGHT or verdict.outcome != "Pass" or not reference or not canary.tpot_buckets:
        return verdict
    recorded_at = (status.stable_reference_step or 0) + 1
    reference_tokens = status.stable_reference_tokens_per_pod_second
    more_load = load_beyond_reference(canary, reference_tokens)
    if more_load is not None:
        return replace(verdict, message=(
            f"{verdict.message}; TPOT not compared with the stable's p90 of {reference:.1f} ms recorded at step "
            f"{recorded_at}: each canary pod generates {more_load:.2f}x the tokens per second the stable's did then "
            f"({canary.tokens_per_pod_second or 0.0:.1f} vs {reference_tokens or 0.0:.1f}), and an "
            f"engine step grows with its batch"))
    tpot = tpot_against_reference(canary, reference, status.stable_reference_requests, thresholds.max_tpot_ratio)
    if tpot is None:
        return verdict
    source = f" from {status.stable_reference_requests} requests" if status.stable_reference_requests else ""
    text = f"{tpot.describe()}, against the stable's recorded at step {recorded_at}{source}"
    judged = replace(verdict, comparisons=(*verdict.comparisons, tpot))
    if tpot.passed:
        return replace(judged, message=f"{verdict.message}; {text}")
    if tpot.failed:
        return replace(judged, outcome="Fail", reason="TPOTExceeded", message=f"{text}; {verdict.message}")
    return replace(judged, outcome="Inconclusive", reason=DIFFERENCE_UNCERTAIN,
                   message=f"{text}, not yet significant; {verdict.message}")


@dataclass(frozen=True)
class StepObservation:
    """What one reconcile saw of a pool's canary step.

    `verdict` is the analysis of the current step's window (since stepStartedAt), or None when nothing could
    be measured yet. `canary_ready`: the canary pods of the step serve. `route_percent`: the canary's share in
    the HTTPRoute as last read, None without a route; a step does not pass while the route gives the canary
    less than `route_target` (the percent the route must carry for this step, `equal_load_percent`; the step's
    weight when None). `pool_replicas`: the pool's replicas, from which each step's pods follow
    (`split_canary_replicas`); None when unknown, and then a step left in doubt by its only canary pod times out
    as any other (`_lone_pod_doubt`).
    """

    verdict: Verdict | None
    canary_ready: bool
    route_percent: int | None = None
    route_target: int | None = None
    pool_replicas: int | None = None


def advance(
    current: CanaryStatus | None,
    *,
    target: CanaryTarget,
    rollout: Rollout,
    now: datetime,
    action: ManualAction | None,
    seen: StepObservation,
    frozen: str | None = None,
) -> CanaryProgress:
    """One reconcile's worth of canary progress for one pool. `now` must be timezone-aware. `frozen`: the source of
    a change freeze, which holds a running canary at its step as a pause does (a failing one still rolls back)."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    one_shot = action in ("abort", "promote", "resume")
    settings = _settings(rollout)

    if target.desired_revision == target.stable_revision:
        if current is not None and current.phase in IN_FLIGHT_PHASES:
            event = CanaryEvent(
                "Normal",
                "CanaryCancelled",
                f"desired revision is the stable {target.stable_revision} again; "
                f"canary {current.canary_revision} removed at step {current.step + 1}",
            )
            return _finish(current, "Aborted", event, clear_action=one_shot)
        return CanaryProgress(current, _idle(one_shot))

    if current is None or current.canary_revision != target.desired_revision:
        # A one-shot action present now was meant for an earlier canary: it is cleared, never applied to
        # this one (a promote carried over would promote the new revision unanalysed).
        return _clearing(_start(target, settings.steps, now, current), one_shot)
    if current.phase not in IN_FLIGHT_PHASES:
        if target.decision_id is not None and target.decision_id != current.decision_id:
            # A new tuner decision for a revision that failed before: the tuner's evidence changed
            # (tuner/policy.py), so the revision gets a fresh canary, not a silent revert.
            return _clearing(_start(target, settings.steps, now, current), one_shot)
        # A rolled-back revision is not retried on its own: the spec (or a new decision) must change first.
        return CanaryProgress(current, _terminal_plan(current, one_shot))
    return _step(current, settings, "spec.rollout.paused" if rollout.paused else frozen, now, action, seen)
