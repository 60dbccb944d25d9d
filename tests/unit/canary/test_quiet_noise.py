"""A quiet model's estimate beyond its limit is a want of requests when it is too noisy to weigh.

Measured first: at 0.2 requests/s on a one-replica pool (`bench canary --pool 1 --rate 0.2`,
default steps, seed 7) 16 of 40 identical revisions were rolled back at the timeout, most on acceptance at the
second or third draft position reading 0.75-0.86 of the stable's with p=1 and a standard error of 0.07-0.14 from
about 180 requests. The noise that decides it is what more requests shrink: the spread between one pod's
intervals, not between pods (one canary pod's GPU is no want of requests)."""

from __future__ import annotations

import math
from typing import Any

from specdec_operator.canary.analysis import (
    LOG_RATIO_SCALE,
    NOISE_HOLD_Z,
    SIGNIFICANCE,
    Cell,
    Comparison,
    Verdict,
    WindowStats,
    analyse,
    detectable,
    goodput_request_noise,
    sequential_p,
)
from specdec_operator.canary.progress import judge_step
from tests.unit.canary.canaryfactories import canary_status, thresholds, tpot_spread, window
from tests.unit.canary.test_progress_steps import step


def side(speeds: dict[str, list[float]], requests_per_cell: float = 2.0) -> WindowStats:
    """One revision's window from its pods' goodput per interval (tokens per busy second), 10 s cells."""
    cells = tuple(Cell(pod=pod, seconds=10.0, generation_tokens=speed * 10.0, busy_seconds=10.0,
                       requests=requests_per_cell, start=float(index * 10))
                  for pod, values in speeds.items() for index, speed in enumerate(values))
    requests = sum(cell.requests for cell in cells)
    return WindowStats(seconds=sum(cell.seconds for cell in cells), gpus=1, k=3, cells=cells, requests=requests,
                       generation_tokens=sum(cell.generation_tokens for cell in cells),
                       busy_seconds=sum(cell.busy_seconds for cell in cells),
                       tpot_buckets=tpot_spread(0.040, int(requests)))


def test_how_pods_differ_is_no_noise_of_requests() -> None:
    """Two pods each steady at its own speed: no wait shrinks their difference, so the noise is the requests'
    floor alone. One pod whose intervals wander as much: that is noise, and it is counted."""
    steady = side({"a": [20.0] * 30, "b": [25.0] * 30}, requests_per_cell=40.0)
    wandering = side({"a": [15.0, 25.0] * 15, "b": [20.0, 30.0] * 15}, requests_per_cell=40.0)
    reference = side({"s": [22.0] * 60}, requests_per_cell=40.0)
    floor = goodput_request_noise(steady, reference)
    assert floor < 0.0004, floor  # 2,400 requests a side: the floor is about 0.3^2/2400 each
    assert goodput_request_noise(wandering, reference) > 20 * floor


def uncertain(noise: float, ratio: float = 0.8) -> Verdict:
    """One canary pod against one stable pod past the timeout: acceptance at the third draft position reads `ratio`
    of the stable's (limit 0.9), not significant, with `noise` as its standard error of one look."""
    acceptance = Comparison("acceptance at position 3", 0.25 * ratio, 0.25, 0.9, True, p_value=1.0,
                            beyond_z=(math.log(0.9) - math.log(ratio)) / noise, noise=noise, scale=LOG_RATIO_SCALE)
    return Verdict("Inconclusive", "DifferenceUncertain", acceptance.describe(), comparisons=(acceptance,),
                   canary_pods=1)


def judged(verdict: Verdict, **canary: Any) -> Verdict | None:
    return judge_step(verdict, window(requests=180.0, **canary), canary_status(), thresholds())


def test_a_quiet_estimate_too_noisy_to_weigh_holds_instead_of_rolling_back() -> None:
    noisy = judged(uncertain(0.12))
    assert noisy is not None and noisy.reason == "InsufficientTraffic", noisy
    assert "too few requests to weigh" in noisy.message
    held = step(canary_status(), noisy, 901)
    assert held.status.phase == "Progressing" and held.status.hold_reason == "InsufficientTraffic"


