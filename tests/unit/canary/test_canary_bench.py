"""`bench canary` on replay: a reduced run prints its tables, is deterministic, and --check fails on a miss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specdec_operator.bench.canary import SCENARIOS, STEP_SETS, run_bench
from specdec_operator.bench.cli import bench_main

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "canary-httproute.yaml"
REDUCED = ["--trials", "1", "--steps", "default", "--pool", "2", "--rate", "3"]


def test_a_reduced_run_prints_every_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_main(["canary", *REDUCED, "--class", "A/A identical", "--class", "TPOT +20%"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "default steps 10%/120s, 50%/120s, 100%/0s (replica split" in out
    assert "A/A identical" in out and "TPOT +20%" in out
    assert "A/A calibration" in out and "rejects at 5%" in out
    assert "worst healthy class:" in out


def test_the_same_seed_gives_the_same_figures() -> None:
    scenarios = [SCENARIOS[0], SCENARIOS[6]]
    first = run_bench(1, 7, steps=("default",), scenarios=scenarios, pools=(2,), rates=(2.0,)).summary()
    again = run_bench(1, 7, steps=("default",), scenarios=scenarios, pools=(2,), rates=(2.0,)).summary()
    assert first == again


def test_a_bad_canary_is_caught_and_a_miss_fails_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_main(["canary", *REDUCED, "--class", "errors 2%", "--json", "--check"])
    report = json.loads(capsys.readouterr().out)
    [row] = report["classes"]
    assert row["scenario"] == "errors 2%" and row["rolled_back"] == 1.0
    # So little traffic that no step gathers its requests: the quiet hold ends by promoting a canary whose window
    # is clean (insufficientTraffic.action Promote), and a TPOT regression it never measured goes out: a bad
    # class misses.
    code = bench_main(["canary", "--trials", "1", "--seed", "1", "--steps", "default", "--pool", "1", "--rate",
                       "0.02", "--class", "TPOT +20%", "--json", "--check"])
    report = json.loads(capsys.readouterr().out)
    [row] = report["classes"]
    assert row["rolled_back"] == 0.0
    assert code == 1 and not report["targets_met"]


def test_unknown_classes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["canary", "--class", "nope"]) == 2
    assert "unknown --class nope" in capsys.readouterr().err


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


@pytest.mark.parametrize("pool", [8, 12, 16])
def test_a_routed_step_passes_on_the_route_its_replica_split_asks_for(pool: int) -> None:
    """10% of 8, 12 or 16 replicas is one or two pods, and the route carries their share (13%, 8%, 13%), as the
    operator writes it (`equal_load_percent`): the step passes on that, as in the operator, instead of waiting
    for 10% and timing out (the replay used to compare the route with the nominal weight, and the bench rounded
    12.5% to 12)."""
    from specdec_operator.bench.canary import _Trial, run_trial

    identical = next(scenario for scenario in SCENARIOS if scenario.name == "A/A identical")
    outcome, reason, _, _ = run_trial(_Trial(identical, "example", pool, 4.0, seed=7, interval=10.0))
    assert (outcome, reason) == ("Promoted", "CanaryPromoted")


def test_a_canary_that_fails_only_at_the_100_percent_step_is_a_bad_class_the_last_step_catches() -> None:
    from specdec_operator.bench.canary import _Trial, run_trial

    scenario = next(item for item in SCENARIOS if item.name == "errors 5% at 100%")
    assert not scenario.healthy
    outcome, reason, seconds, _ = run_trial(_Trial(scenario, "default", 2, 3.0, 11, 10.0))
    assert (outcome, reason) == ("RolledBack", "CanaryFailed/ErrorRateExceeded")
    assert seconds >= 240  # after both analysed steps' pauses: only the 100% step sees the errors


def test_the_speed_floor_pairs_only_classes_that_differ_in_speed_alone() -> None:
    from specdec_operator.bench.canary import speed_floors

    pairs = {(item.healthy, item.bad) for item in speed_floors(SCENARIOS, "default", (1, 2, 3, 4, 6, 8, 12, 16))}
    # TPOT +20% against the identical revision, goodput -10% against K changes predicted +10% (delivering 8% or
    # 10%); not the K change predicted +80% (the analysis is told another prediction), not errors or acceptance.
    assert pairs == {("A/A identical", "TPOT +20%"), ("K +8% (pred. +10%)", "goodput -10%"),
                     ("K change", "goodput -10%")}


def test_the_speed_floor_is_what_an_oracle_on_the_benchs_own_pods_misses() -> None:
    """Draw trials as the bench does (a rate and a spread per trial, each pod's speed log-normal around it, each
    class's engine step at that load), let an oracle that knows the spread and has no request noise judge the
    canary pods' mean log speed against the stable pods' halfway between the two classes: the worse of its two
    error rates is the floor, within sampling error."""
    import math
    import random

    from specdec_operator.bench.canary import (
        POD_SPEED_SDS,
        RATES,
        _canary_step_s,
        _loaded_step_s,
        _pods_seen,
        speed_floors,
    )

    pools = (1, 2, 3, 4)
    healthy = next(item for item in SCENARIOS if item.name == "K +8% (pred. +10%)")
    bad = next(item for item in SCENARIOS if item.name == "goodput -10%")
    [floor] = [item.floor for item in speed_floors(SCENARIOS, "default", pools) if item.healthy == healthy.name]
    canary_steps, _ = STEP_SETS["default"]
    rng = random.Random(5)
    trials = 40_000
    misses = [0, 0]
    for index in range(trials):
        pool, rate, spread = pools[index % len(pools)], rng.choice(RATES), rng.choice(POD_SPEED_SDS)
        speeds = [-math.log(_loaded_step_s(_canary_step_s(scenario), rate)) for scenario in (healthy, bad)]
        threshold = sum(speeds) / 2
        canary_pods, stable_pods = _pods_seen(pool, canary_steps)
        for which, speed in enumerate(speeds):
            canary = sum(speed + rng.gauss(0.0, spread) for _ in range(canary_pods)) / canary_pods
            stable = sum(rng.gauss(0.0, spread) for _ in range(stable_pods)) / stable_pods
            judged_bad = canary - stable < threshold
            misses[which] += judged_bad if which == 0 else not judged_bad
    worse = max(misses) / trials
    assert 0.001 < floor < 0.02  # one or two pods a side at these pools
    assert abs(worse - floor) < 4 * math.sqrt(floor / trials) + 0.001
    # More pods a side: the hardware averages out and the floor with it.
    [large] = [item.floor for item in speed_floors(SCENARIOS, "default", (12, 16)) if item.healthy == healthy.name]
    assert large < 1e-4


def test_the_tables_and_the_json_give_the_speed_floor(capsys: pytest.CaptureFixture[str]) -> None:
    bench_main(["canary", *REDUCED, "--class", "A/A identical", "--class", "TPOT +20%"])
    out = capsys.readouterr().out
    assert "the worse of the healthy class's rollbacks and the bad class's misses at least" in out
    assert "A/A identical / TPOT +20%" in out
    bench_main(["canary", *REDUCED, "--class", "A/A identical", "--class", "TPOT +20%", "--json"])
    report = json.loads(capsys.readouterr().out)
    [pair] = report["speed_floors"]["default"]
    assert (pair["healthy"], pair["bad"]) == ("A/A identical", "TPOT +20%") and 0 < pair["floor"] < 0.2
