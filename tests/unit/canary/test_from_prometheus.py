"""`specdec-operator canary from-prometheus`: a recording for `canary replay` from what Prometheus stored."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from specdec_operator.canary.analysis import Verdict, WindowStats
from specdec_operator.canary.from_prometheus import PodRoles, PrometheusExportError, recording_lines
from specdec_operator.canary.replay import ReplaySpec, parse_recording, replay
from specdec_operator.cli import main
from specdec_operator.tuner.samples import parse_metrics

DATA = Path(__file__).parent / "data"
# Answers of a real Prometheus (v0.316.0, built as hack/ builds it) that scraped three simulated vLLM pods every
# 2 s, two of the stable's revision at K=3 and one of the canary's at K=4, named as the operator names a pool's
# pods, with the target labels a Kubernetes scrape config gives (`pod`, `namespace`, `container`). One stable pod
# was stopped before the end: its last scrapes failed. Queried as docs/canary.md says: the raw samples of
# `{__name__=~"vllm:.+"}[...]` and of `up[...]`.
VLLM = DATA / "prometheus-vllm-raw-samples.json.gz"
UP = DATA / "prometheus-up-raw-samples.json.gz"
POOL = "demo-gfx942"
STABLE_PODS = {"demo-gfx942-7c9f8d6b5-x4kqz", "demo-gfx942-7c9f8d6b5-p7w2n"}
CANARY_POD = "demo-gfx942-canary-5d4f7b8c9-m2v9t"
STOPPED = "demo-gfx942-7c9f8d6b5-p7w2n"


def _answer(path: Path) -> Any:
    return json.loads(gzip.decompress(path.read_bytes()))


def _lines() -> list[dict[str, Any]]:
    lines, notes = recording_lines([(VLLM.name, _answer(VLLM)), (UP.name, _answer(UP))], PodRoles.of_pool(POOL))
    assert notes == []
    return lines


def test_each_scrape_prometheus_stored_is_one_line_of_its_pod_in_time_order() -> None:
    lines = _lines()
    assert {line["pod"] for line in lines} == STABLE_PODS | {CANARY_POD}
    assert {line["pod"]: line["role"] for line in lines} == {**dict.fromkeys(STABLE_PODS, "stable"),
                                                            CANARY_POD: "canary"}
    assert [line["t"] for line in lines] == sorted(line["t"] for line in lines)
    for pod in STABLE_PODS | {CANARY_POD}:
        stamps = [line["t"] for line in lines if line["pod"] == pod]
        assert len(stamps) == len(set(stamps)) >= 10
        # One scrape every 2 s, stamped as Prometheus stamped it.
        assert all(1.5 < later - earlier < 2.5 for earlier, later in itertools.pairwise(stamps))
    for line in lines:
        assert line["weight"] is None and line["ready"] is True and line["restarts"] == 0
        if line["metrics"] is not None:
            sample = parse_metrics(line["metrics"])
            assert sample.complete, (line["pod"], sample.problems)
            assert sample.k == (4 if line["role"] == "canary" else 3)


def test_a_scrape_prometheus_marked_down_is_a_line_without_metrics() -> None:
    lines = _lines()
    stopped = [line for line in lines if line["pod"] == STOPPED]
    failed = [line for line in stopped if line["metrics"] is None]
    assert failed and all(line["t"] > max(other["t"] for other in stopped if other["metrics"]) for line in failed)
    assert all(line["metrics"] is not None for line in lines if line["pod"] != STOPPED)


def test_the_recording_replays_through_the_operators_windows() -> None:
    """The lines, written as `canary from-prometheus` writes them, read back by `canary replay` and counted by the
    operator's windows: both revisions' requests and drafts, at the K each ran."""
    text = "".join(json.dumps(line) + "\n" for line in _lines())
    header, records = parse_recording(text)
    assert header is None
    seen: list[tuple[WindowStats, WindowStats | None]] = []

    def keep(step: int, canary: WindowStats, stable: WindowStats | None, verdict: Verdict) -> None:
        seen.append((canary, stable))

    result = replay(records, ReplaySpec(replicas=3), on_verdict=keep)
    assert result.notes == ()
    assert seen, result
    canary, stable = seen[-1]
    assert stable is not None
    assert canary.requests > 0 and stable.requests > 0 and canary.drafts > 0 and stable.drafts > 0
    assert (canary.k, stable.k) == (4, 3)


def _matrix(*series: tuple[dict[str, str], list[tuple[float, str]]]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": labels, "values": [[stamp, value] for stamp, value in values]} for labels, values in series]}}


def test_kube_state_metrics_give_each_scrape_the_pods_state_as_of_it() -> None:
    """Readiness, phase and restarts are kube-state-metrics' samples, taken at moments of their own: each scrape
    reads the last one at or before it; restarts add up over the pod's containers."""
    pod = f"{POOL}-canary-5d4f7b8c9-m2v9t"
    metrics = ({"__name__": "vllm:num_requests_running", "pod": pod, "engine": "0"},
               [(100.0, "1"), (102.0, "2"), (104.0, "3"), (106.0, "4")])
    ready = ({"__name__": "kube_pod_status_ready", "pod": pod, "condition": "true"}, [(99.0, "0"), (103.0, "1")])
    not_ready = ({"__name__": "kube_pod_status_ready", "pod": pod, "condition": "false"}, [(99.0, "1"), (103.0, "0")])
    phase = ({"__name__": "kube_pod_status_phase", "pod": pod, "phase": "Pending"}, [(99.0, "1"), (101.0, "0")])
    running = ({"__name__": "kube_pod_status_phase", "pod": pod, "phase": "Running"}, [(99.0, "0"), (101.0, "1")])
    restarts = ({"__name__": "kube_pod_container_status_restarts_total", "pod": pod, "container": "vllm"},
                [(99.0, "0"), (105.0, "1")])
    sidecar = ({"__name__": "kube_pod_container_status_restarts_total", "pod": pod, "container": "proxy"},
               [(99.0, "2")])
    lines, notes = recording_lines([("a", _matrix(metrics, ready, not_ready, phase, running, restarts, sidecar))],
                                   PodRoles.of_pool(POOL))
    assert notes == []
    assert [(line["t"], line["ready"], line["phase"], line["restarts"]) for line in lines] == [
        (100.0, False, "Pending", 2), (102.0, False, "Running", 2), (104.0, True, "Running", 2),
        (106.0, True, "Running", 3)]
    assert lines[0]["metrics"] == f'vllm:num_requests_running{{engine="0",pod="{pod}"}} 1\n'


