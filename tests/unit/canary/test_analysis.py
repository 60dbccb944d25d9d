"""Canary analysis: verdicts, their reasons and the numbers in their messages."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec_operator.canary.analysis import WindowStats, analyse, errors_exceed
from specdec_operator.canary.histogram import quantile_of
from tests.unit.canary.canaryfactories import buckets, thresholds, tpot_spread, window

INF = math.inf


@pytest.mark.parametrize(
    ("quantile", "histogram", "expected"),
    [
        (0.5, [(0.1, 10), (0.2, 20), (INF, 20)], 0.1),  # exact at a bound
        # Between two bounds with no neighbour to shape it: evenly over log(bound), 0.1 * 2 ** 0.5.
        (0.75, [(0.1, 10), (0.2, 20), (INF, 20)], 0.1 * 2 ** 0.5),
        (0.25, [(0.1, 10), (0.2, 20), (INF, 20)], 0.05),  # below the first bound: linear from 0
        (0.9, [(0.1, 0), (0.2, 10), (INF, 10)], 0.1 * 2 ** 0.9),
        # Everything above the highest finite bound: that bound is all a histogram can say.
        (0.9, [(0.1, 0), (0.2, 0), (INF, 5)], 0.2),
        # Unsorted input and a count that dips between buckets (a scrape race) are tolerated.
        (0.5, [(INF, 10), (0.1, 10), (0.2, 9)], 0.05),
        (0.5, [(0.1, 0), (INF, 0)], None),
        (0.5, [(0.1, 5), (0.2, 10)], None),
        (0.5, [(INF, 10)], None),
        (0.5, [], None),
    ],
)
def test_quantile_of(quantile: float, histogram: list[tuple[float, float]], expected: float | None) -> None:
    result = quantile_of(quantile, histogram)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


@pytest.mark.parametrize("quantile", [0.0, 1.0, -0.1, 1.5])
def test_histogram_quantile_rejects_quantiles_outside_the_open_interval(quantile: float) -> None:
    with pytest.raises(ValueError, match="quantile"):
        quantile_of(quantile, [(0.1, 1), (INF, 1)])


@given(
    observations=st.lists(st.floats(min_value=0.001, max_value=100.0), min_size=1, max_size=200),
    low=st.floats(min_value=0.01, max_value=0.98),
    gap=st.floats(min_value=0.001, max_value=0.5),
)
def test_histogram_quantile_is_monotone_and_bounded(observations: list[float], low: float, gap: float) -> None:
    histogram = buckets(observations)
    high = min(low + gap, 0.99)
    lower, upper = quantile_of(low, histogram), quantile_of(high, histogram)
    assert lower is not None and upper is not None
    assert 0 <= lower <= upper <= 80.0


def test_window_stats_derived_figures() -> None:
    stats = window()
    assert stats.mean_accepted_length == pytest.approx(2.7)
    assert stats.acceptance_rate == pytest.approx(0.425)
    assert stats.tokens_per_second_per_gpu == pytest.approx(22.5)
    assert stats.error_rate == 0.0
    assert stats.decode_steps == 1000.0
    assert window(k=0, drafts=0.0, generation_tokens=1800.0).decode_steps == 1800.0
    assert window(k=0).mean_accepted_length is None
    assert window(gpus=0).tokens_per_second_per_gpu is None
    assert window(requests=0.0).error_rate is None


@pytest.mark.parametrize("field", ["drafts", "accepted_tokens", "seconds", "restarts", "errors"])
def test_window_stats_reject_negative_increases(field: str) -> None:
    # The dataclass's own guard: the counter windows never hand on a decrease (a reset).
    with pytest.raises(ValueError, match=field):
        WindowStats(**{"seconds": 120.0, "gpus": 1, "k": 4, field: -1})


def test_window_stats_reject_negative_bucket_counts() -> None:
    with pytest.raises(ValueError, match="tpot_buckets"):
        WindowStats(seconds=120.0, gpus=1, k=4, tpot_buckets=((0.1, -1.0), (INF, 0.0)))


LOW_ACCEPTANCE = {"accepted_tokens": 420.0, "generation_tokens": 1420.0}

CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], str, str, list[str]]] = [
    (
        "identical",
        {},
        {},
        {},
        "Pass",
        "ThresholdsMet",
        [
            "acceptance at position 1 0.42 vs stable 0.42 (ratio 1.00 >= 0.90",
            "goodput per sequence 2.8 tok/s vs stable 2.8 tok/s (ratio 1.00 >= 0.90",
            "TPOT p90 ",
            "accepted length 2.70 vs stable 2.70",
            "TPOT p50 ",
            "batch 8.0 vs 8.0 running requests per pod",
            "tokens/s per GPU 22.5 vs 22.5 (follows load; not gated)",
            "400 canary and 400 stable requests over 120 pod-s; load 3.33 vs 3.33 requests/s per pod",
        ],
    ),
    (
        "low-acceptance",
        LOW_ACCEPTANCE,
        {},
        {},
        "Fail",
        "AcceptanceDropped",
        [
            "acceptance at position 1 0.10 vs stable 0.42 (ratio 0.25 < 0.90, p=",
            "goodput per sequence 1.5 tok/s vs stable 2.8 tok/s (ratio 0.53 < 0.90, p=",
        ],
    ),
    (
        "slower-same-acceptance",
        {"generation_tokens": 2000.0, "seconds": 120.0, "gpus": 1, "accepted_tokens": 1700.0},
        {},
        {},
        "Fail",
        "GoodputBelowExpected",
        ["goodput per sequence 2.1 tok/s vs stable 2.8 tok/s (ratio 0.74 < 0.90, p=",
         "accepted length 2.70 vs stable 2.70"],
    ),
    (
        "tpot-regression",
        {"tpot_buckets": tpot_spread(0.090)},
        {},
        {},
        "Fail",
        "TPOTExceeded",
        ["TPOT p90 ", "> 1.15, p="],
    ),
    (
        "per-gpu-normalised",
        {"gpus": 2, "generation_tokens": 5400.0},
        {},
        {},
        "Pass",
        "ThresholdsMet",
        ["tokens/s per GPU 22.5 vs 22.5", "goodput per sequence 5.6 tok/s vs stable 2.8 tok/s"],
    ),
    (
        "health-fails-with-no-samples",
        {"drafts": 3.0, "health_failures": 4},
        {},
        {},
        "Fail",
        "HealthCheckFailed",
        ["canary /health failed 4 times"],
    ),
    (
        "restarts",
        {"restarts": 2},
        {},
        {},
        "Fail",
        "ContainerRestarts",
        ["canary containers restarted 2 times"],
    ),
    (
        "errors",
        {"errors": 20.0},
        {},
        {},
        "Fail",
        "ErrorRateExceeded",
        ["canary error rate 5.00% (20 of 400 requests) > 1.00% (p="],
    ),
    (
        "errors-above-the-limit-by-chance-hold-the-step",
        {"errors": 12.0},
        {},
        {},
        "Inconclusive",
        "ErrorRateUncertain",
        ["canary error rate 3.00% (12 of 400), 95% upper bound 4.75% not below 1.00% yet"],
    ),
    (
        "one-error-in-one-request-proves-nothing-yet",
        {"errors": 1.0, "requests": 1.0},
        {},
        {},
        "Inconclusive",
        "InsufficientSamples",
        ["1 canary and 400 stable requests over 120 pod-s", "need 100 finished requests each"],
    ),
    (
        "errors-above-the-limit-with-enough-requests-hold-the-step",
        {"errors": 8.0},
        {},
        {},
        "Inconclusive",
        "ErrorRateUncertain",
        ["2.00% (8 of 400)"],
    ),
    (
        "with-no-errors-tolerated-one-is-enough",
        {"errors": 1.0, "requests": 1.0, "drafts": 1.0},
        {},
        {"max_error_rate": 0.0},
        "Fail",
        "ErrorRateExceeded",
        ["100.00% (1 of 1 requests) > 0.00%"],
    ),
    (
        "errors-within-budget",
        {"errors": 1.0, "requests": 600.0, "tpot_buckets": tpot_spread(0.040, 600)},
        {"requests": 600.0, "tpot_buckets": tpot_spread(0.040, 600)},
        {},
        "Pass",
        "ThresholdsMet",
        [],
    ),
    (
        "all-failures-listed",
        {"health_failures": 1, "restarts": 1, "errors": 50.0},
        {},
        {},
        "Fail",
        "HealthCheckFailed",
        ["/health failed 1 times", "restarted 1 times", "error rate 12.50%"],
    ),
    (
        "too-few-canary-drafts",
        {"drafts": 400.0},
        {},
        {},
        "Inconclusive",
        "MissingMeasurements",
        ["400 drafts on the smaller side; acceptance needs 500 each"],
    ),
    (
        "too-few-stable-drafts",
        {},
        {"drafts": 10.0},
        {},
        "Inconclusive",
        "MissingMeasurements",
        ["10 drafts on the smaller side"],
    ),
    (
        "min-drafts-zero-still-needs-some",
        {"drafts": 0.0},
        {},
        {"min_drafts": 0},
        "Inconclusive",
        "MissingMeasurements",
        ["no acceptance measured at draft position 1"],
    ),
    (
        "no-completed-requests-on-canary",
        {"tpot_buckets": ()},
        {},
        {},
        "Inconclusive",
        "MissingMeasurements",
        ["no TPOT p90 measured on the canary"],
    ),
    (
        "stable-served-nothing",
        {},
        {"generation_tokens": 0.0, "tpot_buckets": ()},
        {"min_drafts": 0},
        "Inconclusive",
        "MissingMeasurements",
        ["no goodput per sequence measured on the stable revision", "no TPOT p90 measured on the stable revision"],
    ),
    (
        "speculation-off-on-stable-compares-speed-only",
        {},
        {"k": 0, "drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "generation_tokens": 1500.0},
        {},
        "Pass",
        "ThresholdsMet",
        [
            "goodput per sequence 2.8 tok/s vs stable 1.6 tok/s (ratio 1.80 >= 0.90",
            "K 4 vs 0",
            "400 canary and 400 stable requests",
        ],
    ),
    (
        "speculation-off-on-canary-slower",
        {"k": 0, "drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "generation_tokens": 1500.0},
        {},
        {},
        "Fail",
        "GoodputBelowExpected",
        ["goodput per sequence 1.6 tok/s vs stable 2.8 tok/s (ratio 0.56 < 0.90, p="],
    ),
    (
        "looser-thresholds",
        LOW_ACCEPTANCE,
        {},
        {"min_accepted_length_ratio": 0.2, "min_tokens_per_second_ratio": 0.5},
        "Pass",
        "ThresholdsMet",
        ["acceptance at position 1 0.10 vs stable 0.42 (ratio 0.25 >= 0.20", "(ratio 0.53 >= 0.50"],
    ),
]


@pytest.mark.parametrize(
    ("canary", "stable", "limits", "outcome", "reason", "fragments"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_analyse(
    canary: dict[str, Any],
    stable: dict[str, Any],
    limits: dict[str, Any],
    outcome: str,
    reason: str,
    fragments: list[str],
) -> None:
    verdict = analyse(window(**canary), window(**stable), thresholds(**limits))
    assert (verdict.outcome, verdict.reason) == (outcome, reason), verdict.message
    for fragment in fragments:
        assert fragment in verdict.message


def test_failed_checks_lead_the_message() -> None:
    verdict = analyse(window(tpot_buckets=tpot_spread(0.090)), window(), thresholds())
    assert verdict.message.startswith("TPOT p90 ")
    assert [item.metric for item in verdict.comparisons] == [
        *(f"acceptance at position {i}" for i in range(1, 5)), "goodput per sequence", "TPOT p90", "TPOT p99"]
    assert [item.failed for item in verdict.comparisons][:6] == [False] * 5 + [True]


def test_tpot_figures_match_quantile_of() -> None:
    canary, stable = window(tpot_buckets=tpot_spread(0.090)), window()
    verdict = analyse(canary, stable, thresholds())
    p90 = next(item for item in verdict.comparisons if item.metric == "TPOT p90")
    assert p90.canary == pytest.approx(1000 * quantile_of(0.9, canary.tpot_buckets))  # type: ignore[operator]
    assert p90.stable == pytest.approx(1000 * quantile_of(0.9, stable.tpot_buckets))  # type: ignore[operator]
    expected = f"TPOT p90 {p90.canary:.1f} ms vs stable {p90.stable:.1f} ms (ratio {p90.ratio:.2f} > 1.15, p="
    assert expected in verdict.message


@given(
    accepted=st.floats(min_value=0, max_value=4000),
    tokens=st.floats(min_value=1, max_value=10_000),
    health_failures=st.integers(min_value=0, max_value=3),
)
def test_verdict_is_consistent_with_its_comparisons(accepted: float, tokens: float, health_failures: int) -> None:
    canary = window(accepted_tokens=accepted, generation_tokens=tokens, health_failures=health_failures)
    verdict = analyse(canary, window(), thresholds())
    if health_failures:
        assert verdict.outcome == "Fail" and not verdict.comparisons
    else:
        # A Fail needs a comparison beyond its limit and significant; a Pass needs every one within.
        if any(item.failed for item in verdict.comparisons):
            assert verdict.outcome == "Fail"
        elif verdict.outcome == "Pass":
            assert all(item.passed for item in verdict.comparisons)
        else:
            assert verdict.outcome == "Inconclusive"
            assert any(item.uncertain for item in verdict.comparisons) or verdict.reason == "MissingMeasurements"


def test_window_stats_is_frozen() -> None:
    stats: Any = window()
    with pytest.raises(AttributeError):
        stats.drafts = 1.0
    assert isinstance(stats, WindowStats)


@pytest.mark.parametrize(
    ("errors", "requests", "limit", "exceeded"),
    [
        (5, 100, 0.01, True),  # P(X >= 5 | 100, 1%) = 0.0034
        (3, 100, 0.01, False),  # 0.079: a 1% canary shows this one time in thirteen
        (1, 20, 0.01, False),
        (130, 10_000, 0.01, True),  # three standard deviations above the limit
        (110, 10_000, 0.01, False),
        (1, 1, 0.0, True),
        (0, 50, 0.0, False),
        (5, 5, 1.0, False),
        (600, 1_000_000, 0.0005, True),
    ],
)
def test_errors_exceed_is_a_one_sided_binomial_test(errors: int, requests: int, limit: float, exceeded: bool) -> None:
    assert errors_exceed(errors, requests, limit) is exceeded


def test_a_tail_beyond_its_limit_gets_no_benefit_of_the_doubt() -> None:
    """A p99 rests on a handful of requests: 3% of requests stalled 5x read 2.05-2.2x against a limit of 2, within
    the noise of one look, and passed as noise (the bench's promoted "p99 x3" canaries). A p90 beyond its limit by
    as little still passes: its estimate rests on a tenth of the requests."""
    from specdec_operator.canary.analysis import Comparison

    p90 = Comparison("TPOT p90", 47.0, 40.0, 1.15, False, " ms", 1, 1.0, None, 0.5)
    p99 = Comparison("TPOT p99", 86.0, 40.0, 2.0, False, " ms", 1, 1.0, 0.004, 0.5)
    assert p90.passed and not p90.uncertain
    assert not p99.passed and p99.uncertain and not p99.failed
    within = Comparison("TPOT p99", 78.0, 40.0, 2.0, False, " ms", 1, 1.0, 0.004, -0.3)
    assert within.passed
    unknown = Comparison("TPOT p99", 78.0, 40.0, 2.0, False, " ms", 1, 1.0, 0.02, -0.3)
    assert not unknown.passed  # within its limit, but not yet known


def test_a_comparison_of_rates_below_its_decimals_shows_them_to_two_significant_digits() -> None:
    """A drafter whose later positions are all but never accepted: at two decimals the message read "0.00 vs stable
    0.00 (ratio 4.69", which says nothing of what the ratio compares. Figures that round to zero and are not show
    two significant digits; zero and figures as large as their decimals are unchanged."""
    from specdec_operator.canary.analysis import Comparison

    tiny = Comparison("acceptance at position 2", 0.0023, 0.00049, 0.9, True)
    assert tiny.describe().startswith("acceptance at position 2 0.0023 vs stable 0.00049 (ratio 4.69 >= 0.90")
    usual = Comparison("acceptance at position 1", 0.0, 0.16, 0.9, True, p_value=1e-9)
    assert usual.describe().startswith("acceptance at position 1 0.00 vs stable 0.16 (ratio 0.00 < 0.90, p=1e-09")
    tpot = Comparison("TPOT p90", 9.3, 12.1, 1.15, False, " ms", 1)
    assert tpot.describe().startswith("TPOT p90 9.3 ms vs stable 12.1 ms (ratio 0.77 <= 1.15")
