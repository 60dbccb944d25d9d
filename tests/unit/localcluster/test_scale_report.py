"""hack/scale's pure parts: the generated fleet, the Prometheus reading and the report."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import yaml

from localcluster.fleet import load_fleet, node_objects
from localcluster.scale import RELEASE_LINE, Bench, fleet_yaml, percentile, report, samples
from specdec_operator.handlers.services import memory_release as memory


def test_the_generated_fleet_has_a_gpu_for_every_pod_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml(2000))
    nodes = node_objects(load_fleet(path))
    gpus = sum(int(node["status"]["allocatable"]["amd.com/gpu"]) for node in nodes)
    assert gpus >= 2000 and len(nodes) == math.ceil(2000 / 8) + 1
    assert yaml.safe_load(path.read_text())["nodeGroups"][0]["partition"] == "spx_nps1"


def test_samples_read_counters_with_labels() -> None:
    text = ('# HELP x\napiserver_request_total{code="200",resource="pods",verb="LIST"} 12\n'
            'specdec_scrape_targets 400\nspecdec_effective_k{model="m,1",namespace="ns",pool="p"} 3\n')
    assert list(samples(text)) == [
        ("apiserver_request_total", {"code": "200", "resource": "pods", "verb": "LIST"}, 12.0),
        ("specdec_scrape_targets", {}, 400.0),
        ("specdec_effective_k", {"model": "m,1", "namespace": "ns", "pool": "p"}, 3.0),
    ]


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert math.isnan(percentile([], 0.5))


def test_the_report_prints_every_figure_it_has() -> None:
    bench = Bench(2, 4, 300, cluster=None)  # type: ignore[arg-type]
    bench.out = {
        "window_s": 300.0, "models_ready_s": 60.0, "floor_ready_s": 50.0, "floor_deployments": 2,
        "audit": {"operator": {"get speculativemodels": 0.01, "patch speculativemodels": 0.02},
                  "others": {"update leases": 3.0}},
        "apiserver_rps": {"WATCH pods": 0.1}, "operator_writes_metric": {"patch-status SpeculativeModel": 6},
        "operator_rss_mib": 120.0, "idle_rss_mib": 100.0, "operator_cpu_cores": 0.05,
        "scrape_rounds": [12.0, 12.5], "scrape_targets": 8, "scrapes": {"ok": 999.0, "timeout": 1.0},
        "series_left": 0, "series_left_names": [], "rss_after_delete_mib": 110.0,
        "releases": [("290", "176", "61")],
        "status_writes_by_cause": {"state": 6.0}, "tuner_decisions": {"Explore": 4.0, "Change": 2.0},
    }
    text = report(bench)
    assert "operator / floor = 1.20x" in text
    assert "reads   0.010  writes   0.020" in text
    assert "operator writes/min (audit)          1.20" in text
    assert "succeeded 99.900%" in text
    assert "RSS 110.0 MiB vs idle 100.0 MiB (1.10x)" in text
    assert "memory releases after the deletion: 290 -> 176 MiB, 61 MiB stranded" in text
    assert "{'state': 6.0}" in text and "{'Explore': 4.0, 'Change': 2.0}" in text


def test_the_bench_reads_the_operators_own_release_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "release_memory", lambda: (290.4, 176.2))
    monkeypatch.setattr(memory, "stranded_heap_mib", lambda: 61.3)
    release = memory.MemoryRelease()
    with caplog.at_level(logging.INFO, logger=memory.LOG.name):
        release._release()
    text = caplog.text
    assert RELEASE_LINE.findall(text) == [("290", "176", "61")]
