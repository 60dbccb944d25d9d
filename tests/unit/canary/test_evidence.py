"""Canary evidence from vLLM's metrics: TPOT, error rate and restarts reach the verdict, and a
process that takes a step over restarts the step's clock instead of timing it out."""

from __future__ import annotations

from datetime import timedelta

import pytest

from specdec_operator.api.spec import CanaryAnalysis
from specdec_operator.canary.analysis import Verdict, analyse
from specdec_operator.canary.evidence import CanaryWindows, VerdictInputs, canary_verdicts, pod_restarts
from specdec_operator.canary.progress import StepObservation, advance
from specdec_operator.tuner.samples import ScrapeResult, ScrapeTarget, parse_metrics
from specdec_operator.tuner.window import CounterWindows
from specdec_runtime.simulator.engine import Speculation
from specdec_runtime.simulator.profile import load_profile, resolve_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from tests.unit.canary.canaryfactories import INCONCLUSIVE, T0, at, canary_status, rollout, stamp, target, window
from tests.unit.canary.exposition import Scrape, feed, result
from tests.unit.canary.exposition import target as pod


def simulated_windows(stable_profile: str, canary_profile: str, seconds: float = 30.0) -> CanaryWindows:
    """Two simulated vLLM pods scraped every 2 s through the production parser and windows."""
    replicas = {
        "stable": VirtualReplica(load_profile(resolve_profile(stable_profile)), Speculation(3), model_name="m",
                                 seed=7, start_time=0.0),
        "canary": VirtualReplica(load_profile(resolve_profile(canary_profile)), Speculation(3), model_name="m",
                                 seed=8, start_time=0.0),
    }
    windows, counters = CanaryWindows(), CounterWindows()
    windows.follow(None, 0.0)
    moment = max(replica.ready_at for replica in replicas.values()) + 1
    for _ in range(int(seconds / 2) + 1):
        results = []
        for revision, replica in replicas.items():
            replica.advance_to(moment)
            scraped = ScrapeTarget(pod=revision, uid=revision, ip="127.0.0.1", port=8000, pool="p",
                                   revision=revision, k=3)
            results.append(ScrapeResult(scraped, moment, "ok", parse_metrics(replica.metrics_text())))
        feed(windows, counters, results)
        moment += 2
    return windows


def simulated_verdict(stable_profile: str, canary_profile: str, **limits: float) -> Verdict:
    # 40 s: twenty scrape intervals a side. A standard error from fewer cells takes a t test's penalty
    # (analysis.few_units_penalty), and 15 cells do not yet prove a 1.5x p90 at the gate's level.
    windows = simulated_windows(stable_profile, canary_profile, seconds=40.0)
    thresholds = CanaryAnalysis(**{"min_drafts": 200, "min_requests": 20, **limits})
    return analyse(windows.stats("canary", 3, 1), windows.stats("stable", 3, 1), thresholds)


def test_a_canary_with_1_5x_the_step_time_fails_on_tpot_alone() -> None:
    # Loose on speed, so only the latency gate can catch it.
    verdict = simulated_verdict("e2e-tpot-stable", "e2e-tpot-slow", min_tokens_per_second_ratio=0.5)
    assert (verdict.outcome, verdict.reason) == ("Fail", "TPOTExceeded"), verdict.message
    failed = [item for item in verdict.comparisons if item.failed]
    assert [item.metric for item in failed] == ["TPOT p90"]
    assert failed[0].ratio == pytest.approx(1.5, abs=0.1)
    assert verdict.message.startswith("TPOT p90 69.3 ms vs stable 43.7 ms (ratio 1.59 > 1.15, p=")


def test_a_canary_failing_5_percent_of_requests_fails_on_the_error_rate() -> None:
    windows = simulated_windows("quick", "e2e-erroring", seconds=120.0)
    canary = windows.stats("canary", 3, 1)
    assert canary.requests > 200
    assert canary.error_rate == pytest.approx(0.05, abs=0.04)
    verdict = analyse(canary, windows.stats("stable", 3, 1), CanaryAnalysis(min_drafts=200))
    assert (verdict.outcome, verdict.reason) == ("Fail", "ErrorRateExceeded")
    assert f"({canary.errors:.0f} of {canary.requests:.0f} requests) > 1.00%" in verdict.message


