"""The canary step state machine: one table row per transition, then durability across restarts."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.api.spec import Rollout
from specdec_operator.api.status import CanaryStatus
from specdec_operator.canary.analysis import Verdict
from specdec_operator.canary.plan import CanaryProgress, CanaryTarget, RolloutPlan
from specdec_operator.canary.progress import (
    CANARY_ACTION_ANNOTATION,
    ManualAction,
    StepObservation,
    advance,
    manual_action,
)
from tests.unit.canary.canaryfactories import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    T0,
    at,
    canary_status,
    rollout,
    stamp,
    target,
)

KEEP = {"keep_canary": True}
UNCERTAIN = Verdict("Inconclusive", "DifferenceUncertain", "TPOT p90 52 ms vs stable 40 ms (ratio 1.30 > 1.15, p=0.2)")
NO_BASELINE_PASS = Verdict("Pass", "NoBaselineHealthy",
                           "judged on health, restarts and errors only; error rate 0.00%; 120 canary requests")
ROLL_BACK = RolloutPlan(0, 0, keep_canary=False, roll_back=True)


@dataclass(frozen=True)
class Case:
    id: str
    current: CanaryStatus | None
    seconds: float
    expect_status: dict[str, Any] | None
    expect_plan: RolloutPlan
    expect_event: str | None
    verdict: Verdict | None = None
    ready: bool = True
    action: ManualAction | None = None
    rollout: Rollout = field(default_factory=rollout)
    target: CanaryTarget = field(default_factory=target)
    message_fragments: tuple[str, ...] = ()
    route_percent: int | None = None


WAITING = canary_status(weight=0)
PAUSED = canary_status(phase="Paused")

CASES = [
    Case(
        "start-when-none",
        None,
        0,
        {"step": 0, "weight": 0, "phase": "Progressing", "step_started_at": stamp(0), "canary_revision": "rev-new"},
        RolloutPlan(0, 10, **KEEP),
        "CanaryStarted",
        message_fragments=("canary revision rev-new against stable rev-old",),
    ),
    Case(
        "start-records-tuner-k",
        None,
        0,
        {"canary_k": 5},
        RolloutPlan(0, 10, **KEEP),
        "CanaryStarted",
        target=target(k=5),
    ),
    Case(
        "new-revision-replaces-running-canary",
        canary_status(step=1, weight=50),
        30,
        {"canary_revision": "rev-newer", "step": 0, "weight": 0, "step_started_at": stamp(30)},
        RolloutPlan(0, 10, **KEEP),
        "CanaryStarted",
        target=target(desired="rev-newer"),
        message_fragments=("replaces canary rev-new that was at step 2",),
    ),
    Case(
        "start-clears-a-one-shot-action-meant-for-an-earlier-canary",
        None,
        0,
        {"phase": "Progressing"},
        RolloutPlan(0, 10, **KEEP, clear_action=True),
        "CanaryStarted",
        action="abort",
    ),
    Case("waiting-for-ready", WAITING, 60, {"weight": 0}, RolloutPlan(0, 10, **KEEP), None, ready=False),
    Case(
        "ready-starts-the-step",
        WAITING,
        60,
        {"weight": 10, "step_started_at": stamp(60)},
        RolloutPlan(10, 10, **KEEP),
        "CanaryStepStarted",
        message_fragments=("step 1/3 (10%): 10% of traffic to revision rev-new",),
    ),
    Case(
        "never-ready-times-out",
        WAITING,
        900,
        {"phase": "RolledBack", "weight": 0},
        ROLL_BACK,
        "CanaryTimedOut",
        ready=False,
        message_fragments=("not ready after 900 s (timeout 900 s)",),
    ),
    Case(
        "pass-inside-window-holds",
        canary_status(),
        119,
        {"step": 0, "weight": 10, "verdict": "Pass", "message": PASS.message},
        RolloutPlan(10, 10, **KEEP),
        None,
        verdict=PASS,
    ),
    Case(
        "pass-after-window-advances",
        canary_status(),
        120,
        {"step": 1, "weight": 50, "step_started_at": stamp(120), "verdict": "Pass"},
        RolloutPlan(50, 50, **KEEP),
        "CanaryStepPassed",
        verdict=PASS,
        message_fragments=("step 1/3 (10%) passed: accepted length 2.70", "step 2/3 routes 50%"),
    ),
    Case(
        "pass-but-not-ready-holds",
        canary_status(),
        200,
        {"step": 0, "weight": 10},
        RolloutPlan(10, 10, **KEEP),
        None,
        verdict=PASS,
        ready=False,
    ),
    Case(
        # The step's route write was lost (an API server outage): the route as read still gives the canary 0%.
        # Passing would skip the 10% step's traffic altogether; the plan writes 10% again instead.
        "pass-while-route-lags-holds",
        canary_status(),
        200,
        {"step": 0, "weight": 10},
        RolloutPlan(10, 10, **KEEP),
        None,
        verdict=PASS,
        route_percent=0,
    ),
    Case(
        "pass-once-route-carries-the-weight-advances",
        canary_status(),
        200,
        {"step": 1, "weight": 50},
        RolloutPlan(50, 50, **KEEP),
        "CanaryStepPassed",
        verdict=PASS,
        route_percent=10,
    ),
    Case(
        "route-lagging-past-timeout-rolls-back-saying-so",
        canary_status(),
        901,
        {"phase": "RolledBack", "weight": 0},
        ROLL_BACK,
        "CanaryTimedOut",
        verdict=PASS,
        route_percent=0,
        message_fragments=("the HTTPRoute gives the canary 0%, not 10%",),
    ),
    Case(
        "no-verdict-after-window-holds",
        canary_status(),
        300,
        {"step": 0, "verdict": ""},
        RolloutPlan(10, 10, **KEEP),
        None,
    ),
    Case(
        "inconclusive-holds-until-timeout",
        canary_status(),
        899,
        {"step": 0, "verdict": "Inconclusive"},
        RolloutPlan(10, 10, **KEEP),
        None,
        verdict=INCONCLUSIVE,
    ),
    Case(
        "inconclusive-past-timeout-rolls-back",
        canary_status(),
        901,
        {"phase": "RolledBack", "weight": 0, "verdict": "Inconclusive"},
        ROLL_BACK,
        "CanaryTimedOut",
        verdict=UNCERTAIN,
        message_fragments=("step 1/3 (10%) still inconclusive after 901 s (timeout 900 s): TPOT p90",),
    ),
    Case(
        "a-window-longer-than-the-timeout-is-waited-for",
        canary_status(),
        1000,
        {"phase": "Progressing"},
        RolloutPlan(10, 10, **KEEP),
        None,
        verdict=INCONCLUSIVE,
        rollout=rollout(((10, 1200), (100, 0)), timeout_seconds=900),
    ),
    Case(
        "fail-rolls-back-at-once",
        canary_status(),
        5,
        {"phase": "RolledBack", "weight": 0, "verdict": "Fail"},
        ROLL_BACK,
        "CanaryFailed",
        verdict=FAIL,
        message_fragments=("step 1/3 (10%) failed (ThresholdsMissed): accepted length 1.42 vs stable 2.71",),
    ),
    Case(
        "fail-rolls-back-even-when-paused",
        PAUSED,
        5,
        {"phase": "RolledBack"},
        ROLL_BACK,
        "CanaryFailed",
        verdict=FAIL,
        rollout=rollout(paused=True),
    ),
    Case(
        "full-weight-step-does-not-pass-on-an-empty-window",
        canary_status(step=2, weight=100),
        0,
        {"phase": "Progressing", "weight": 100},
        RolloutPlan(100, 100, **KEEP),
        None,
        verdict=INCONCLUSIVE,
    ),
    Case(
        "full-weight-step-promotes-on-its-own-passing-window",
        canary_status(step=2, weight=100),
        0,
        {"phase": "Promoted", "weight": 100},
        RolloutPlan(100, 100, keep_canary=True, promote=True),
        "CanaryPromoted",
        verdict=NO_BASELINE_PASS,
        message_fragments=("all 3 steps passed; revision rev-new replaces rev-old", "judged on health"),
    ),
    Case(
        "last-partial-step-needs-a-pass",
        canary_status(step=1, weight=50),
        60,
        {"phase": "Promoted", "weight": 50},
        RolloutPlan(50, 50, keep_canary=True, promote=True),
        "CanaryPromoted",
        verdict=PASS,
        rollout=rollout(((10, 60), (50, 60))),
    ),
    Case(
        "last-partial-step-inconclusive-holds",
        canary_status(step=1, weight=50),
        60,
        {"phase": "Progressing"},
        RolloutPlan(50, 50, **KEEP),
        None,
        verdict=INCONCLUSIVE,
        rollout=rollout(((10, 60), (50, 60))),
    ),
    Case(
        "spec-pause",
        canary_status(),
        500,
        {"phase": "Paused", "verdict": "Pass"},
        RolloutPlan(10, 10, **KEEP),
        "CanaryPaused",
        verdict=PASS,
        rollout=rollout(paused=True),
        message_fragments=("paused by spec.rollout.paused at step 1/3 (10%)",),
    ),
    Case(
        "annotation-pause",
        canary_status(),
        10,
        {"phase": "Paused"},
        RolloutPlan(10, 10, **KEEP),
        "CanaryPaused",
        action="pause",
        message_fragments=(f"paused by {CANARY_ACTION_ANNOTATION}",),
    ),
    Case(
        "paused-never-times-out",
        PAUSED,
        100_000,
        {"phase": "Paused", "step_started_at": stamp(0)},
        RolloutPlan(10, 10, **KEEP),
        None,
        verdict=INCONCLUSIVE,
        action="pause",
    ),
    Case(
        "unpausing-restarts-the-window",
        PAUSED,
        5000,
        {"phase": "Progressing", "step": 0, "step_started_at": stamp(5000)},
        RolloutPlan(10, 10, **KEEP),
        "CanaryResumed",
    ),
    Case(
        "resume-annotation-is-consumed",
        PAUSED,
        5000,
        {"phase": "Progressing"},
        RolloutPlan(10, 10, keep_canary=True, clear_action=True),
        "CanaryResumed",
        action="resume",
    ),
    Case(
        "resume-does-not-override-spec-pause",
        PAUSED,
        5000,
        {"phase": "Paused"},
        RolloutPlan(10, 10, **KEEP),
        None,
        action="resume",
        rollout=rollout(paused=True),
    ),
    Case(
        "abort",
        canary_status(step=1, weight=50),
        10,
        {"phase": "Aborted", "weight": 0},
        RolloutPlan(0, 0, keep_canary=False, roll_back=True, clear_action=True),
        "CanaryAborted",
        action="abort",
        message_fragments=(f"aborted by {CANARY_ACTION_ANNOTATION} at step 2/3 (50%)",),
    ),
    Case(
        "promote-now",
        canary_status(),
        10,
        {"phase": "Promoted", "weight": 10},
        RolloutPlan(10, 10, keep_canary=True, promote=True, clear_action=True),
        "CanaryPromoted",
        action="promote",
        verdict=FAIL,
    ),
    Case(
        "spec-back-to-stable-cancels",
        canary_status(),
        10,
        {"phase": "Aborted", "weight": 0},
        ROLL_BACK,
        "CanaryCancelled",
        target=target(desired="rev-old"),
        message_fragments=("desired revision is the stable rev-old again; canary rev-new removed at step 1",),
    ),
    Case(
        "nothing-to-do",
        None,
        10,
        None,
        RolloutPlan(0, 0, keep_canary=False),
        None,
        target=target(desired="rev-old"),
    ),
    Case(
        "stray-abort-without-canary-is-consumed",
        None,
        10,
        None,
        RolloutPlan(0, 0, keep_canary=False, clear_action=True),
        None,
        action="abort",
        target=target(desired="rev-old"),
    ),
    Case(
        "promoted-and-stable-caught-up-releases-the-canary",
        canary_status(phase="Promoted", weight=100, step=2),
        10,
        {"phase": "Promoted"},
        RolloutPlan(0, 0, keep_canary=False),
        None,
        target=target(desired="rev-new", stable="rev-new"),
    ),
    Case(
        "promoted-waits-for-the-stable",
        canary_status(phase="Promoted", weight=100, step=2),
        10,
        {"phase": "Promoted"},
        RolloutPlan(100, 100, keep_canary=True, promote=True),
        None,
    ),
    Case(
        "rolled-back-revision-is-not-retried",
        canary_status(phase="RolledBack", weight=0, verdict="Fail"),
        10_000,
        {"phase": "RolledBack", "verdict": "Fail"},
        ROLL_BACK,
        None,
        verdict=PASS,
    ),
    Case(
        "shrunk-step-list-holds-at-the-last-step",
        canary_status(step=2, weight=50),
        10,
        {"step": 1},
        RolloutPlan(50, 50, **KEEP),
        None,
        verdict=INCONCLUSIVE,
        rollout=rollout(((10, 60), (50, 60))),
    ),
    Case(
        "clock-behind-the-status-holds",
        canary_status(step_started_at=stamp(100)),
        0,
        {"step": 0},
        RolloutPlan(10, 10, **KEEP),
        None,
        verdict=PASS,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_transition(case: Case) -> None:
    result = advance(case.current, target=case.target, rollout=case.rollout, now=at(case.seconds), action=case.action,
                     seen=StepObservation(case.verdict, case.ready, route_percent=case.route_percent))
    if case.expect_status is None:
        assert result.status is None
    else:
        assert result.status is not None
        observed = result.status.model_dump()
        assert {key: observed[key] for key in case.expect_status} == case.expect_status
    assert result.plan == case.expect_plan
    assert (result.event.reason if result.event else None) == case.expect_event
    for fragment in case.message_fragments:
        assert result.event is not None and fragment in result.event.message


@pytest.mark.parametrize("reason", ["CanaryFailed", "CanaryTimedOut", "CanaryAborted"])
def test_rollbacks_are_warnings_and_land_in_status(reason: str) -> None:
    by_reason = {case.expect_event: case for case in CASES if case.expect_event == reason}
    case = by_reason[reason]
    result = advance(case.current, target=case.target, rollout=case.rollout, now=at(case.seconds), action=case.action,
                     seen=StepObservation(case.verdict, case.ready))
    assert result.event is not None and result.event.type == "Warning"
    assert result.status is not None and result.status.message == result.event.message


def test_naive_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        advance(None, target=target(), rollout=rollout(), now=T0.replace(tzinfo=None), action=None,
                seen=StepObservation(None, True))


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, None),
        ({}, None),
        ({"other": "x"}, None),
        ({CANARY_ACTION_ANNOTATION: ""}, None),
        ({CANARY_ACTION_ANNOTATION: "pause"}, "pause"),
        ({CANARY_ACTION_ANNOTATION: " Promote "}, "promote"),
        ({CANARY_ACTION_ANNOTATION: "abort"}, "abort"),
        ({CANARY_ACTION_ANNOTATION: "resume"}, "resume"),
    ],
)
def test_manual_action(annotations: dict[str, str] | None, expected: str | None) -> None:
    assert manual_action(annotations) == expected


def test_unknown_manual_action_names_the_annotation_and_the_choices() -> None:
    with pytest.raises(
        ValueError, match=re.escape("specdec.io/canary-action='rollback' is not one of pause, resume, abort, promote")
    ):
        manual_action({CANARY_ACTION_ANNOTATION: "rollback"})


# Durability: the operator process may die between any two calls. A restart is modelled as writing
# status to the API server (JSON, camelCase) and reading it back; the run must be indistinguishable.


def _restart(status: CanaryStatus | None) -> CanaryStatus | None:
    if status is None:
        return None
    return CanaryStatus.model_validate(json.loads(json.dumps(status.to_wire())))


def _run(
    ticks: list[tuple[float, bool, str]], restart_at: set[int]
) -> list[tuple[str | None, int | None, int | None, str | None]]:
    verdicts = {"Pass": PASS, "Inconclusive": INCONCLUSIVE, "none": None}
    spec = rollout(((10, 120), (50, 120), (100, 0)), timeout_seconds=900)
    status: CanaryStatus | None = None
    now = 0.0
    trace: list[tuple[str | None, int | None, int | None, str | None]] = []
    for index, (gap, ready, verdict) in enumerate(ticks):
        now += gap
        if index in restart_at:
            status = _restart(status)
        progress: CanaryProgress = advance(status, target=target(), rollout=spec, now=at(now), action=None,
                                           seen=StepObservation(verdicts[verdict], ready))
        status = progress.status
        trace.append(
            (
                status.phase if status else None,
                status.step if status else None,
                progress.plan.weight,
                progress.event.reason if progress.event else None,
            )
        )
    return trace


TICKS = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=400.0, allow_nan=False),
        st.booleans(),
        st.sampled_from(["Pass", "Pass", "Inconclusive", "none"]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ticks=TICKS, restarts=st.sets(st.integers(min_value=0, max_value=39)))
def test_restarts_change_nothing(ticks: list[tuple[float, bool, str]], restarts: set[int]) -> None:
    assert _run(ticks, restarts) == _run(ticks, set())


@settings(max_examples=200, deadline=None)
@given(ticks=TICKS)
def test_steps_are_neither_skipped_nor_repeated(ticks: list[tuple[float, bool, str]]) -> None:
    trace = _run(ticks, set(range(len(ticks))))
    steps_seen = [step for phase, step, _, _ in trace if phase in ("Progressing", "Paused") and step is not None]
    assert all(later - earlier in (0, 1) for earlier, later in itertools.pairwise(steps_seen))
    passed = [event for *_, event in trace if event == "CanaryStepPassed"]
    assert len(passed) <= 2
    started = [event for *_, event in trace if event in ("CanaryStarted", "CanaryStepStarted")]
    assert started.count("CanaryStarted") == 1 and started.count("CanaryStepStarted") <= 1
    terminal = [index for index, (phase, *_) in enumerate(trace) if phase in ("Promoted", "RolledBack")]
    if terminal:
        assert all(trace[index][0] == trace[terminal[0]][0] for index in terminal)


def test_restart_during_a_pause_resumes_the_same_step_with_the_same_timer() -> None:
    spec = rollout()
    running = canary_status(step=1, weight=50, step_started_at=stamp(0))
    before = advance(running, target=target(), rollout=spec, now=at(100), action=None, seen=StepObservation(PASS, True))
    assert before.event is None and before.status is not None
    revived = _restart(before.status)
    after = advance(revived, target=target(), rollout=spec, now=at(120), action=None, seen=StepObservation(PASS, True))
    assert after.event is not None and after.event.reason == "CanaryStepPassed"
    assert after.status is not None and (after.status.step, after.status.weight) == (2, 100)
    again = advance(_restart(after.status), target=target(), rollout=spec, now=at(120), action=None,
                    seen=StepObservation(PASS, True))
    assert again.event is not None and again.event.reason == "CanaryPromoted"
