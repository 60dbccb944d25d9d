"""`specdec-operator canary replay`: recordings through the operator's parser, windows, analysis and step machine."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
import re
from pathlib import Path

import pytest
import yaml

from specdec_operator.bench.canary import SCENARIOS, _Trial, run_trial
from specdec_operator.canary.replay import (
    Record,
    RecordingError,
    Replayer,
    ReplaySpec,
    format_result,
    load_spec,
    parse_recording,
    replay,
    rounds,
    scrape_period,
)
from specdec_operator.cli import main

DATA = Path(__file__).parent / "data"
HEALTHY = DATA / "healthy-canary.jsonl"
ERRORING = DATA / "erroring-canary.jsonl"


def test_a_recorded_healthy_canary_is_promoted_step_by_step() -> None:
    header, records = parse_recording(HEALTHY.read_text())
    spec = load_spec(header)
    assert [(step.weight, step.pause_seconds) for step in spec.canary.steps] == [(10, 30), (50, 30), (100, 0)]
    assert (spec.stable_k, spec.canary_k, spec.predicted_gain) == (3, 4, 0.1)
    result = replay(records, spec)
    assert (result.outcome, result.reason) == ("Promoted", "CanaryPromoted")
    assert [step.ended for step in result.steps] == ["Passed", "Passed", "Promoted"]
    first = result.steps[0].verdict
    assert first is not None and first.outcome == "Pass"
    assert first.canary_load is not None and first.stable_load is not None
    assert "goodput per sequence (tuner predicted 1.10x)" in first.message


def test_a_recorded_erroring_canary_rolls_back_citing_the_error_rate() -> None:
    header, records = parse_recording(ERRORING.read_text())
    result = replay(records, load_spec(header))
    assert (result.outcome, result.reason) == ("RolledBack", "CanaryFailed/ErrorRateExceeded")
    assert "canary error rate" in result.message


def test_the_cli_prints_each_step_and_the_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["canary", "replay", str(HEALTHY)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 1/3 (10%) Passed after ")
    assert "per-pod load " in out and "step 2/3 (50%) Passed" in out
    assert out.splitlines()[-1].startswith("outcome: Promoted (CanaryPromoted) after ")


def test_a_spec_file_overrides_the_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Far more requests than the recording holds: the replay says what it waits for.
    spec = tmp_path / "spec.yaml"
    spec.write_text("canary:\n  steps: [{weight: 10, pauseSeconds: 30}, {weight: 100, pauseSeconds: 0}]\n"
                    "  analysis: {minRequests: 5000, timeoutSeconds: 3600}\n")
    assert main(["canary", "replay", str(HEALTHY), "--spec", str(spec)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 1/2 (10%) Unfinished after ")
    assert "need 5000 finished requests each" in out
    assert "outcome: Unfinished (InsufficientTraffic)" in out  # its few errors are within the limit: it holds


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ({"t": 1.0, "pod": "p", "role": "shadow"}, "line 1: role must be one of stable, canary, baseline"),
        ({"t": 1.0, "pod": "", "role": "canary"}, "line 1: pod must be a non-empty string"),
        ({"t": "yesterday", "pod": "p", "role": "canary"}, "line 1: t 'yesterday' is not an RFC 3339 time"),
        ({"t": 1.0, "pod": "p", "role": "canary", "weight": 150}, "line 1: weight must be a percent 0..100"),
        ({"t": 1.0, "pod": "p", "role": "canary", "weight": "10"}, "line 1: weight must be a percent 0..100"),
        ({"t": 1.0, "pod": "p", "role": "canary", "metrics": 3}, "line 1: metrics must be the /metrics text"),
    ],
)
def test_bad_records_are_refused_naming_the_line_and_field(line: dict[str, object], fragment: str) -> None:
    with pytest.raises(RecordingError, match=fragment.replace("(", r"\(")):
        parse_recording(json.dumps(line) + "\n")


def test_the_cli_refuses_a_bad_recording_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("canary: {steps: [{weight: 200}]}\n{\"t\": 1, \"pod\": \"p\", \"role\": \"canary\"}\n")
    assert main(["canary", "replay", str(bad)]) == 2
    assert "error: spec.rollout.canary" in capsys.readouterr().err


def test_rfc3339_stamps_and_a_missing_scrape_are_read() -> None:
    text = ('{"t": "2026-12-03T06:00:00Z", "pod": "c", "role": "canary", "metrics": null}\n'
            '{"t": "2026-12-03T06:00:00Z", "pod": "s", "role": "stable", "metrics": "garbage"}\n')
    _, records = parse_recording(text)
    assert records[0].at == records[1].at and records[0].metrics is None
    result = replay(records, ReplaySpec())
    assert result.outcome == "Unfinished"
    assert "Unfinished" in format_result(result, ReplaySpec())


def test_the_header_may_give_the_pools_replicas() -> None:
    assert load_spec({"replicas": 12}).replicas == 12
    assert load_spec({}).replicas is None
    with pytest.raises(RecordingError, match="replicas must be a number"):
        load_spec({"replicas": "twelve"})


EXAMPLES = Path(__file__).parents[3] / "examples"


def _example_model() -> dict[str, object]:
    documents = yaml.safe_load_all((EXAMPLES / "canary-httproute.yaml").read_text())
    return next(document for document in documents if document["kind"] == "SpeculativeModel")


def test_a_whole_speculativemodel_gives_the_pool_its_replicas_and_gpus() -> None:
    """`--spec` may be the SpeculativeModel as applied: its pool (the first gfx target), the pool's replicas and
    its GPUs per pod are read as the operator reads them, a pool's own entry first."""
    model = _example_model()
    spec = load_spec(model)
    assert (spec.pool, spec.replicas, spec.gpus_per_pod) == ("gfx942", 2, 1)
    assert [step.weight for step in spec.canary.steps] == [10, 50, 100]
    assert spec.decision() is None
    placement = model["spec"]["placement"]  # type: ignore[index]
    placement["gfxTargets"] = ["mi300x", "gfx90a"]
    placement["pools"] = [{"gfxTarget": "mi300x", "tensorParallelSize": 2, "replicas": 6}]
    assert (load_spec(model).pool, load_spec(model).replicas, load_spec(model).gpus_per_pod) == ("gfx942", 6, 2)
    # The header's own keys come first.
    assert load_spec({**model, "pool": "gfx90a", "replicas": 3}).replicas == 3