def test_healthy_simulated_canary_passes_every_gate() -> None:
    # Two minutes: enough clean requests that the error rate's 95% upper bound is below 1%.
    windows = simulated_windows("quick", "quick", seconds=120.0)
    thresholds = CanaryAnalysis(min_drafts=200, min_requests=20)
    verdict = analyse(windows.stats("canary", 3, 1), windows.stats("stable", 3, 1), thresholds)
    assert verdict.outcome == "Pass", verdict.message
    assert [item.metric for item in verdict.comparisons] == [
        "acceptance at position 1", "acceptance at position 2", "acceptance at position 3", "goodput per sequence",
        "TPOT p90", "TPOT p99"]


def test_the_api_servers_5xx_count_when_they_show_more_errors_than_the_engine() -> None:
    stats = window(requests=100.0, errors=0.0, http_requests=50.0, http_errors=4.0)
    assert (stats.requests, stats.errors) == (50.0, 4.0)
    assert window(requests=100.0, errors=3.0, http_requests=50.0, http_errors=1.0).error_rate == 0.03


def test_restarts_count_only_increases_seen_while_the_step_runs() -> None:
    windows, counters = CanaryWindows(), CounterWindows()
    windows.follow(None, 0.0)
    # A pod that restarted twice before the window opened, then once during it.
    feed(windows, counters, [result(pod("rev-new", restart_count=2), 10.0, Scrape())])
    feed(windows, counters, [result(pod("rev-new", restart_count=3), 12.0, Scrape())])
    feed(windows, counters, [result(pod("rev-old", restart_count=5), 12.0, Scrape())])
    assert windows.stats("rev-new", 4, 1).restarts == 1
    assert windows.stats("rev-old", 4, 1).restarts == 0


def test_a_window_opened_after_the_step_started_is_a_takeover() -> None:
    status = canary_status(step_started_at=stamp(0))
    started_here = CanaryWindows()
    started_here.follow(None, T0.timestamp() - 30)  # this process was running before the step started
    started_here.follow(status, T0.timestamp() + 5)
    assert started_here.evidence_since is None
    taken_over = CanaryWindows()
    taken_over.follow(status, T0.timestamp() + 40)  # a new process meets a step that is already running
    assert taken_over.evidence_since == stamp(40)
    verdicts = canary_verdicts(VerdictInputs(taken_over, status, CanaryAnalysis(), gpus=1, initial_k=3))
    assert verdicts["rev-new"] is not None and verdicts["rev-new"].evidence_since == stamp(40)
    # The next step is seen start by this process: no takeover any more.
    taken_over.follow(canary_status(step=1, weight=50, step_started_at=stamp(100)), T0.timestamp() + 101)
    assert taken_over.evidence_since is None


def test_a_takeover_restarts_the_steps_clock_instead_of_timing_it_out() -> None:
    plan = rollout(((10, 60), (100, 0)), timeout_seconds=90)
    current = canary_status()
    taken_over = Verdict(**{**INCONCLUSIVE.__dict__, "evidence_since": stamp(80)})
    progress = advance(current, target=target(), rollout=plan, now=at(81), action=None,
                       seen=StepObservation(taken_over, True))
    assert progress.status is not None and progress.status.evidence_since == stamp(80)
    assert progress.event is not None and progress.event.reason == "CanaryEvidenceRestarted"
    # 100 s after the step started (past its 90 s timeout), but 20 s into the new window: still running.
    still = advance(progress.status, target=target(), rollout=plan, now=at(100), action=None,
                    seen=StepObservation(INCONCLUSIVE, True))
    assert still.status is not None and still.status.phase == "Progressing" and still.event is None
    # The step ends on evidence: a Pass after the window's pause moves to the next step.
    passed = Verdict("Pass", "ThresholdsMet", "numbers")
    moved = advance(still.status, target=target(), rollout=plan, now=at(141), action=None,
                    seen=StepObservation(passed, True))
    assert moved.event is not None and moved.event.reason == "CanaryStepPassed"
    assert moved.status is not None and (moved.status.step, moved.status.evidence_since) == (1, None)
    # The pause counts from the window too: at 139 s, 59 s into the new window, the step holds.
    early = advance(still.status, target=target(), rollout=plan, now=at(139), action=None,
                    seen=StepObservation(passed, True))
    assert early.status is not None and early.status.step == 0
    # A timeout measured from the new window still ends a step that never gets its evidence (an uncertain
    # difference; a window short of requests holds as InsufficientTraffic instead, canary/progress.py).
    uncertain = Verdict("Inconclusive", "DifferenceUncertain", "numbers")
    late = advance(still.status, target=target(), rollout=plan, now=at(80) + timedelta(seconds=90), action=None,
                   seen=StepObservation(uncertain, True))
    assert late.event is not None and late.event.reason == "CanaryTimedOut"