def test_pods_of_the_pool_are_told_apart_by_their_deployments_names() -> None:
    roles = PodRoles.of_pool(POOL)
    assert roles.role("demo-gfx942-7c9f8d6b5-x4kqz") == "stable"
    assert roles.role("demo-gfx942-canary-5d4f7b8c9-m2v9t") == "canary"
    assert roles.role("demo-gfx90a-7c9f8d6b5-x4kqz") is None  # another pool of the model
    assert roles.role("demo-gfx942x-7c9f8d6b5-x4kqz") is None
    assert PodRoles.of_pool("demo").role("demo-gfx942-7c9f8d6b5-x4kqz") is None  # another model's pool


@pytest.mark.parametrize(("answer", "fragment"), [
    ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "status is 'error', not success: parse"),
    ({"status": "success", "data": {"resultType": "vector", "result": []}}, "data.resultType is 'vector'"),
    ([1, 2], "not a Prometheus API answer"),
    ({"status": "success", "data": {"resultType": "matrix", "result": "x"}}, "data.result must be a list of series"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"__name__": "vllm:x", "pod":
      f"{POOL}-7c9f8d6b5-x4kqz"}, "values": [[1.0, 2]]}]}}, 'a value must be [unix seconds, "number"]'),
])
def test_an_answer_that_cannot_be_read_is_refused_naming_it(answer: Any, fragment: str) -> None:
    with pytest.raises(PrometheusExportError, match=None) as caught:
        recording_lines([("answer.json", answer)], PodRoles.of_pool(POOL))
    assert str(caught.value).startswith("answer.json: ") and fragment in str(caught.value), caught.value


