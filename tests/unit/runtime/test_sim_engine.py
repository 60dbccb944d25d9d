"""The engine step model: acceptance statistics, throughput optimum, clock, batch-size table."""

from __future__ import annotations

import random
import statistics

import pytest

from specdec_runtime.simulator.engine import (
    Engine,
    Speculation,
    analytic_tokens_per_second,
    batch_shares,
    expected_accepted_length,
)
from specdec_runtime.simulator.sampling import binomial
from tests.unit.runtime.simfactories import ACCEPTANCE, make_profile


@pytest.mark.parametrize(("n", "p"), [(5, 0.3), (40, 0.1), (1000, 0.8), (200_000, 0.37), (50, 0.5)])
def test_binomial_mean_and_variance_match(n: int, p: float) -> None:
    rng = random.Random(7)
    draws = [binomial(rng, n, p) for _ in range(4000)]
    mean, variance = n * p, n * p * (1 - p)
    assert all(0 <= d <= n for d in draws)
    assert abs(statistics.fmean(draws) - mean) < 5 * (variance / len(draws)) ** 0.5
    assert statistics.variance(draws) == pytest.approx(variance, rel=0.1)


def test_binomial_edge_probabilities() -> None:
    rng = random.Random(1)
    assert binomial(rng, 10, 0.0) == 0
    assert binomial(rng, 10, 1.0) == 10
    assert binomial(rng, 0, 0.5) == 0


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_per_position_counters_recover_expected_length_for_every_shorter_k(k: int, seed: int) -> None:
    profile = make_profile(concurrency=4)
    engine = Engine(profile, Speculation(k), random.Random(seed), start=0.0)
    step_s = profile.step_time.seconds(4, k)
    engine.run_until(20_000 / 4 * step_s)
    counters = engine.counters
    assert counters.drafts == pytest.approx(20_000, rel=0.06)
    assert counters.draft_tokens == counters.drafts * k
    assert counters.accepted_tokens == sum(counters.accepted_per_position)
    for shorter in range(1, k + 1):
        measured = 1 + sum(counters.accepted_per_position[:shorter]) / counters.drafts
        assert measured == pytest.approx(expected_accepted_length(ACCEPTANCE, shorter), rel=0.02)


@pytest.mark.parametrize("batch", [1, 8, 32, 128])
def test_tokens_per_second_peaks_at_the_analytic_interior_optimum(batch: int) -> None:
    profile = make_profile(concurrency=batch)
    analytic = [analytic_tokens_per_second(profile, ACCEPTANCE, batch, k) for k in range(9)]
    optimum = analytic.index(max(analytic))
    assert 0 < optimum < 8, "the profile must have an interior optimum at this batch size"
    measured = []
    for k in range(9):
        engine = Engine(profile, Speculation(k) if k else None, random.Random(k), start=0.0)
        engine.run_until(1800.0)
        measured.append(engine.counters.generation_tokens / engine.now)
    assert measured.index(max(measured)) == optimum
    assert measured[optimum] == pytest.approx(analytic[optimum], rel=0.01)


def test_no_speculation_emits_one_token_per_sequence_per_step() -> None:
    profile = make_profile(concurrency=16)
    engine = Engine(profile, None, random.Random(3), start=0.0)
    engine.run_until(100.0)
    steps = engine.counters.inter_token_latency.counts
    assert engine.counters.drafts == 0
    assert engine.counters.generation_tokens == sum(steps)
    mean_step = profile.step_time.seconds(16, 0)
    assert sum(steps) / 16 == pytest.approx(100.0 / mean_step, rel=0.01)


def test_clock_stops_at_the_last_step_that_fits_and_split_runs_agree() -> None:
    profile = make_profile(concurrency=8)
    whole = Engine(profile, Speculation(3), random.Random(5), start=0.0)
    whole.run_until(600.0)
    split = Engine(profile, Speculation(3), random.Random(5), start=0.0)
    for t in range(1, 601):
        split.run_until(float(t))
    assert 600.0 - profile.step_time.seconds(8, 3) * 1.05 <= whole.now <= 600.0
    # The step timing uses the same random stream either way; only the acceptance draws are grouped.
    assert split.counters.inter_token_latency.counts == whole.counters.inter_token_latency.counts
    assert split.counters.drafts == whole.counters.drafts
    assert split.counters.accepted_tokens == pytest.approx(whole.counters.accepted_tokens, rel=0.01)