def test_an_older_or_equal_evidence_window_changes_nothing() -> None:
    current = canary_status(evidence_since=stamp(80))
    for since in (stamp(80), stamp(50)):
        verdict = Verdict(**{**INCONCLUSIVE.__dict__, "evidence_since": since})
        progress = advance(current, target=target(), rollout=rollout(), now=at(90), action=None,
                           seen=StepObservation(verdict, True))
        assert progress.status is not None and progress.status.evidence_since == stamp(80)
        assert progress.event is None


def test_the_first_api_request_is_not_mistaken_for_a_counter_reset() -> None:
    # vLLM's http_requests_total has no series until the first API request; its appearance is growth.
    windows, counters = CanaryWindows(), CounterWindows()
    windows.follow(None, 0.0)
    first = pod("rev-new")
    feed(windows, counters, [result(first, 10.0, Scrape(drafts=10.0, draft_tokens=40.0))])
    feed(windows, counters, [result(first, 12.0, Scrape(drafts=30.0, draft_tokens=120.0, http={"5xx": 2.0}))])
    stats = windows.stats("rev-new", 4, 1)
    assert (stats.drafts, stats.requests, stats.errors) == (20.0, 2.0, 2.0)


def test_a_replica_that_leads_again_after_a_pause_takes_the_step_over() -> None:
    windows, counters = CanaryWindows(), CounterWindows()
    canary_pod = pod("rev-new")
    windows.follow(None, T0.timestamp() - 100, max_gap_s=75)
    feed(windows, counters, [result(canary_pod, T0.timestamp() - 100, Scrape())])
    # Paused (another replica led) while the step started at T0; back 200 s later.
    windows.follow(canary_status(), T0.timestamp() + 200, max_gap_s=75)
    assert windows.evidence_since == stamp(200)
    # The first scrape's increase reaches back to the old baseline, before the window: not evidence.
    feed(windows, counters, [result(canary_pod, T0.timestamp() + 200, Scrape(drafts=9000.0, draft_tokens=36000.0))])
    assert windows.stats("rev-new", 4, 1).drafts == 0
    feed(windows, counters, [result(canary_pod, T0.timestamp() + 202, Scrape(drafts=9100.0, draft_tokens=36400.0))])
    assert windows.stats("rev-new", 4, 1).drafts == 100


def test_looks_within_the_gap_keep_a_process_watching() -> None:
    windows = CanaryWindows()
    for second in range(-100, 5, 30):
        windows.follow(None, T0.timestamp() + second, max_gap_s=75)
    windows.follow(canary_status(), T0.timestamp() + 20, max_gap_s=75)
    assert windows.evidence_since is None


def crash_looping_pod(restarts: int, ready: bool = False) -> dict[str, object]:
    return {
        "metadata": {"uid": "uid-crash", "labels": {"specdec.io/revision": "rev-new"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}],
                   "containerStatuses": [{"name": "vllm", "restartCount": restarts}]},
    }


def test_restarts_of_pods_that_are_never_ready_count_too() -> None:
    windows, counters = CanaryWindows(), CounterWindows()
    windows.follow(None, 0.0)
    windows.add(counters.observe([]), [], [], pod_restarts([crash_looping_pod(4)]))
    windows.add(counters.observe([]), [], [], pod_restarts([crash_looping_pod(6), {"metadata": {"uid": "x"}}]))
    assert windows.stats("rev-new", 4, 1).restarts == 2
    verdict = analyse(windows.stats("rev-new", 4, 1), window(), CanaryAnalysis())
    assert verdict.reason == "ContainerRestarts"
    assert verdict.message.startswith("canary containers restarted 2 times; 0 canary and 400 stable requests")
