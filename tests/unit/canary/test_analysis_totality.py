"""Issue 34 items 1 and 6: the analysis' work does not grow with the values a pod reports, and every
admitted threshold is one the arithmetic can use."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from specdec_operator.api.spec import CanaryAnalysis
from specdec_operator.canary.analysis import analyse, errors_exceed
from tests.unit.canary.canaryfactories import window


def test_a_1e12_error_counter_is_judged_at_once() -> None:
    started = time.process_time()
    assert errors_exceed(1e12, 2e12, 0.01)
    assert not errors_exceed(1e10, 1e12, 0.01)
    assert errors_exceed(1.0002e10, 1e12, 0.01)  # 20 standard deviations above the limit
    # Bounded work, not a timed assert: a loop per error would take days here, not a fraction of a second.
    assert time.process_time() - started < 5.0


@pytest.mark.parametrize("errors", [2001.0, 5000.0, 1e6])
def test_large_counts_agree_with_the_normal_tail(errors: float) -> None:
    # Around three standard deviations above a 1% limit, large counts are judged like small ones.
    requests = errors / 0.0103 if errors < 1e6 else 1e8
    expected = (errors - 0.01 * requests) / (0.01 * 0.99 * requests) ** 0.5 > 2.33
    assert errors_exceed(errors, requests, 0.01) is expected


def test_a_zero_goodput_ratio_is_refused_at_admission_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"min_tokens_per_second_ratio|minTokensPerSecondRatio"):
        CanaryAnalysis.model_validate({"minTokensPerSecondRatio": 0})


def test_the_analysis_is_total_even_for_a_zero_ratio_built_around_validation() -> None:
    # model_construct skips validation: the arithmetic must not raise on what admission would refuse.
    thresholds = CanaryAnalysis.model_construct(**{**CanaryAnalysis().__dict__, "min_tokens_per_second_ratio": 0.0,
                                                 "min_accepted_length_ratio": 0.0})
    verdict = analyse(window(), window(), thresholds)
    assert verdict.outcome in ("Pass", "Inconclusive", "Fail")


def test_the_whole_analysis_of_a_1e12_error_counter_is_immediate() -> None:
    from specdec_operator.canary.analysis import WindowStats

    started = time.process_time()
    canary = WindowStats(seconds=120.0, gpus=1, k=4, requests=2e12, errors=1e12)
    verdict = analyse(canary, window(), CanaryAnalysis())
    assert (verdict.outcome, verdict.reason) == ("Fail", "ErrorRateExceeded")
    assert analyse(canary, None, CanaryAnalysis()).reason == "ErrorRateExceeded"
    assert time.process_time() - started < 5.0
