"""A step whose only canary pod leaves its verdict in doubt at the timeout goes on to a step with more canary pods
instead of rolling back (issue 31: healthy K changes rolled back for one pod's GPU). Written first: on the old step
machine each of these rolled back at the timeout."""

from __future__ import annotations

from typing import Any

import pytest

from specdec_operator.bench import canary as bench
from specdec_operator.canary.analysis import Comparison, Verdict, analyse
from specdec_operator.canary.progress import StepObservation, advance
from specdec_operator.canary.replay import Record, replay
from tests.unit.canary.canaryfactories import at, canary_status, target, thresholds, window
from tests.unit.canary.test_progress_steps import quiet_rollout

TIMEOUT_S = 900
GOODPUT_IN_DOUBT = Comparison("goodput per sequence", 33.0, 36.0, 0.99, True, " tok/s", 1, p_value=0.04,
                              beyond_z=2.0)
P99_UNKNOWN = Comparison("TPOT p99", 90.0, 50.0, 2.0, False, " ms", 1, p_value=0.3, excess_bound=0.02,
                         beyond_z=-0.5, excess_estimate=0.001)


def in_doubt(*comparisons: Comparison, pods: int = 1, error_bound: float | None = 0.004, errors: int = 0,
             reason: str = "DifferenceUncertain") -> Verdict:
    return Verdict("Inconclusive", reason, "goodput per sequence in doubt", comparisons or (GOODPUT_IN_DOUBT,),
                   canary_requests=900, stable_requests=900, error_rate_bound=error_bound, canary_errors=errors,
                   canary_pods=pods)


def at_timeout(verdict: Verdict, *, step: int = 0, replicas: int | None = 8, seconds: float = TIMEOUT_S,
               **rollout: Any) -> Any:
    weight = (10, 50, 100)[step]
    return advance(canary_status(step=step, weight=weight), target=target(), now=at(seconds), action=None,
                   rollout=quiet_rollout(**rollout), seen=StepObservation(verdict, True, pool_replicas=replicas))


@pytest.mark.parametrize("replicas", [6, 8, 12])
def test_a_lone_pods_doubt_moves_on_to_a_step_with_more_canary_pods(replicas: int) -> None:
    result = at_timeout(in_doubt(), replicas=replicas)
    assert result.status.phase == "Progressing"
    assert (result.status.step, result.status.weight) == (1, 50)
    assert result.event.reason == "CanaryStepUndecided" and result.event.type == "Normal"
    assert "only canary pod" in result.event.message and "goodput per sequence in doubt" in result.event.message
    assert result.plan.weight == 50 and result.plan.keep_canary


def test_before_the_timeout_the_step_holds() -> None:
    result = at_timeout(in_doubt(), seconds=TIMEOUT_S - 10)
    assert (result.status.phase, result.status.step) == ("Progressing", 0) and result.event is None


@pytest.mark.parametrize("case", ["one-replica pool", "two-replica pool", "three-replica pool",
                                  "four-replica pool", "pool unknown", "two canary pods",
                                  "next step is 100%", "p99 not known", "error rate in doubt", "missing gate"])
def test_the_timeout_still_rolls_back_what_more_pods_would_not_decide(case: str) -> None:
    verdict, step, replicas = in_doubt(), 0, 8
    if case == "one-replica pool":
        replicas = 1
    elif case == "two-replica pool":
        replicas = 2
    elif case == "three-replica pool":
        replicas = 3
    elif case == "four-replica pool":
        replicas = 4
    elif case == "pool unknown":
        replicas = None
    elif case == "two canary pods":
        verdict = in_doubt(pods=2)
    elif case == "next step is 100%":
        step = 1
    elif case == "p99 not known":
        verdict = in_doubt(GOODPUT_IN_DOUBT, P99_UNKNOWN)
    elif case == "error rate in doubt":
        verdict = in_doubt(error_bound=0.012, errors=3)
    elif case == "missing gate":
        verdict = in_doubt(reason="MissingMeasurements")
    result = at_timeout(verdict, step=step, replicas=replicas)
    assert result.status.phase == "RolledBack" and result.event.reason == "CanaryTimedOut", (case, result.event)


def test_a_failing_lone_pod_still_fails_at_once() -> None:
    failing = Verdict("Fail", "GoodputBelowExpected", "goodput 0.7x", (GOODPUT_IN_DOUBT,), canary_pods=1,
                      error_rate_bound=0.004)
    result = at_timeout(failing, seconds=120)
    assert result.status.phase == "RolledBack" and result.event.reason == "CanaryFailed"


def test_the_verdict_counts_the_canary_pods_of_its_window() -> None:
    stats = window(requests=400.0)
    assert stats.pods == 1
    assert analyse(stats, window(requests=400.0), thresholds()).canary_pods == 1


def test_a_healthy_k_change_whose_only_canary_pod_drew_a_slow_gpu_is_promoted() -> None:
    """Through `canary replay`'s path (parser, windows, analysis, step machine): a canary bench trial, a K change
    that delivers +8% on a pool of 12 at 1 request/s whose pods differ by 5%. Its one canary pod at 10% read below
    the 0.99 limit until the timeout rolled it back; the 50% step's six pods a side pass it."""
    scenario = next(item for item in bench.SCENARIOS if item.name == "K +8% (pred. +10%)")
    records: list[Record] = []
    trial = bench._Trial(scenario, "default", pool=12, rate=1.0, seed=2129708783, interval=10.0)
    outcome, reason, _, _ = bench.run_trial(trial, records)
    assert (outcome, reason) == ("Promoted", "CanaryPromoted")
    replayed = replay(records, trial.spec())
    assert [step.ended for step in replayed.steps][:2] == ["Undecided", "Passed"], replayed.steps