def test_a_speculativemodel_with_its_status_gives_the_k_change_under_test() -> None:
    """As `kubectl get -o yaml` prints it during a tuner's canary: the canary's pool, and the decision under test
    from status (its K the canary's); a decision the canary does not run (a spec change's canary) gives none."""
    model = _example_model()
    decision = {"id": "d1", "time": "2026-12-08T00:00:00Z", "pool": "gfx942", "fromK": 3, "toK": 5,
                "action": "Change", "reason": "better", "predictedGain": 0.12, "confidence": 0.9}
    pool = "llama8b-canaried-gfx942"  # status names a pool <model>-<gfx>
    decision["pool"] = pool
    dumped = {**model, "status": {"canary": {"pool": pool, "canaryK": 5},
                                  "speculation": {"lastDecision": decision}}}
    spec = load_spec(dumped)
    assert (spec.pool, spec.stable_k, spec.canary_k, spec.predicted_gain) == (pool, 3, 5, 0.12)
    assert (spec.replicas, spec.gpus_per_pod) == (2, 1)  # the gfx942 pool's
    other = {**model, "status": {"canary": {"pool": pool}, "speculation": {"lastDecision": decision}}}
    assert load_spec(other).decision() is None
    assert load_spec(other).replicas == 2
    # status.pools says which gfx target a pool name stands for, whatever the name reads.
    listed = {**model, "status": {"canary": {"pool": "odd-pool"},
                                  "pools": [{"name": "odd-pool", "gfxTarget": "gfx942"}]}}
    assert load_spec(listed).replicas == 2