def test_the_cli_writes_the_recording_and_names_what_it_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_matrix(({"__name__": "vllm:x", "pod": "unrelated-7c9f8d6b5-x4kqz"}, [(1.0, "1")]),
                                        ({"__name__": "vllm:x"}, [(1.0, "1")]))))
    assert main(["canary", "from-prometheus", str(VLLM), str(UP), str(other), "--pool", POOL]) == 0
    captured = capsys.readouterr()
    assert "note: 1 pods are neither canary nor stable by name, left out: unrelated-7c9f8d6b5-x4kqz" in captured.err
    assert "note: 1 series without a pod or kubernetes_pod_name label (or a name), left out" in captured.err
    recording = tmp_path / "canary.jsonl"
    recording.write_text(captured.out)
    assert main(["canary", "replay", str(recording)]) == 0
    assert "outcome: " in capsys.readouterr().out

    assert main(["canary", "from-prometheus", str(other), "--pool", POOL]) == 1
    assert "no series of a canary or stable pod" in capsys.readouterr().err
    assert main(["canary", "from-prometheus", str(VLLM)]) == 2
    assert "give --pool" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["canary", "from-prometheus", str(broken), "--pool", POOL]) == 2
    assert "error: " in capsys.readouterr().err


# A real canary, recorded by a real Prometheus: tests/e2e/test_canary_steps.py's `late` canary (a drafter change on 2
# replicas behind an HTTPRoute, whose pods start failing half their requests two rounds into the 100% step) on the
# local cluster, with the cluster's Prometheus (hack/cluster autoscaling) scraping every runtime pod every 5 s,
# queried afterwards as docs/canary.md says. The operator rolled it back at step 3 on the error rate.
LATE_VLLM = DATA / "prometheus-e2e-late-vllm.json.gz"
LATE_UP = DATA / "prometheus-e2e-late-up.json.gz"
LATE_MODEL = DATA / "prometheus-e2e-late-model.yaml"


def test_a_canary_on_the_local_cluster_recorded_by_prometheus_replays_to_the_operators_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """From Prometheus' answers and the manifest as applied (the HTTPRoute beside the SpeculativeModel in one
    file), as a platform engineer would ask: the same outcome, at the same step, for the same reason. Prometheus
    stores no route weight, so the replay reads each step from the canary pods Ready and the pool's
    replicasPerPool, and it scrapes at moments of its own: the 50% step, not yet decided on its 5 s scrapes when
    both canary pods served, follows the recording to the 100% step."""
    assert "RolledBack at step 3" in LATE_MODEL.read_text() and "(ErrorRateExceeded)" in LATE_MODEL.read_text()
    assert main(["canary", "from-prometheus", str(LATE_VLLM), str(LATE_UP), "--pool", "late-gfx942"]) == 0
    recording = tmp_path / "late.jsonl"
    recording.write_text(capsys.readouterr().out)
    assert main(["canary", "replay", str(recording), "--spec", str(LATE_MODEL)]) == 0
    report = capsys.readouterr().out
    assert "\nstep 3/3 (100%) Failed after " in report, report
    assert report.splitlines()[-1].startswith("outcome: RolledBack (CanaryFailed/ErrorRateExceeded)"), report


def test_a_spec_file_with_several_speculativemodels_is_refused(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    text = LATE_MODEL.read_text()
    several = tmp_path / "models.yaml"
    several.write_text(f"{text}\n---\n{text.split('---', 1)[1]}")
    recording = tmp_path / "late.jsonl"
    assert main(["canary", "from-prometheus", str(LATE_VLLM), "--pool", "late-gfx942"]) == 0
    recording.write_text(capsys.readouterr().out)
    assert main(["canary", "replay", str(recording), "--spec", str(several)]) == 2
    assert "holds 2 SpeculativeModels" in capsys.readouterr().err
