"""`bench tuner --engine vllm`: its arguments, and the figures it prints (the run itself needs the real engine)."""

from __future__ import annotations

import pytest

from specdec_operator.bench.cli import bench_main
from specdec_operator.bench.engine import EngineBenchOptions, EngineBenchResult, Measured, format_result


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
