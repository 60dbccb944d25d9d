"""Acceptance estimates: exact E(K') for K' <= K, honest uncertainty beyond, refusals where counters cannot tell."""

from __future__ import annotations

import pytest

from specdec_operator.tuner.estimator import (
    FRESH_COVERAGE,
    Interval,
    estimate_acceptance,
    position_rates,
    wilson_interval,
)
from specdec_operator.tuner.window import WindowDelta
from tests.unit.tuner.factories import chain_delta

ACCEPTANCE = [0.8, 0.7, 0.6, 0.5]


def analytic_length(acceptance: list[float], k: int) -> float:
    total, survive = 1.0, 1.0
    for i in range(k):
        survive *= acceptance[min(i, len(acceptance) - 1)]
        total += survive
    return total


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [(0, 0, 0.0, 1.0), (50, 100, 0.404, 0.596), (100, 100, 0.963, 1.0), (0, 100, 0.0, 0.037), (5, 10, 0.237, 0.763)],
)
def test_wilson_interval(successes: float, trials: float, low: float, high: float) -> None:
    interval = wilson_interval(successes, trials)
    assert (interval.low, interval.high) == (pytest.approx(low, abs=1e-3), pytest.approx(high, abs=1e-3))


@pytest.mark.parametrize("k_prime", [0, 1, 2, 3, 4])
def test_lengths_up_to_the_observed_k_are_exact(k_prime: int) -> None:
    estimate = estimate_acceptance({4: chain_delta(ACCEPTANCE, 4)}, "eagle3")
    length = estimate.expected_length(k_prime)
    assert length is not None
    assert length.mean == pytest.approx(analytic_length(ACCEPTANCE, k_prime), rel=1e-9)
    assert length.high - length.low < 0.03


def test_extrapolation_carries_the_last_acceptance_with_a_widening_interval() -> None:
    estimate = estimate_acceptance({4: chain_delta(ACCEPTANCE, 4)}, "eagle3")
    at_4, at_6, at_8 = (estimate.expected_length(k) for k in (4, 6, 8))
    assert at_4 is not None and at_6 is not None and at_8 is not None
    assert at_6.mean == pytest.approx(analytic_length(ACCEPTANCE, 6))
    assert (at_4.high - at_4.low) < (at_6.high - at_6.low) < (at_8.high - at_8.low)


def test_evidence_from_several_k_is_pooled_per_position() -> None:
    estimate = estimate_acceptance(
        {2: chain_delta(ACCEPTANCE, 2, 50_000), 4: chain_delta(ACCEPTANCE, 4, 50_000)}, "eagle3"
    )
    assert estimate.observed_k == 4
    assert [c.mean for c in estimate.conditional] == pytest.approx(ACCEPTANCE)
    assert estimate.drafts == 100_000


def test_short_drafts_refuse_extrapolation_but_keep_exact_lengths() -> None:
    delta = chain_delta(ACCEPTANCE, 4)
    short = WindowDelta(**{**delta.__dict__, "draft_tokens": delta.drafts * 4 * 0.7})
    estimate = estimate_acceptance({4: short}, "ngram")
    assert estimate.short_drafts
    assert estimate.draft_share == pytest.approx(0.7)
    assert estimate.expected_length(3) is not None
    assert estimate.expected_length(5) is None


def test_block_drafters_are_opaque_only_measured_k_values_are_known() -> None:
    estimate = estimate_acceptance({4: chain_delta(ACCEPTANCE, 4)}, "dflash")
    assert estimate.opaque
    measured = estimate.expected_length(4)
    assert measured is not None and measured.mean == pytest.approx(analytic_length(ACCEPTANCE, 4))
    assert estimate.expected_length(3) is None
    assert estimate.expected_length(0) == Interval(1.0, 1.0, 1.0)


def test_without_evidence_only_k0_is_known() -> None:
    estimate = estimate_acceptance({}, "eagle3")
    assert estimate.expected_length(0) == Interval(1.0, 1.0, 1.0)
    assert estimate.expected_length(1) is None


def test_faded_deep_positions_are_extrapolated_from_fresh_shallow_ones() -> None:
    # K was 4 under an old traffic mix, and is now 2 under a new one; the old window has faded.
    old = chain_delta([0.3], 4, 100_000).scaled(FRESH_COVERAGE / 2)
    fresh = chain_delta([0.9], 2, 100_000)
    estimate = estimate_acceptance({4: old, 2: fresh}, "eagle3")
    assert estimate.observed_k == 2
    at_4 = estimate.expected_length(4)
    assert at_4 is not None and at_4.mean > analytic_length([0.9], 4) * 0.9


HORIZON_7 = [0.94] * 7 + [0.30]


