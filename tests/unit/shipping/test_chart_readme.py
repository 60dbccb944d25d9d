"""The chart README is generated from values.yaml (hack/chart-readme) and is up to date."""

from __future__ import annotations

from typing import Any

import chartdocs
from tests.unit.shipping.chart import CHART_DIR, load_values


def _leaf_paths(node: Any, prefix: str = "") -> set[str]:
    if isinstance(node, dict) and node and all(":" not in str(key) for key in node):
        return {path for key, child in node.items() for path in _leaf_paths(child, f"{prefix}{key}.")}
    return {prefix.rstrip(".")}


def test_readme_is_generated_from_the_current_values() -> None:
    assert (CHART_DIR / "README.md").read_text() == chartdocs.render_readme(), "run hack/chart-readme"


def test_every_value_has_a_row_with_its_default() -> None:
    rows = {row.key: row for row in chartdocs.value_rows((CHART_DIR / "values.yaml").read_text())}
    missing = _leaf_paths(load_values()) - set(rows)
    assert missing == set()
    assert rows["metrics.prometheusRule.acceptanceRate.threshold"].default == "`0.6`"
    assert rows["crds.keep"].type == "bool"
    assert "JSON" in rows["logging"].description


def test_a_comment_describes_the_key_below_it_only() -> None:
    rows = chartdocs.value_rows("# the answer\na: 1\nb: 2\n# block\nc:\n  # inner\n  d: [1]\n")
    assert [(r.key, r.description, r.default) for r in rows] == [
        ("a", "the answer", "`1`"), ("b", "", "`2`"), ("c", "block", ""), ("c.d", "inner", "`[1]`")]
