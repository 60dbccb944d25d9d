"""Recordings as a platform engineer produces them outside our recorder: a Prometheus export, a vLLM scraped the way
Prometheus scrapes it, JSON written by other tools. Each either replays as our own recording does or is refused
naming the line and the field; scrapes the operator's path cannot use are named in the output, never silently
dropped."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from specdec_operator.canary.replay import RecordingError, format_result, load_spec, parse_recording, replay
from specdec_operator.cli import main
from specdec_operator.tuner.samples import MetricsParseError, parse_metrics
from tests.unit.canary.exposition import TPOT_BOUNDS, Scrape, _Exposition, scrape_text

DATA = Path(__file__).parent / "data"
HEALTHY = DATA / "healthy-canary.jsonl"
ERRORING = DATA / "erroring-canary.jsonl"


def _split(path: Path) -> tuple[str, list[dict[str, object]]]:
    head, _, body = path.read_text().partition("---\n")
    return head + "---\n", [json.loads(line) for line in body.splitlines() if line.strip()]


def _join(head: str, lines: list[dict[str, object]]) -> str:
    return head + "".join(json.dumps(line) + "\n" for line in lines)


def _metrics(lines: list[dict[str, object]], change: object) -> list[dict[str, object]]:
    return [{**line, "metrics": change(line) if line.get("metrics") is not None else None}  # type: ignore[operator]
            for line in lines]


SCRAPE = Scrape(drafts=1000.0, draft_tokens=4000.0, accepted_tokens=2000.0, generation_tokens=3000.0,
                tpot_buckets=tuple((bound, 10.0) for bound in (*TPOT_BOUNDS, math.inf)),
                finished={"stop": 9.0, "error": 1.0}, http={"2xx": 9.0, "5xx": 1.0})


def _openmetrics(scrape: Scrape) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Exposition(scrape))
    return openmetrics_latest(registry).decode()


def test_vllm_scraped_as_prometheus_scrapes_it_reads_as_its_text_exposition() -> None:
    """Prometheus 2 asks for OpenMetrics, and vLLM's prometheus_client then escapes the names' ":" to "_"
    (`vllm_generation_tokens_total`), adds `_created` series and ends with `# EOF`, whose newline is optional. Such
    a body read as "no vLLM metrics"; one without the last newline as truncated."""
    body = _openmetrics(SCRAPE)
    assert "\nvllm_generation_tokens_total{" in body and body.endswith("# EOF\n")
    expected = parse_metrics(scrape_text(SCRAPE))
    assert parse_metrics(body) == expected and expected.complete
    assert parse_metrics(body.removesuffix("\n")) == expected
    # Truncation is still refused, and one series written both ways is a duplicate, not twice the count.
    with pytest.raises(MetricsParseError, match="no final newline"):
        parse_metrics(body[: body.rindex("# EOF") - 3])
    both = body.replace("# EOF\n", "") + scrape_text(SCRAPE)
    with pytest.raises(MetricsParseError, match="duplicate series"):
        parse_metrics(both)


@pytest.mark.parametrize("path", [HEALTHY, ERRORING], ids=["healthy", "erroring"])
def test_a_recording_of_escaped_openmetrics_names_replays_to_the_same_verdict(path: Path) -> None:
    head, lines = _split(path)
    expected = replay(*reversed(_spec_and_records(path.read_text())))
    escaped = _join(head, _metrics(lines, lambda line: str(line["metrics"]).replace("vllm:", "vllm_") + "# EOF"))
    result = replay(*reversed(_spec_and_records(escaped)))
    assert (result.outcome, result.reason, result.notes) == (expected.outcome, expected.reason, ())


def _as_openmetrics_with_exemplars(metrics: str, at: float) -> str:
    """The body as an OpenMetrics exporter may write it: every sample stamped in (fractional) seconds, exemplars on
    the counters and on the histograms' +Inf buckets, and `# EOF` last."""
    lines = []
    for line in metrics.splitlines():
        if line and not line.startswith("#"):
            line += f" {at + 0.123:.3f}"
            if line.split("{")[0].endswith(("_total", "_bucket")) and ("_total" in line or 'le="+Inf"' in line):
                line += f' # {{trace_id="0af7651916cd43dd8448eb211c80319c"}} 1.0 {at:.3f}'
        lines.append(line)
    return "\n".join(lines) + "\n# EOF\n"