@pytest.mark.parametrize("faded_to", [FRESH_COVERAGE / 2, FRESH_COVERAGE / 20])
def test_faded_deep_positions_under_the_same_traffic_keep_their_measured_rate(faded_to: float) -> None:
    # A drafter trained for 7-token horizons ran at K=9 (positions 8 and 9 accept 30%), then at K=7 under the same
    # traffic until the K=9 window faded. Extrapolating position 7's 94% would predict E(9) = 8.2 instead of 6.8
    # and send the pool back to K=9 as soon as the old window faded, every few minutes.
    old = chain_delta(HORIZON_7, 9, 100_000).scaled(faded_to)
    fresh = chain_delta(HORIZON_7, 7, 100_000)
    estimate = estimate_acceptance({9: old, 7: fresh}, "eagle3")
    assert estimate.observed_k == 7 and len(estimate.faded) == 2
    at_9 = estimate.expected_length(9)
    assert at_9 is not None
    assert at_9.mean == pytest.approx(analytic_length(HORIZON_7, 9), rel=0.02)
    assert at_9.low < analytic_length(HORIZON_7, 9) < at_9.high
    # Still unsure: wider than the same K measured fresh, and wider the further the old window faded.
    measured = estimate_acceptance({9: chain_delta(HORIZON_7, 9, 100_000)}, "eagle3").expected_length(9)
    assert measured is not None and at_9.high - at_9.low > measured.high - measured.low


def test_faded_positions_move_as_far_as_the_fresh_ones_did() -> None:
    # The traffic changed: what accepted 60% at every position now accepts 80% at the fresh ones. The faded
    # position moves by as much on the log-odds scale, between the old rate and a blind extrapolation.
    old = chain_delta([0.6], 4, 100_000).scaled(FRESH_COVERAGE / 4)
    fresh = chain_delta([0.8], 2, 100_000)
    estimate = estimate_acceptance({4: old, 2: fresh}, "eagle3")
    assert [round(p.mean, 2) for p in estimate.faded] == [pytest.approx(0.79, abs=0.02)] * 2


def test_position_rates_are_shares_of_drafts() -> None:
    assert position_rates(chain_delta([0.5], 2, 1000)) == pytest.approx([0.5, 0.25])
    assert position_rates(WindowDelta()) == []


def _mixed(kinds: list[tuple[float, list[float]]], k: int, drafts: float = 100_000.0) -> WindowDelta:
    """The counters of requests of several kinds at K, (share of requests, conditional acceptance) each: a kind
    holds drafts in proportion to its share times the steps its requests take, 1 / E_kind(K) per token."""
    weights = [share / analytic_length(acceptance, k) for share, acceptance in kinds]
    parts = [chain_delta(acceptance, k, drafts * weight / sum(weights)) for (_, acceptance), weight in
             zip(kinds, weights, strict=True)]
    return WindowDelta(
        drafts=drafts, draft_tokens=drafts * k, accepted=sum(part.accepted for part in parts),
        accepted_per_position=tuple(sum(part.accepted_per_position[i] for part in parts) for i in range(k)),
        generation_tokens=sum(part.generation_tokens for part in parts), pod_seconds=60.0,
        itl_sum=sum(part.itl_sum for part in parts), itl_count=sum(part.itl_count for part in parts))


def _tokens_per_step(kinds: list[tuple[float, list[float]]], k: int) -> float:
    """What the same requests yield per step at K: a kind's drafts re-weighted to K."""
    weights = [share / analytic_length(acceptance, k) for share, acceptance in kinds]
    return sum(w * analytic_length(a, k) for w, (_, a) in zip(weights, kinds, strict=True)) / sum(weights)


CODE_AND_CHAT = [(0.5, [0.9]), (0.5, [0.35])]


@pytest.mark.parametrize("k_prime", [1, 2, 3, 4, 7])
def test_a_mix_of_requests_is_re_weighted_to_the_k_it_would_run(k_prime: int) -> None:
    # Read at K 5, the chain of the rates puts E(1) 6% low and E(7) 5% high: chat requests hold most drafts at
    # K 5, and fewer at a lower K. The tuner would keep too high a K.
    read = _mixed(CODE_AND_CHAT, 5)
    truth = _tokens_per_step(CODE_AND_CHAT, k_prime)
    chain = 1 + sum(position_rates(read)[:k_prime]) if k_prime <= 5 else None
    if chain is not None:
        assert abs(chain / truth - 1) > 0.02, "the chain alone is off: the correction is what this test checks"
    length = estimate_acceptance({5: read}, "eagle3").expected_length(k_prime)
    assert length is not None
    assert length.mean == pytest.approx(truth, rel=0.01)
    assert length.low <= truth <= length.high


def test_acceptance_that_falls_within_every_request_gets_no_correction() -> None:
    estimate = estimate_acceptance({4: chain_delta(ACCEPTANCE, 4)}, "eagle3")
    assert len(estimate.mix) == 1
    length = estimate.expected_length(2)
    assert length is not None
    assert length.mean == analytic_length(ACCEPTANCE, 2)


@pytest.mark.parametrize("chat", [[0.55, 0.42, 0.35, 0.31, 0.28, 0.26], [0.45, 0.40, 0.37, 0.35, 0.33]])
def test_a_mix_masked_by_falling_acceptance_is_corrected_too_little_never_too_much(chat: list[float]) -> None:
    # Each chat request's acceptance also falls with depth: from one K's rates that is indistinguishable from a
    # narrower mix, so what the estimator re-weights is a lower bound of the effect, on the right side.
    kinds = [(0.5, [0.94, 0.93, 0.92, 0.91, 0.90]), (0.5, chat)]
    read = _mixed(kinds, 5)
    estimate = estimate_acceptance({5: read}, "eagle3")
    for k_prime in (1, 2, 3):
        chain = 1 + sum(position_rates(read)[:k_prime])
        length = estimate.expected_length(k_prime)
        assert length is not None
        assert chain <= length.mean <= _tokens_per_step(kinds, k_prime) * (1 + 1e-9)