def test_load_schedule_cycles_and_segment_acceptance_overrides() -> None:
    profile = make_profile(
        load=[
            {"duration_s": 10, "concurrency": 4},
            {"duration_s": 10, "concurrency": 0},
            {"duration_s": 10, "concurrency": 2, "acceptance": [0.0]},
        ]
    )
    assert profile.segment_at(35.0) == (profile.load[0], 40.0)
    assert profile.segment_at(55.0) == (profile.load[2], 60.0)
    engine = Engine(profile, Speculation(2), random.Random(1), start=0.0)
    engine.run_until(15.0)
    assert (engine.running, engine.now) == (0, 15.0)
    accepted_before = engine.counters.accepted_tokens
    engine.run_until(29.0)
    assert engine.running == 2
    assert engine.counters.accepted_tokens == accepted_before
    assert engine.counters.drafts > 0


def test_requests_finish_and_admit_new_prompts() -> None:
    profile = make_profile(concurrency=4, requests={"prompt_tokens": 100, "output_tokens": 50, "max_num_seqs": 3})
    engine = Engine(profile, Speculation(2), random.Random(2), start=0.0)
    engine.run_until(60.0)
    counters = engine.counters
    assert (engine.running, engine.waiting) == (3, 1)
    assert counters.finished_requests == counters.generation_tokens // 50
    assert counters.prompt_tokens == 100 * (3 + counters.finished_requests)
    assert sum(counters.time_per_output_token.counts) == counters.finished_requests
    assert 0 < engine.kv_cache_usage < 1


@pytest.mark.parametrize(
    ("batch", "k"),
    [(1, 3), (16, 3), (17, 3), (31, 3), (32, 2), (128, 2), (129, 2), (1000, 2)],
)
def test_batch_size_table_follows_vllm_lookup(batch: int, k: int) -> None:
    # vLLM fills the gap 17..31 with the previous range's K and carries the last K past the end.
    assert Speculation(4, ((1, 16, 3), (32, 128, 2))).k_for_batch(batch) == k


def test_batch_size_table_is_capped_by_k_and_can_turn_drafting_off() -> None:
    speculation = Speculation(2, ((1, 4, 5), (5, 8, 0)))
    assert [speculation.k_for_batch(b) for b in (1, 4, 5, 9)] == [2, 2, 0, 0]
    profile = make_profile(concurrency=6)
    engine = Engine(profile, speculation, random.Random(1), start=0.0)
    engine.run_until(10.0)
    assert engine.counters.drafts == 0
    assert engine.counters.generation_tokens > 0


@pytest.mark.parametrize(
    "table", [(), ((2, 8, 3),), ((1, 8, 3), (8, 16, 2)), ((1, 0, 3),), ((1, 4, -1),)]
)
def test_batch_size_table_rejects_what_vllm_rejects(table: tuple[tuple[int, int, int], ...]) -> None:
    with pytest.raises(ValueError):
        Speculation(3, table)


CODE, CHAT = [0.9], [0.55, 0.42, 0.35, 0.31, 0.28, 0.26]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_kinds_of_request_hold_batch_slots_by_the_steps_their_requests_take(k: int) -> None:
    # Half the requests are code and half chat: at K a kind holds slots in proportion to 1 / E_kind(K), so the
    # drafts are mostly chat's, and more so at a higher K.
    kinds = ((0.5, tuple(CODE)), (0.5, tuple(CHAT)))
    profile = make_profile(concurrency=8, acceptance=None,
                           request_kinds=[{"share": 0.5, "acceptance": CODE}, {"share": 0.5, "acceptance": CHAT}])
    assert profile.kinds_for(profile.load[0]) == kinds
    engine = Engine(profile, Speculation(k), random.Random(k), start=0.0)
    engine.run_until(40_000 / 8 * profile.step_time.seconds(8, k))
    counters = engine.counters
    code_share, chat_share = batch_shares(kinds, k)
    assert code_share == pytest.approx(0.5 / expected_accepted_length(CODE, k) / (
        0.5 / expected_accepted_length(CODE, k) + 0.5 / expected_accepted_length(CHAT, k)))
    for position in range(k):
        chain = [expected_accepted_length(kind, position + 1) - expected_accepted_length(kind, position)
                 for kind in (CODE, CHAT)]
        expected = code_share * chain[0] + chat_share * chain[1]
        assert counters.accepted_per_position[position] / counters.drafts == pytest.approx(expected, rel=0.03)
    # Tokens per step are the mean over slots, E_eff(K), not the chain of another K's rates.
    per_step = counters.generation_tokens / counters.drafts
    assert per_step == pytest.approx(code_share * expected_accepted_length(CODE, k)
                                     + chat_share * expected_accepted_length(CHAT, k), rel=0.02)
