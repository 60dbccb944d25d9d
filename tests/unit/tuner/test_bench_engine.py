"""`bench tuner --engine vllm`: its arguments, and the figures it prints (the run itself needs the real engine)."""

from __future__ import annotations

import pytest

from specdec_operator.bench.cli import bench_main
from specdec_operator.bench.engine import (
    Confirmed,
    EngineBenchOptions,
    EngineBenchResult,
    Measured,
    confirmation_ks,
    format_result,
)


def test_a_sweep_of_more_than_seven_ks_is_refused_before_any_engine_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["tuner", "--engine", "vllm", "--max-k", "10"]) == 2
    assert "one engine per static K" in capsys.readouterr().err


def test_without_k_flags_the_engine_bench_takes_its_own_range_not_the_simulators(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[EngineBenchOptions] = []

    def fake_run(options: EngineBenchOptions, log: object) -> EngineBenchResult:
        seen.append(options)
        return EngineBenchResult([Measured(1, 50.0, 60)], [1], 0, Measured(1, 50.0, 60), [])

    monkeypatch.setattr("specdec_operator.bench.engine.run_engine_bench", fake_run)
    assert bench_main(["tuner", "--engine", "vllm"]) == 0
    options = seen[0]
    assert (options.min_k, options.max_k, options.initial_k) == (0, 4, 1)
    assert options.static_ks == (0, 1, 2, 3, 4)
    assert EngineBenchOptions().static_ks == options.static_ks


def test_the_ratio_is_the_tuners_converged_goodput_over_the_best_static_k() -> None:
    result = EngineBenchResult(
        static=[Measured(0, 40.0, 90), Measured(1, 55.0, 80), Measured(2, 60.0, 85), Measured(3, 58.0, 88)],
        tuner_path=[1, 2], tuner_restarts=1, tuner_final=Measured(2, 57.0, 70), decisions=["Change K 1->2: ..."])
    assert result.best_static.k == 2
    assert result.ratio == pytest.approx(0.95)
    text = format_result(result, EngineBenchOptions(initial_k=1))
    assert "best static K=2: 60.0 tokens/s" in text
    assert "path 1 -> 2, 1 restart(s), converged K=2: 57.0 tokens/s" in text
    assert "ratio to the best static K: 0.950" in text
    assert result.to_json()["ratio"] == pytest.approx(0.95)


def test_the_confirmation_runs_the_converged_k_beside_the_best_other_static_ks() -> None:
    static = [Measured(0, 40.0, 90), Measured(1, 55.0, 80), Measured(2, 60.0, 85), Measured(3, 58.0, 88)]
    assert confirmation_ks(static, converged=1, count=3) == [1, 2, 3]
    assert confirmation_ks(static, converged=2, count=3) == [2, 3, 1]
    assert confirmation_ks(static, converged=2, count=1) == [2]


def test_the_confirmed_ratio_compares_medians_of_windows_taken_in_turn() -> None:
    # One window each said K=2 beats K=1 by 9%; taken in turn, K=1 is the better one by a median of 2%.
    result = EngineBenchResult(
        static=[Measured(1, 55.0, 80), Measured(2, 60.0, 85)], tuner_path=[1], tuner_restarts=0,
        tuner_final=Measured(1, 55.0, 80), decisions=[],
        confirmed=[Confirmed(1, (51.0, 50.0, 70.0, 52.0)), Confirmed(2, (50.0, 49.0, 69.0, 51.0))])
    assert result.ratio == pytest.approx(55.0 / 60.0)
    assert result.confirmed_ratio == pytest.approx(1.0)
    # The converged K the worse one by medians: 50.5 over 51.5.
    worse = EngineBenchResult(result.static, [2], 1, Measured(2, 60.0, 85), [], result.confirmed)
    assert worse.confirmed_ratio == pytest.approx(50.5 / 51.5)
    text = format_result(worse, EngineBenchOptions(initial_k=2))
    assert "confirmed ratio to the best static K: 0.981" in text
    assert "  2           50.5   49.0-69.0" in text
    assert worse.to_json()["confirmed_ratio"] == pytest.approx(50.5 / 51.5)
    # Without a confirmation (one K only) there is no confirmed ratio, and none is printed.
    alone = EngineBenchResult(result.static, [1], 0, Measured(1, 55.0, 80), [])
    assert alone.confirmed_ratio is None and "confirmed" not in format_result(alone, EngineBenchOptions())