def test_an_estimate_whose_noise_can_weigh_it_still_times_out() -> None:
    """0.88 against a limit of 0.9 with a standard error of 0.02: the sequential test would find a regression of
    the size it looks for significant at this noise, so the reading is a suspect regression, as before."""
    weighed = judged(uncertain(0.02, ratio=0.88))
    assert weighed is not None and weighed.reason == "DifferenceUncertain"
    assert step(canary_status(), weighed, 901).status.phase == "RolledBack"
    assert judged(uncertain(0.12, ratio=0.88)).reason == "InsufficientTraffic"  # type: ignore[union-attr]


def test_the_noise_too_wide_to_weigh_is_where_the_sequential_test_loses_its_design_regression() -> None:
    """Measured (seed 7, 0.2 requests/s, one pod): a half-scale threshold (0.05) let identical revisions whose
    acceptance at the first position read 0.86-0.87 of the stable's with a standard error of 0.04-0.048 time out
    into rollbacks, though at that noise the sequential test cannot find even a regression of the size it looks
    for (p about 0.1-0.2). The threshold is now that test's own: where a shortfall of `LOG_RATIO_SCALE` beyond the
    limit becomes significant at one look."""
    for noise in (0.024, 0.026):
        reading = uncertain(noise, ratio=0.89).comparisons[0]
        significant = sequential_p(LOG_RATIO_SCALE, noise * noise, LOG_RATIO_SCALE) < SIGNIFICANCE
        assert detectable(noise, LOG_RATIO_SCALE) == significant
        assert reading.wants_requests == (not significant)
    assert detectable(0.024, LOG_RATIO_SCALE) and not detectable(0.026, LOG_RATIO_SCALE)
    assert not detectable(0.04, LOG_RATIO_SCALE)


def test_a_held_reading_still_beyond_its_limit_when_the_hold_ends_is_rolled_back() -> None:
    """The hold is for requests, not a way round the limit: a canary whose acceptance still reads beyond its limit
    after maxWaitSeconds is rolled back, clean as its window is otherwise."""
    noisy = judged(uncertain(0.12))
    result = step(canary_status(), noisy, 3600)
    assert result.status.phase == "RolledBack" and result.event.reason == "CanaryTimedOut"
    assert "acceptance at position 3 reads beyond its limit" in result.event.message


def test_an_estimate_far_beyond_its_limit_is_evidence_however_noisy() -> None:
    """Shaped on the real engine's broken drafter (CI, 2026-12-07): acceptance read 0.13 of the stable's from 9
    requests, p=1 under the sequential test. Five standard errors beyond the limit is a suspect regression; so is
    anything beyond NOISE_HOLD_Z, where one look alone would be significant at the gates' level."""
    assert math.isclose(0.5 * math.erfc(NOISE_HOLD_Z / math.sqrt(2.0)), SIGNIFICANCE, rel_tol=1e-6)
    broken = judged(uncertain(0.3, ratio=0.2))
    assert broken is not None and broken.reason == "DifferenceUncertain"
    assert not broken.comparisons[0].wants_requests
    assert step(canary_status(), broken, 901).status.phase == "RolledBack"


def test_a_noisy_window_with_a_failed_health_check_is_not_held() -> None:
    verdict = judged(uncertain(0.12), health_failures=1)
    assert verdict is not None and verdict.reason == "DifferenceUncertain"


def test_the_analysis_measures_acceptance_noise_from_the_requests_seen() -> None:
    """Through the real evidence path (one scrape interval a side, so the per-draft floor speaks): a hundred times
    the drafts, a tenth of the noise; a quiet window's few drafts leave it too wide to weigh a 10% shortfall."""
    limits = thresholds(min_requests=20, min_drafts=100)

    def noises(drafts: float) -> list[float]:
        canary = window(requests=30.0, drafts=drafts, accepted_tokens=drafts * 1.2)
        verdict = analyse(canary, window(requests=30.0, drafts=drafts), limits)
        found = [item.noise for item in verdict.comparisons if item.metric.startswith("accept")]
        assert found and all(noise is not None for noise in found), verdict.message
        return [noise for noise in found if noise is not None]

    quiet, busy = noises(150.0), noises(15000.0)
    for few, many in zip(quiet, busy, strict=True):
        assert math.isclose(few / many, 10.0, rel_tol=0.05), (few, many)
    assert not detectable(max(quiet), LOG_RATIO_SCALE) and detectable(max(busy), LOG_RATIO_SCALE)
