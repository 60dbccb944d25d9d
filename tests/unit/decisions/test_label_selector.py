"""The label selector grammar the API server applies to SPECDEC_MODEL_SELECTOR, matched locally."""

from __future__ import annotations

import pytest

from specdec_operator.decisions.label_selector import matches, parse

CASES = [
    ("", {}, True),
    ("specdec.io/shard=a", {"specdec.io/shard": "a"}, True),
    ("specdec.io/shard==a", {"specdec.io/shard": "b"}, False),
    ("specdec.io/shard!=a", {}, True),  # as on the API server: a missing key is "not a"
    ("specdec.io/shard!=a", {"specdec.io/shard": "a"}, False),
    ("specdec.io/shard notin (a)", {}, True),
    ("specdec.io/shard notin (a)", {"specdec.io/shard": "a"}, False),
    ("specdec.io/shard notin (a, b)", {"specdec.io/shard": "c"}, True),
    ("specdec.io/shard in (a,b)", {"specdec.io/shard": "b"}, True),
    ("specdec.io/shard in (a,b)", {}, False),
    ("team", {"team": ""}, True),
    ("!team", {"team": "x"}, False),
    ("!team", {}, True),
    ("tier=gpu, specdec.io/shard in (a,b)", {"tier": "gpu", "specdec.io/shard": "a"}, True),
    ("tier=gpu,specdec.io/shard in (a,b)", {"tier": "cpu", "specdec.io/shard": "a"}, False),
]


@pytest.mark.parametrize(("selector", "labels", "expected"), CASES)
def test_matches_as_the_api_server_does(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert matches(selector, labels) is expected


@pytest.mark.parametrize("selector", ["shard in (a", "shard in a)", "a b", "=a", "shard in (a)) x"])
def test_a_selector_that_does_not_parse_is_refused_naming_it(selector: str) -> None:
    with pytest.raises(ValueError, match="label selector"):
        parse(selector)