@pytest.mark.parametrize("path", [HEALTHY, ERRORING], ids=["healthy", "erroring"])
def test_a_recording_of_openmetrics_with_exemplars_and_seconds_replays_to_the_same_verdict(path: Path) -> None:
    """Every such scrape was refused as unreadable (the exemplar, the fractional timestamp), so the canary ended
    Unfinished for want of requests."""
    head, lines = _split(path)
    expected = replay(*reversed(_spec_and_records(path.read_text())))
    rewritten = _metrics(lines, lambda line: _as_openmetrics_with_exemplars(str(line["metrics"]),
                                                                            float(str(line["t"]))))
    assert any(" # {trace_id=" in str(line["metrics"]) for line in rewritten)
    result = replay(*reversed(_spec_and_records(_join(head, rewritten))))
    assert (result.outcome, result.reason, result.notes) == (expected.outcome, expected.reason, ())


def _spec_and_records(text: str) -> tuple[object, object]:
    header, records = parse_recording(text)
    return load_spec(header), records


@pytest.mark.parametrize(
    ("t", "fragment"),
    [(1764500000000, "line 1: t 1764500000000 is not Unix seconds"),  # milliseconds, as Prometheus writes them
     (1e300, r"line 1: t 1e\+300 is not Unix seconds"), (-5e11, "line 1: t -5"), ("1764500000000", "line 1: t")],
)
def test_a_stamp_datetime_cannot_hold_is_refused_naming_the_line(
        t: object, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It crashed the replay with a ValueError/OverflowError traceback from datetime."""
    text = json.dumps({"t": t, "pod": "c", "role": "canary", "metrics": None}) + "\n"
    with pytest.raises(RecordingError, match=fragment):
        parse_recording(text)
    recording = tmp_path / "ms.jsonl"
    recording.write_text(text)
    assert main(["canary", "replay", str(recording)]) == 2
    assert "line 1: t " in capsys.readouterr().err


@pytest.mark.parametrize(
    "changes",
    [{"t": "2025-11-30t10:53:20z"},  # RFC 3339 5.6: "T" and "Z" may be lower case
     {"role": "Canary"}, {"role": "CANARY"},
     {"restarts": 0.0},  # JSON has one number type; a Prometheus export writes floats
     {"restarts": None}, {"ready": None}, {"phase": None}],  # null: the field left out
    ids=lambda changes: "-".join(f"{key}={value}" for key, value in changes.items()),
)
def test_json_as_other_tools_write_it_reads_as_ours(changes: dict[str, object]) -> None:
    ours = {"t": 1764500000.0, "pod": "c", "role": "canary", "phase": "Running", "ready": True, "restarts": 0}
    _, (expected,) = parse_recording(json.dumps(ours) + "\n")
    _, (record,) = parse_recording(json.dumps({**ours, **changes}) + "\n")
    assert record == expected


@pytest.mark.parametrize(
    ("line", "fragment"),
    [({"restarts": 1.5}, "line 1: restarts must be a non-negative integer, got 1.5"),
     ({"ready": "yes"}, "line 1: ready must be true or false, got 'yes'"),
     ({"health": "ok"}, "line 1: health must be true, false or null, got 'ok'")],
)
def test_values_no_tool_means_as_ours_are_still_refused(line: dict[str, object], fragment: str) -> None:
    with pytest.raises(RecordingError, match=fragment):
        parse_recording(json.dumps({"t": 1.0, "pod": "c", "role": "canary", **line}) + "\n")


def test_a_byte_order_mark_does_not_turn_the_first_line_into_the_header() -> None:
    """Without a header, the first JSON line behind a BOM read as a YAML header: its record was lost and its keys
    taken for the spec, silently."""
    _, lines = _split(HEALTHY)
    header, records = parse_recording("\ufeff" + _join("", lines))
    assert header is None and len(records) == len(lines)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [("replicas: -2", "spec: replicas must be a whole number >= 1, got -2"),
     ("replicas: 2.7", "spec: replicas must be a whole number >= 1, got 2.7"),
     ("gpusPerPod: -1", "spec: gpusPerPod must be a whole number >= 1, got -1"),
     ("gpusPerPod: 0.5", "spec: gpusPerPod must be a whole number >= 1, got 0.5"),
     ("canaryK: 99", "spec: canaryK must be a whole number 0..16, got 99"),
     ("stableK: -1", "spec: stableK must be a whole number 0..16, got -1"),
     ("predictedGain: .nan", "spec: predictedGain must be a finite number")],
)
def test_a_header_value_the_operators_api_refuses_is_refused(
        extra: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative replicas or GPUs crashed the replay with a ValueError traceback; a fraction was cut to a whole
    number, and a NaN gain gave another verdict, silently."""
    head, lines = _split(HEALTHY)
    recording = tmp_path / "header.jsonl"
    recording.write_text(_join(head.replace("---\n", f"{extra}\n---\n"), lines))
    assert main(["canary", "replay", str(recording)]) == 2
    assert f"error: {fragment}" in capsys.readouterr().err
    assert load_spec({"replicas": 12.0, "gpusPerPod": 2, "canaryK": 4.0}).replicas == 12


def test_scrapes_the_operators_path_cannot_use_are_named_with_their_first_line() -> None:
    """A recording whose every scrape is unreadable (here exemplars in Prometheus text, a body without OpenMetrics'
    `# EOF`, which Prometheus and the operator refuse) ended `Unfinished (InsufficientTraffic)` with 0 requests and
    no word why; a pod the windows left out (its bucket layout changed without a restart) likewise."""
    head, lines = _split(ERRORING)
    exemplars = _metrics(lines, lambda line: str(line["metrics"]).replace('le="+Inf"} 0.0\n',
                                                                         'le="+Inf"} 0.0 # {trace_id="a"} 0.5\n'))
    result = replay(*reversed(_spec_and_records(_join(head, exemplars))))
    assert result.notes and result.notes[0].startswith("canary-0: 2 scrapes unreadable, first at line 18: ")
    assert "note: canary-0: 2 scrapes unreadable" in format_result(result, load_spec(None))
    stamps = sorted({float(str(line["t"])) for line in lines})
    relaid = _metrics(lines, lambda line: "\n".join(
        text for text in str(line["metrics"]).splitlines()
        if not (line["pod"] == "canary-0" and line["t"] == stamps[-1] and 'le="0.05"' in text)) + "\n")
    result = replay(*reversed(_spec_and_records(_join(head, relaid))))
    assert any(note.startswith("canary-0: 1 scrape left out of the counter windows, first at line ")
               and "layout changed without a restart" in note for note in result.notes), result.notes
    # A clean recording has none.
    assert replay(*reversed(_spec_and_records(ERRORING.read_text()))).notes == ()


@pytest.mark.parametrize("path", [HEALTHY, ERRORING], ids=["healthy", "erroring"])
def test_a_recording_without_per_position_counters_replays_to_the_same_verdict(path: Path) -> None:
    """A vLLM (or an export) without vllm:spec_decode_num_accepted_tokens_per_pos shows K only as draft tokens per
    draft, so a fresh pod shows none until it drafts. That read as K=0 then K=4, a "K change" that reset the window
    and lost each fresh pod's first interval: the erroring canary ended Unfinished (InsufficientTraffic) instead
    of rolling back on its error rate."""
    head, lines = _split(path)
    expected = replay(*reversed(_spec_and_records(path.read_text())))
    stripped = _metrics(lines, lambda line: "".join(
        text + "\n" for text in str(line["metrics"]).splitlines() if "_per_pos" not in text))
    assert all("_per_pos" not in str(line["metrics"]) for line in stripped)
    result = replay(*reversed(_spec_and_records(_join(head, stripped))))
    assert (result.outcome, result.reason, result.notes) == (expected.outcome, expected.reason, ())


def test_an_analysed_step_without_a_stable_pod_is_named_in_a_note() -> None:
    """An export that left the stable pods out is judged as a one-replica pool replaced in place is (health,
    restarts and errors only): the replay said nothing of it, and a platform engineer read a promotion as the
    analysis's. The clean recording has no such note."""
    head, lines = _split(HEALTHY)
    canary_only = [line for line in lines if line["role"] == "canary"]
    result = replay(*reversed(_spec_and_records(_join(head, canary_only))))
    assert any(note.startswith("step 1 (") and "judged without a Ready stable pod" in note
               and "NoBaselineHealthy" in note for note in result.notes), result.notes
    clean = replay(*reversed(_spec_and_records(HEALTHY.read_text())))
    assert not any("without a Ready" in note for note in clean.notes), clean.notes