def test_the_e2e_recording_replays_alike_with_the_manifest_as_its_spec(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The kept e2e recording (2 replicas of gfx942) with `--spec` the SpeculativeModel it ran, in place of the
    header the test wrote: the same steps, the same outcome."""
    text = gzip.decompress(E2E_LATE.read_bytes()).decode()
    header, records = parse_recording(text)
    assert header is not None
    model = {"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": "late"},
             "spec": {"model": {"name": "org/target"},
                      "placement": {"gfxTargets": [header["pool"]], "replicasPerPool": header["replicas"]},
                      "rollout": {"strategy": "Canary", "canary": header["canary"]}}}
    manifest = tmp_path / "model.yaml"
    manifest.write_text(yaml.safe_dump(model))
    from_header = replay(records, load_spec(header))
    assert main(["canary", "replay", str(E2E_LATE), "--spec", str(manifest)]) == 0
    out = capsys.readouterr().out
    assert out == format_result(from_header, load_spec(header)), out
    assert load_spec(model).replicas == header["replicas"]


def _jittered(records: list[Record], seed: int) -> list[Record]:
    """A recording as a recorder beside the cluster writes it: each pod stamped when its own scrape answered (up to
    0.9 s apart within a 10 s round), and the lines exported pod by pod, not round by round (Prometheus spreads its
    pods over the whole period: `_prometheus_offsets`)."""
    rng = random.Random(seed)
    moved = [dataclasses.replace(record, at=record.at + rng.uniform(0.0, 0.9)) for record in records]
    return sorted(moved, key=lambda record: (record.pod, record.at))


@pytest.mark.parametrize("path", [HEALTHY, ERRORING], ids=["healthy", "erroring"])
def test_pods_stamped_at_their_own_scrape_and_exported_pod_by_pod_replay_as_the_rounds_they_were(path: Path) -> None:
    header, exact = parse_recording(path.read_text())
    expected = replay(exact, load_spec(header))
    result = replay(_jittered(exact, 1), load_spec(header))
    assert (result.outcome, result.reason) == (expected.outcome, expected.reason)
    assert [step.ended for step in result.steps] == [step.ended for step in expected.steps]


def _prometheus_offsets(records: list[Record], period: float) -> list[Record]:
    """A recording as a Prometheus export gives it: Prometheus scrapes each target at an offset of its own, a hash of
    the target modulo the scrape interval (scrape/target.go, `Target.offset`), so the pods' stamps spread over the
    whole period, each pod at the same phase every period. Here the pods' phases are spread evenly (the golden
    ratio's multiples modulo 1), and the lines exported pod by pod."""
    pods = sorted({record.pod for record in records})
    phase = {pod: (index * 0.618033988749895 % 1.0) * period for index, pod in enumerate(pods)}
    moved = [dataclasses.replace(record, at=record.at + phase[record.pod]) for record in records]
    return sorted(moved, key=lambda record: (record.pod, record.at))


def test_pods_scraped_at_phases_spread_over_the_period_replay_as_the_operator_saw_them() -> None:
    """A round of such an export holds the pods whose phases fall together, not every pod. Read from the round
    alone, the 10% step's two canary pods of a 12-replica pool were seldom in one round, so the step read as
    "canary pods not ready" and timed out (this trial rolled back at 1205 s), and rounds without a stable line were
    judged without a baseline. The pods are each one's latest line, as the operator's cache holds them: the K
    change is promoted step by step, compared with its stable throughout, as the operator promoted it."""
    trial = _Trial(next(s for s in SCENARIOS if s.name == "K change"), "example", pool=12, rate=1.0, seed=7,
                   interval=10.0)
    recorded: list[Record] = []
    outcome, _, _, _ = run_trial(trial, recorded)
    assert outcome == "Promoted"
    exported = _prometheus_offsets(recorded, 10.0)
    assert max(len(batch) for batch in rounds(exported)) < len({record.pod for record in exported})
    result = replay(exported, trial.spec())
    assert (result.outcome, result.reason) == ("Promoted", "CanaryPromoted"), format_result(result, trial.spec())
    assert [step.ended for step in result.steps] == ["Passed", "Passed", "Promoted"]
    assert not any("without a Ready stable pod" in note for note in result.notes)


@pytest.mark.parametrize("name", ["TPOT +20%", "goodput -10%"])
def test_a_bad_canary_scraped_at_phases_spread_over_the_period_still_rolls_back(name: str) -> None:
    trial = _Trial(next(s for s in SCENARIOS if s.name == name), "example", pool=4, rate=1.0, seed=3, interval=10.0)
    recorded: list[Record] = []
    outcome, reason, _, _ = run_trial(trial, recorded)
    assert outcome == "RolledBack"
    result = replay(_prometheus_offsets(recorded, 10.0), trial.spec())
    assert (result.outcome, result.reason) == (outcome, reason), format_result(result, trial.spec())


@pytest.mark.parametrize("name", ["TPOT +20%", "acceptance -15%", "goodput -10%"])
@pytest.mark.parametrize("steps", ["default", "example"])
def test_a_bad_canary_with_jittered_stamps_is_still_compared_with_its_stable(name: str, steps: str) -> None:
    """Before rounds were read with a tolerance, each jittered line was a round of its own: the canary's rounds had
    no stable pod in them, so no comparison was made, and these canaries ran to the end of the recording."""
    trial = _Trial(next(s for s in SCENARIOS if s.name == name), steps, pool=2, rate=2.0, seed=1, interval=10.0)
    recorded: list[Record] = []
    outcome, reason, _, _ = run_trial(trial, recorded)
    assert outcome == "RolledBack"
    result = replay(_jittered(recorded, 1), trial.spec())
    assert (result.outcome, result.reason) == (outcome, reason), format_result(result, trial.spec())


def test_a_round_is_each_pod_once_within_half_the_scrape_period() -> None:
    def record(at: float, pod: str) -> Record:
        return Record(at=at, pod=pod, role="canary" if pod.startswith("c") else "stable")

    # Two pods scraped every 10 s, up to 1 s apart; the stable once twice within a round (a retried scrape).
    records = [record(0.0, "c"), record(0.6, "s"), record(10.4, "s"), record(10.9, "c"), record(20.0, "c"),
               record(20.2, "s"), record(20.3, "s"), record(30.0, "c")]
    grouped = [[(r.at, r.pod) for r in batch] for batch in rounds(records)]
    assert grouped == [[(0.0, "c"), (0.6, "s")], [(10.4, "s"), (10.9, "c")], [(20.0, "c"), (20.2, "s")],
                       [(20.3, "s")], [(30.0, "c")]]


@pytest.mark.parametrize("path", [HEALTHY, ERRORING], ids=["healthy", "erroring"])
@pytest.mark.parametrize("lead_s", [60, 2000])
def test_a_recording_that_starts_before_the_canary_starts_it_when_the_canary_shows(path: Path, lead_s: int) -> None:
    """An export from before the change: rounds of stable pods alone, with the route all on the stable. The canary
    starts with the first round that has a canary pod, as the operator's starts when it sees the new revision;
    before, it started with the recording, and a lead-in longer than the timeout rolled it back (CanaryTimedOut)
    before any canary pod was recorded."""
    header, records = parse_recording(path.read_text())
    spec = load_spec(header)
    first = min(record.at for record in records)
    stable = [record for record in records if record.at == first and record.role == "stable"]
    lead = [dataclasses.replace(record, at=first - lead_s + 10 * index, weight=0)
            for index in range(lead_s // 10) for record in stable]
    expected = replay(records, spec)
    result = replay(lead + records, spec)
    assert (result.outcome, result.reason) == (expected.outcome, expected.reason), format_result(result, spec)
    assert [(step.ended, step.seconds) for step in result.steps] == [(step.ended, step.seconds)
                                                                      for step in expected.steps]


E2E_LATE = DATA / "e2e-late-errors.jsonl.gz"


def test_a_canary_recorded_on_the_local_cluster_replays_to_the_verdict_the_operator_gave(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Recorded beside the operator by tests/e2e/test_canary_steps.py (tests/e2e/canary_recording.py): a drafter
    change on 2 replicas behind the route, whose pods begin to fail half their requests once the 100% step starts.
    Each pod is stamped when its own scrape answered. The operator's outcome heads the recording; the replay of the
    same scrapes through `canary replay` gives it: rolled back at step 3 on the error rate."""
    text = gzip.decompress(E2E_LATE.read_bytes()).decode()
    said = re.search(r"the operator's outcome: (\w+) at step (\d+): .*?\((\w+)\)", text.splitlines()[0])
    assert said is not None
    operator_phase, operator_step, operator_reason = said.group(1), int(said.group(2)), said.group(3)
    assert (operator_phase, operator_step, operator_reason) == ("RolledBack", 3, "ErrorRateExceeded")
    header, records = parse_recording(text)
    assert len({record.at for record in records}) > len(list(rounds(records))), "stamps are per pod, not per round"
    result = replay(records, load_spec(header))
    assert (result.outcome, result.reason) == (operator_phase, f"CanaryFailed/{operator_reason}")
    assert [(step.step + 1, step.ended) for step in result.steps] == [(1, "Passed"), (2, "Passed"),
                                                                       (operator_step, "Failed")]
    # The CLI reads the gzip-compressed file as it is.
    assert main(["canary", "replay", str(E2E_LATE)]) == 0
    assert "outcome: RolledBack (CanaryFailed/ErrorRateExceeded)" in capsys.readouterr().out


def _rounds_of(records: list[Record], spec: ReplaySpec) -> tuple[list[list[Record]], int, int]:
    """(the recording's rounds, the round at which its replay passes step 2, the first round whose route gives
    the canary 100%)."""
    batches = list(rounds(records, scrape_period(records)))
    replayer = Replayer(spec, period=scrape_period(records))
    passed = None
    for index, batch in enumerate(batches):
        replayer.round(batch)
        if passed is None and replayer.status is not None and replayer.status.step == 2:
            passed = index
    full = next(index for index, batch in enumerate(batches) if batch[0].weight == 100)
    assert passed is not None and passed < full
    return batches, passed, full


@pytest.mark.parametrize("routed", [True, False])
@pytest.mark.parametrize("late", [0, 1])
def test_a_step_the_recording_moved_past_before_the_replay_decided_it_is_followed(late: int, routed: bool) -> None:
    """The operator passes a step on its own scrapes; a recorder beside it scrapes at other moments, so its window
    may still be undecided when the canary moves on (a fresh CI run: the 50% step still Inconclusive on its TPOT
    p99 one round after the operator passed it). Here the recorder misses the rounds from the replay's own pass up
    to the route's move (and `late` more). On 2 replicas the 10% and 50% steps both route 50% and run one canary
    pod, so only the 100% step's route (or, without a route, its second canary pod) shows the step is over; the
    rounds after carry the 100% step's traffic, in which the canary fails half its requests. Counted in the 50%
    step's window, they failed step 2 where the operator failed step 3. The replay follows the recording to step 3,
    says so, and judges the errors there."""
    header, records = parse_recording(gzip.decompress(E2E_LATE.read_bytes()).decode())
    spec = load_spec(header)
    batches, passed, full = _rounds_of(records, spec)
    raced = [record if routed else dataclasses.replace(record, weight=None)
             for index, batch in enumerate(batches) if not passed <= index <= full + late for record in batch]
    result = replay(raced, spec)
    report = format_result(result, spec)
    assert (result.outcome, result.reason) == ("RolledBack", "CanaryFailed/ErrorRateExceeded"), report
    assert [(step.step + 1, step.ended) for step in result.steps] == [(1, "Passed"), (2, "Followed"), (3, "Failed")]
    assert "step 2/3 (50%) Followed after " in report
    assert "note: step 2 (50%): 1 scrape followed the recording" in report, report
    shown = "the recorded route gave the canary 100%" if routed else "2 of the pool's 2 replicas served the canary"
    assert f"{shown}" in report and "step 3's share" in report, report


def test_a_route_share_no_later_step_sets_is_not_followed() -> None:
    """Only a share a later step sets shows the operator past the step: a route read off by a few percent (a
    share of backend weights, an export's rounding) holds the step as it holds the operator's, and is noted
    nowhere as followed."""
    header, records = parse_recording(gzip.decompress(E2E_LATE.read_bytes()).decode())
    spec = load_spec(header)
    expected = replay(records, spec)
    odd = [dataclasses.replace(record, weight=53) if record.weight == 50 else record for record in records]
    assert odd != records
    result = replay(odd, spec)
    assert "Followed" not in [step.ended for step in result.steps], format_result(result, spec)
    assert (result.outcome, result.reason) == (expected.outcome, expected.reason), format_result(result, spec)


def test_the_cli_reads_a_recording_from_stdin_and_refuses_a_binary_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(ERRORING.read_bytes())))
    assert main(["canary", "replay", "-"]) == 0
    assert "outcome: RolledBack (CanaryFailed/ErrorRateExceeded)" in capsys.readouterr().out
    junk = tmp_path / "junk.jsonl.gz"
    junk.write_bytes(b"\x1f\x8b\x08\x00broken")
    assert main(["canary", "replay", str(junk)]) == 2
    assert "not a readable gzip file" in capsys.readouterr().err
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00junk")
    assert main(["canary", "replay", str(binary)]) == 2
    assert "error:" in capsys.readouterr().err


def test_a_fractional_weight_is_read_as_the_operator_reads_a_route_and_t_may_be_a_numeric_string() -> None:
    """A share computed from the route's backend weights (1 of 8 replicas is 12.5%) is read to the whole percent,
    half up, as the operator reads an HTTPRoute; Unix seconds may come as a string."""
    text = ('{"t": "1764500000.5", "pod": "c", "role": "canary", "weight": 12.5}\n'
            '{"t": 1764500000.5, "pod": "s", "role": "stable", "weight": 49.4}\n')
    _, records = parse_recording(text)
    assert [(record.at, record.weight) for record in records] == [(1764500000.5, 13), (1764500000.5, 49)]


@pytest.mark.parametrize("replicas", [None, 2])
def test_a_pod_of_the_canarys_revision_beyond_the_steps_replicas_does_not_hold_the_step(replicas: int | None) -> None:
    """The operator starts and passes a step once the canary Deployment has the step's replicas Ready. A recorder
    that tells roles by revision also lists pods of the canary's revision outside it (the stable Deployment rolling
    to it once promoted, a surge pod), Pending: with the pool's size in the header they do not hold the step, as
    they do not hold the operator's; without it the replay cannot tell them apart and waits for every listed pod."""
    header, records = parse_recording(HEALTHY.read_text())
    spec = dataclasses.replace(load_spec(header), replicas=replicas)
    stamps = sorted({record.at for record in records})
    pending = [Record(at=at, pod="stable-rolled-0", role="canary", phase="Pending", ready=False, restarts=0,
                      weight=None, metrics=None) for at in stamps]
    result = replay(records + pending, spec)
    if replicas is None:
        assert result.outcome != "Promoted", format_result(result, spec)
    else:
        assert (result.outcome, result.reason) == ("Promoted", "CanaryPromoted"), format_result(result, spec)
