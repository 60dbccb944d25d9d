"""`bench canary` in --check mode over a reduced number of trials: the real analysis and step machine meet
the targets on every scenario, the table has its figures, and the example's steps are the shipped ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specdec_operator.bench.canary import STEP_SETS, run_bench, summarise
from specdec_operator.bench.cli import bench_main

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "canary-httproute.yaml"


def test_check_mode_meets_the_targets_on_a_reduced_run(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_main(["canary", "--check", "--trials", "3", "--pool", "1", "--pool", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "false rollbacks 0.00% of 12 healthy canaries" in out
    assert "detection 100.00% of 36 bad ones" in out
    assert "median time to a verdict on the default steps" in out and "step pauses 120 s + 120 s + 0 s" in out


def test_the_same_seed_gives_the_same_figures() -> None:
    first = [cell.to_json() for cell in run_bench(2, 7, 1.0, 10.0, pools=(2,))]
    again = [cell.to_json() for cell in run_bench(2, 7, 1.0, 10.0, pools=(2,))]
    assert first == again


def test_a_miss_fails_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    # So little traffic that no step can gather minRequests before its timeout: every canary times out,
    # the healthy ones too, and --check says so.
    code = bench_main(["canary", "--check", "--trials", "1", "--pool", "1", "--rate", "0.01", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["summary"]["false_rollback_rate"] == 1.0 and not report["summary"]["targets_met"]


def test_the_summary_counts_healthy_and_bad_canaries_apart() -> None:
    summary = summarise(run_bench(1, 1, 1.0, 10.0, pools=(2,)))
    assert (summary["healthy"], summary["bad"]) == (2, 6)


def test_the_example_steps_are_the_shipped_examples() -> None:
    documents = list(yaml.safe_load_all(EXAMPLE.read_text()))
    [model] = [doc for doc in documents if doc["kind"] == "SpeculativeModel"]
    shipped = model["spec"]["rollout"]["canary"]
    canary, routed = STEP_SETS["example"]
    assert routed and "httpRouteRef" in shipped["traffic"]
    assert [(s.weight, s.pause_seconds) for s in canary.steps] == [
        (s["weight"], s.get("pauseSeconds", 60)) for s in shipped["steps"]]
    assert canary.analysis.timeout_seconds == shipped["analysis"]["timeoutSeconds"]
    assert canary.analysis.min_drafts == shipped["analysis"]["minDrafts"]
