"""The Grafana dashboard loads, lays out cleanly and queries only metrics the operator exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from prometheus_client.metrics_core import Metric

from specdec_operator.metrics import REGISTRY
from tests.unit.shipping.chart import CHART_DIR

DASHBOARD_FILE = CHART_DIR / "dashboards" / "specdec-operator.json"
GRID_WIDTH = 24

# The part of Grafana's dashboard model that provisioning and the sidecar need to import a dashboard.
_DATASOURCE = {"type": "object", "required": ["type", "uid"]}
_GRID_POS = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": GRID_WIDTH},
        "x": {"type": "integer", "minimum": 0, "maximum": GRID_WIDTH - 1},
        "y": {"type": "integer", "minimum": 0},
    },
}
_TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {"refId": {"type": "string", "minLength": 1}, "expr": {"type": "string", "minLength": 1}},
}
DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time", "tags"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": {"type": "object", "required": ["name", "type"]}}},
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos"],
                "properties": {"id": {"type": "integer"}, "gridPos": _GRID_POS},
                "if": {"properties": {"type": {"const": "row"}}},
                "else": {
                    "required": ["datasource", "targets", "fieldConfig"],
                    "properties": {
                        "datasource": _DATASOURCE,
                        "targets": {"type": "array", "minItems": 1, "items": _TARGET},
                    },
                },
            },
        },
    },
}

# PromQL words that look like metric names but are not.
_MODIFIERS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
_PROMQL_WORDS = _MODIFIERS | {"and", "or", "unless"}
# Grafana's label_values(selector, label): only the selector names a metric.
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_]\w*\s*\)\s*$")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w$.])([A-Za-z_:][\w:]*)\b(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL (or Grafana label_values) expression selects."""
    expr = _LABEL_VALUES.sub(r"\1", expr)
    for pattern in (_STRING, _MATCHERS, _RANGE, _GROUPING):
        expr = pattern.sub(" ", expr)
    return {
        name
        for name, call in _IDENTIFIER.findall(expr)
        if not call and name not in _PROMQL_WORDS and not name.replace(".", "").isdigit()
    }


def _series_names(family: Metric) -> set[str]:
    # prometheus_client strips the suffixes from family names; the exposition adds them per type.
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count", ""]}
    return {family.name + suffix for suffix in suffixes.get(family.type, [""])}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


# vLLM 0.33's own engine metrics the "vLLM engines" row reads (scraped by the chart's PodMonitor); the
# names are those of vLLM's metrics module (/work/shared/research/vllm-specdec.md).
VLLM_ENGINE_SERIES = {
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    return {name for family in REGISTRY.collect() for name in _series_names(family)} | VLLM_ENGINE_SERIES


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield f"${variable['name']}", variable["query"]["query"]


def test_dashboard_matches_the_grafana_model(dashboard: dict[str, Any]) -> None:
    jsonschema.Draft7Validator.check_schema(DASHBOARD_SCHEMA)
    errors = [error.message for error in jsonschema.Draft7Validator(DASHBOARD_SCHEMA).iter_errors(dashboard)]
    assert errors == []


def test_panel_ids_and_ref_ids_are_unique(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        ref_ids = [target["refId"] for target in panel.get("targets", [])]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_panels_fit_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    occupied: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= GRID_WIDTH, panel["title"]
        for column in range(pos["x"], pos["x"] + pos["w"]):
            for row in range(pos["y"], pos["y"] + pos["h"]):
                assert (column, row) not in occupied, f"{panel['title']} overlaps {occupied[(column, row)]}"
                occupied[(column, row)] = panel["title"]


def test_every_queried_metric_is_exported_by_the_operator(dashboard: dict[str, Any], exported: set[str]) -> None:
    unknown = {
        (where, name) for where, expr in _queries(dashboard) for name in metric_names(expr) if name not in exported
    }
    assert unknown == set()


def test_every_query_selects_some_metric(dashboard: dict[str, Any]) -> None:
    # Guards the name extraction above: a query it reads as metric-free would pass the export check vacuously.
    assert all(metric_names(expr) for _, expr in _queries(dashboard))


@pytest.mark.parametrize(
    ("topic", "metric"),
    [
        ("K over time per pool", "specdec_effective_k"),
        ("acceptance per position", "specdec_position_acceptance"),
        ("tokens/s", "specdec_tokens_per_second"),
        ("canary weights", "specdec_canary_weight"),
        ("scrape errors", "specdec_scrapes_total"),
        ("which replica acts", "specdec_active"),
        ("TTFT", "vllm:time_to_first_token_seconds_bucket"),
        ("TPOT", "vllm:request_time_per_output_token_seconds_bucket"),
        ("queue depth", "vllm:num_requests_waiting"),
        ("KV-cache use", "vllm:kv_cache_usage_perc"),
    ],
)
def test_dashboard_shows(dashboard: dict[str, Any], topic: str, metric: str) -> None:
    panels = {title for title, expr in _queries(dashboard) if metric in metric_names(expr)}
    assert panels, f"no panel shows {topic}"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (pool, le) (rate(specdec_x_bucket{pool=~"$pool"}[$__rate_interval]))', {"specdec_x_bucket"}),
        ("histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m])))", {"a_bucket"}),
        ("a_total / on (pool) group_left b", {"a_total", "b"}),
        ('label_values(specdec_effective_k{namespace=~"$namespace"}, model)', {"specdec_effective_k"}),
        ("vllm:num_requests_running > bool 3", {"vllm:num_requests_running"}),
    ],
)
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
