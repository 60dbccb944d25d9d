"""docs/metrics.md documents every metric metrics.py registers, with its type and labels, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from specdec_operator.metrics import REGISTRY

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(?P<name>specdec_\w+)` \| (?P<type>\w+) \|(?P<labels>[^|]*)\|", re.MULTILINE)
SUFFIX = {"counter": "_total", "histogram": "", "gauge": ""}


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = {}
    for match in ROW.finditer(DOC.read_text()):
        labels = tuple(re.findall(r"`(\w+)`", match["labels"]))
        assert match["name"] not in rows, f"{match['name']} documented twice"
        rows[match["name"]] = (match["type"], labels)
    return rows


def _registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    registered = {}
    for collector in list(REGISTRY._collector_to_names):
        for family in collector.describe():
            labels = tuple(getattr(collector, "_labelnames", ()))
            registered[family.name + SUFFIX[family.type]] = (family.type, labels)
    return registered


def test_every_registered_metric_is_documented_with_its_type_and_labels() -> None:
    assert _documented() == _registered()


def test_the_table_parser_reads_rows() -> None:
    assert len(_documented()) >= 16  # guards the regex: an empty parse would make the test above vacuous
