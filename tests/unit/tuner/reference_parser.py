"""The operator's /metrics parsing before tuner/exposition.py, kept as the reference that the
differential tests (test_exposition*.py) and hack/bench-parse compare the new parser against.

It is the old `parse_metrics` line for line: the wanted lines are filtered out of the body, joined
and handed to prometheus_client's text parser, and the samples are summed by the old `_collect`.
The sample-building half (`_build_sample`) is shared with the operator: only the parsing changed.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from specdec_operator.tuner.samples import (
    _KEY_LABELS,
    _WANTED_NAMES,
    MetricsParseError,
    PodSample,
    _build_sample,
    _Series,
)


def reference_parse_metrics(text: str, *, comments: bool = True) -> PodSample:
    """The old parse_metrics. With comments=False the # HELP / # TYPE lines are dropped before
    prometheus_client sees them: the new parser does not read them (see differential.py)."""
    if not text.strip():
        raise MetricsParseError("empty /metrics body")
    if not text.endswith("\n"):
        raise MetricsParseError("truncated /metrics body: no final newline")
    try:
        wanted = "".join(
            line + "\n"
            for line in text.splitlines()
            if _line_name(line) in _WANTED_NAMES and (comments or not line.startswith("#"))
        )
        if not wanted:
            raise MetricsParseError("no vLLM metrics in the body")
        series = _collect(s for family in text_string_to_metric_families(wanted) for s in family.samples)
    except MetricsParseError:
        raise
    except Exception as err:  # the parser raises ValueError, IndexError, TypeError... on garbage
        raise MetricsParseError(f"not Prometheus text: {type(err).__name__}: {err}"[:300]) from err
    return _build_sample(series)


def _line_name(line: str) -> str:
    """The metric name a line is about: a sample's name, or the name a # HELP / # TYPE comment describes."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE") else ""
    end = len(line)
    for separator in ("{", " ", "\t"):
        found = line.find(separator)
        if 0 <= found < end:
            end = found
    return line[:end]


def _collect(samples: Iterable[Sample]) -> _Series:
    series: _Series = {}
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for sample in samples:
        identity = (sample.name, frozenset(sample.labels.items()))
        if identity in seen:
            raise MetricsParseError(f"duplicate series {sample.name}{dict(sample.labels)}")
        seen.add(identity)
        key = tuple(sample.labels.get(label, "") for label in _KEY_LABELS)
        by_key = series.setdefault(sample.name, {})
        by_key[key] = by_key.get(key, 0.0) + float(sample.value)
    return series
