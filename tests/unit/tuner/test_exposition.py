"""The /metrics parser (tuner/exposition.py) against the prometheus_client path it replaced, on real
output and on the corners of the grammar; see differential.py for what "agree" means."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.openmetrics.exposition import generate_latest

from specdec_operator.tuner.exposition import parse_samples
from specdec_operator.tuner.samples import MetricsParseError, parse_metrics
from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.profile import load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from tests.unit.tuner.differential import (
    FIXTURE_BODIES,
    PARSE_ERROR,
    PROFILES,
    assert_agrees_or_is_stricter,
    data_parallel,
    outcome,
    reference_without_comments,
    simulator_body,
    wanted_lines_valid,
)
from tests.unit.tuner.factories import metrics_text
from tests.unit.tuner.reference_parser import reference_parse_metrics

# --- real output: identical to the old path, comments and all ---

@pytest.mark.parametrize("k", range(8))
@pytest.mark.parametrize("profile", range(len(PROFILES)), ids=[path.stem for path in PROFILES])
def test_simulator_output_parses_as_before(profile: int, k: int) -> None:
    body = simulator_body(profile, k)
    new = parse_metrics(body)
    assert repr(new) == repr(reference_parse_metrics(body))
    assert new.complete, new.problems
    assert new.k == k
    # The e2e-traffic profiles have no virtual load: their tokens come only from requests, and none are sent here.
    assert new.generation_tokens or not any(segment.concurrency for segment in load_profile(PROFILES[profile]).load)


@pytest.mark.parametrize("engines", [2, 4])
@pytest.mark.parametrize("k", [0, 3, 7])
def testdata_parallel_simulator_output_parses_as_before(k: int, engines: int) -> None:
    single = simulator_body(7, k, seconds=300.0)
    body = data_parallel(single, engines)
    new = parse_metrics(body)
    assert repr(new) == repr(reference_parse_metrics(body))
    tokens = parse_metrics(single).generation_tokens
    assert tokens and new.generation_tokens == engines * tokens


def test_output_after_a_restart_and_more_traffic_parses_as_before() -> None:
    replica = VirtualReplica(
        load_profile(PROFILES[7]),
        SpeculativeSettings(method="eagle3", model="d", num_speculative_tokens=4),
        model_name="m",
        seed=9,
    )
    for t in (200.0, 900.0, 3700.0):
        replica.advance_to(t)
        body = replica.metrics_text()
        assert repr(parse_metrics(body)) == repr(reference_parse_metrics(body))
    replica.restart(SpeculativeSettings(method="eagle3", model="d", num_speculative_tokens=2), at=3800.0)
    replica.advance_to(4200.0)
    body = replica.metrics_text()
    assert repr(parse_metrics(body)) == repr(reference_parse_metrics(body))
    assert parse_metrics(body).k == 2


@pytest.mark.parametrize("body", FIXTURE_BODIES.values(), ids=FIXTURE_BODIES.keys())
def test_fixture_bodies_parse_as_before(body: str) -> None:
    assert outcome(parse_metrics, body) == outcome(reference_parse_metrics, body)


# --- crafted lines: the corners of the grammar ---

_BASE = metrics_text()
_GEN = 'vllm:generation_tokens_total{engine="0",model_name="m"} 2850.0'


def _with(line: str, replacing: str = _GEN) -> str:
    assert replacing in _BASE
    return _BASE.replace(replacing, line)


AGREEING = {
    "escapes": r'vllm:generation_tokens_total{engine="0",model_name="a\\b\"c\nd"} 7',
    "comma-brace-equals-in-value": 'vllm:generation_tokens_total{engine="0",model_name="a,b}{c=\\"d\\""} 7',
    "hash-in-value": 'vllm:generation_tokens_total{engine="0",model_name="x # y"} 7',
    "unicode-value": 'vllm:generation_tokens_total{engine="0",model_name="Llamä-3 ☃"} 7',
    "blanks-everywhere": 'vllm:generation_tokens_total \t{ engine = "0" ,\tmodel_name="m" , } \t 7 \t',
    "trailing-comma": 'vllm:generation_tokens_total{engine="0",model_name="m",} 7',
    "labels-reordered": 'vllm:generation_tokens_total{model_name="m",engine="0"} 7',
    "no-labels": "vllm:generation_tokens_total 7",
    "empty-label-set": "vllm:generation_tokens_total{} 7",
    "empty-label-value": 'vllm:generation_tokens_total{engine="",model_name="m"} 7',
    "value-touching-brace": 'vllm:generation_tokens_total{engine="0",model_name="m"}7',
    "exponent": 'vllm:generation_tokens_total{engine="0",model_name="m"} 2.85e3',
    "exponent-signed": 'vllm:generation_tokens_total{engine="0",model_name="m"} 285E+1',
    "exponent-negative": 'vllm:generation_tokens_total{engine="0",model_name="m"} 2850000e-3',
    "leading-dot": 'vllm:generation_tokens_total{engine="0",model_name="m"} .5',
    "trailing-dot": 'vllm:generation_tokens_total{engine="0",model_name="m"} 5.',
    "plus-sign": 'vllm:generation_tokens_total{engine="0",model_name="m"} +7',
    "minus-zero": 'vllm:generation_tokens_total{engine="0",model_name="m"} -0',
    "huge-but-finite": 'vllm:generation_tokens_total{engine="0",model_name="m"} 1.7e308',
    "underflow": 'vllm:generation_tokens_total{engine="0",model_name="m"} 1e-400',
    "plus-inf": 'vllm:generation_tokens_total{engine="0",model_name="m"} +Inf',
    "minus-inf": 'vllm:generation_tokens_total{engine="0",model_name="m"} -Inf',
    "infinity-word": 'vllm:generation_tokens_total{engine="0",model_name="m"} Infinity',
    "nan": 'vllm:generation_tokens_total{engine="0",model_name="m"} NaN',
    "nan-lower": 'vllm:generation_tokens_total{engine="0",model_name="m"} nan',
    "timestamp": 'vllm:generation_tokens_total{engine="0",model_name="m"} 7 1764500000000',
    "negative-timestamp": 'vllm:generation_tokens_total{engine="0",model_name="m"} 7 -5',
    "tab-timestamp": 'vllm:generation_tokens_total{engine="0",model_name="m"}\t7\t1764500000000',
    "negative-value": 'vllm:generation_tokens_total{engine="0",model_name="m"} -7',
    "bare-counter-name": 'vllm:generation_tokens{engine="0",model_name="m"} 7',
    "underscore": 'vllm:generation_tokens_total{engine="0",model_name="m"} 1_000',
    "hex": 'vllm:generation_tokens_total{engine="0",model_name="m"} 0x10',
    "reserved-label": 'vllm:generation_tokens_total{engine="0",model_name="m",__meta="x"} 7',
    "name-label": 'vllm:generation_tokens_total{__name__="x",engine="0"} 7',
    "repeated-label": 'vllm:generation_tokens_total{engine="0",engine="1"} 7',
    "value-garbage": 'vllm:generation_tokens_total{engine="0",model_name="m"} 7x',
    "missing-value": 'vllm:generation_tokens_total{engine="0",model_name="m"}',
    "unclosed-quote": 'vllm:generation_tokens_total{engine="0,model_name="m"} 7',
    "unclosed-brace": 'vllm:generation_tokens_total{engine="0",model_name="m" 7',
    "duplicate-by-reordering": _GEN + '\nvllm:generation_tokens_total{model_name="m",engine="0"} 1',
    "duplicate-by-escaping": 'vllm:generation_tokens_total{engine="0",model_name="a\\"b"} 1\n'
    'vllm:generation_tokens_total{model_name="a\\"b" ,engine="0"} 2',
    "not-duplicate-empty-label": _GEN + '\nvllm:generation_tokens_total{engine="0",model_name="m",x=""} 1',
    "le-exponent": _GEN + '\nvllm:inter_token_latency_seconds_bucket{le="1e-3",engine="1",model_name="m"} 0',
    "crlf": _GEN + "\r",
    "other-family-garbage": _GEN + "\nvllm:e2e_request_latency_seconds_bucket{le=oops}} what\n"
    "  vllm:generation_tokens_total 99",
}

STRICTER = {
    "float-timestamp": 'vllm:generation_tokens_total{engine="0",model_name="m"} 7 1.5',
    "three-tokens": 'vllm:generation_tokens_total{engine="0",model_name="m"} 7 1 2',
    "exemplar": 'vllm:generation_tokens_total{engine="0",model_name="m"} 7 # {trace_id="a"} 1',
    "colon-label-name": 'vllm:generation_tokens_total{engine="0",model:name="m"} 7',
    "quoted-label-name": 'vllm:generation_tokens_total{engine="0","model_name"="m"} 7',
    "unknown-escape": 'vllm:generation_tokens_total{engine="0",model_name="a\\tb"} 7',
    "leading-comma": 'vllm:generation_tokens_total{,engine="0",model_name="m"} 7',
    "lone-comma": "vllm:generation_tokens_total{,} 7",
    "label-without-value": 'vllm:generation_tokens_total{engine=,model_name="m"} 7',
    "overflowing-literal": 'vllm:generation_tokens_total{engine="0",model_name="m"} 1e400',
    "signed-nan": 'vllm:generation_tokens_total{engine="0",model_name="m"} -NaN',
    "unicode-digit": 'vllm:generation_tokens_total{engine="0",model_name="m"} \u0663',
}


@pytest.mark.parametrize("line", AGREEING.values(), ids=AGREEING.keys())
def test_valid_corners_parse_as_before(line: str) -> None:
    text = _with(line)
    assert wanted_lines_valid(text) or outcome(reference_without_comments, text) == PARSE_ERROR
    assert_agrees_or_is_stricter(text)
    assert outcome(parse_metrics, text) == outcome(reference_without_comments, text)


@pytest.mark.parametrize("line", STRICTER.values(), ids=STRICTER.keys())
def test_lines_outside_the_grammar_are_refused_though_prometheus_client_took_them(line: str) -> None:
    text = _with(line)
    assert not wanted_lines_valid(text)
    assert outcome(reference_without_comments, text) != PARSE_ERROR
    with pytest.raises(MetricsParseError, match="not Prometheus text"):
        parse_metrics(text)


def test_label_values_are_read_unescaped_and_label_sets_shared() -> None:
    text = 'x{a="q\\"\\\\\\n",b="}{,="} 1\nx{ b = "}{,=" , a="q\\"\\\\\\n" } 2\nx{a="q\\"\\\\\\n",b="}{,="} 3\n'
    samples = parse_samples(text, {"x"})
    assert samples == [("x", frozenset({("a", 'q"\\\n'), ("b", "}{,=")}), float(value)) for value in (1, 2, 3)]
    assert samples[0][1] is not samples[1][1] and samples[0][1] is samples[2][1]


def test_comment_lines_are_not_read() -> None:
    """prometheus_client renames a counter declared by its bare name to _total and chokes on a
    broken # TYPE line; the new parser reads sample names as written and skips every comment."""
    bare = _BASE.replace(_GEN + "\n", "") + (
        "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens{engine=\"0\",model_name=\"m\"} 7\n"
    )
    assert reference_parse_metrics(bare).generation_tokens == 7
    assert parse_metrics(bare).generation_tokens is None
    assert "vllm:generation_tokens_total missing" in parse_metrics(bare).problems
    broken_comment = _BASE + "# TYPE vllm:generation_tokens_total\n"
    assert outcome(reference_parse_metrics, broken_comment) == PARSE_ERROR
    assert repr(parse_metrics(broken_comment)) == repr(parse_metrics(_BASE))


# --- OpenMetrics: exemplars and timestamps in seconds, in a body that ends with `# EOF` ---

_EOF = "# EOF\n"
_SUCCESS = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"}'
_BUCKET = 'vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"}'

OPENMETRICS = {
    "exemplar": f'{_SUCCESS} 12 # {{trace_id="abc"}} 1.0',
    "exemplar-with-timestamp": f'{_SUCCESS} 12 # {{trace_id="abc"}} 1.0 1764500000.123',
    "timestamp-and-exemplar": f'{_SUCCESS} 12 1764500000.5 # {{trace_id="abc"}} 1.0 1764500000.123',
    "float-seconds-timestamp": f"{_SUCCESS} 12 1764500000.123",
    "integer-seconds-timestamp": f"{_SUCCESS} 12 1764500000",
    "exponent-timestamp": f"{_SUCCESS} 12 1.764500000123e9",
    "exemplar-empty-labels": f"{_SUCCESS} 12 # {{}} 1",
    "exemplar-two-labels": f'{_SUCCESS} 12 # {{trace_id="a",span_id="b"}} 0.25',
    "exemplar-inf-value": f'{_SUCCESS} 12 # {{trace_id="a"}} +Inf',
    "exemplar-braces-in-values": f'{_SUCCESS} 12 # {{trace_id="}} # {{x=\\"1\\"}} 2"}} 1',
    "braces-and-hash-in-the-sample-labels":
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m} 7 # {t=\\"a\\"} 1"} 12'
        ' # {trace_id="abc"} 1',
    "no-labels": 'vllm:request_success_total 12 # {trace_id="abc"} 1 1764500000.123',
}


def _openmetrics_body(*lines: str) -> str:
    return metrics_text(extra_lines=lines) + _EOF


@pytest.mark.parametrize("line", OPENMETRICS.values(), ids=OPENMETRICS.keys())
def test_openmetrics_exemplars_and_timestamps_in_seconds_are_read_and_ignored(line: str) -> None:
    """OpenMetrics writes timestamps in seconds, fractional or not, and may follow a counter's or a bucket's value
    with an exemplar; both were refused as "not Prometheus text"."""
    value_only = line.split(" 12")[0] + " 12"
    expected = parse_metrics(_openmetrics_body(value_only))
    assert expected.requests.finished == 12
    assert parse_metrics(_openmetrics_body(line)) == expected


def test_an_openmetrics_bucket_exemplar_leaves_the_histogram_as_it_is() -> None:
    body = metrics_text() + _EOF
    bucket = next(line for line in body.splitlines() if line.startswith(_BUCKET))
    with_exemplar = body.replace(bucket + "\n", bucket + ' # {trace_id="0af7651916cd43dd"} 0.031 1764500000.123\n')
    assert with_exemplar != body
    assert parse_metrics(with_exemplar) == parse_metrics(body)
    names = {"vllm:inter_token_latency_seconds_bucket"}
    assert parse_samples(with_exemplar, names) == parse_samples(body, names)


OPENMETRICS_MALFORMED = {
    "exemplar-without-value": (f'{_SUCCESS} 12 # {{trace_id="abc"}}', "malformed sample line"),
    "exemplar-without-labels": (f"{_SUCCESS} 12 # 1.0", "malformed sample line"),
    "exemplar-unquoted-value": (f"{_SUCCESS} 12 # {{trace_id=abc}} 1", "malformed sample line"),
    "exemplar-unclosed": (f'{_SUCCESS} 12 # {{trace_id="abc" 1', "malformed sample line"),
    "exemplar-garbage-value": (f'{_SUCCESS} 12 # {{trace_id="abc"}} x', "malformed sample line"),
    "exemplar-two-timestamps": (f'{_SUCCESS} 12 # {{trace_id="abc"}} 1 2 3', "malformed sample line"),
    "exemplar-after-garbage": (f'{_SUCCESS} 12 x # {{trace_id="abc"}} 1', "malformed sample line"),
    "hash-without-blank": (f'{_SUCCESS} 12 #{{trace_id="abc"}} 1', "malformed sample line"),
    "exemplar-repeated-label": (f'{_SUCCESS} 12 # {{a="1",a="2"}} 1', "repeated label name in the exemplar"),
    "exemplar-too-long": (f'{_SUCCESS} 12 # {{trace_id="{"a" * 121}"}} 1', "exemplar labels of 129 characters"),
    "exemplar-bad-escape": (f'{_SUCCESS} 12 # {{trace_id="a\\tb"}} 1', "malformed sample line"),
    "nan-timestamp": (f"{_SUCCESS} 12 NaN", "malformed sample line"),
    "inf-timestamp": (f"{_SUCCESS} 12 +Inf", "malformed sample line"),
    "two-dots-timestamp": (f"{_SUCCESS} 12 1.5.3", "malformed sample line"),
    "three-tokens": (f"{_SUCCESS} 12 1 2", "malformed sample line"),
    "overflow-before-exemplar": (f'{_SUCCESS} 1e400 # {{trace_id="Inf"}} 1', "value out of range"),
    "bad-label-set-before-exemplar": (
        'vllm:request_success_total{engine="0",finished_reason=stop} 12 # {trace_id="abc"} 1', "malformed"),
}


@pytest.mark.parametrize(("line", "reason"), OPENMETRICS_MALFORMED.values(), ids=OPENMETRICS_MALFORMED.keys())
def test_malformed_openmetrics_lines_are_still_refused_with_the_reason(line: str, reason: str) -> None:
    with pytest.raises(MetricsParseError, match=f"not Prometheus text: .*{reason}"):
        parse_metrics(_openmetrics_body(line))


@pytest.mark.parametrize(
    ("line", "reason"),
    [(OPENMETRICS["exemplar"], "an exemplar, which only OpenMetrics has"),
     (OPENMETRICS["exemplar-with-timestamp"], "an exemplar, which only OpenMetrics has"),
     (OPENMETRICS["float-seconds-timestamp"], "a timestamp in seconds, which only OpenMetrics has")],
    ids=["exemplar", "exemplar-with-timestamp", "float-seconds-timestamp"],
)
def test_openmetrics_syntax_in_a_prometheus_text_body_is_refused_saying_why(line: str, reason: str) -> None:
    """The Prometheus text format (a body without `# EOF`) has no exemplars and integer millisecond timestamps, and
    Prometheus refuses such a scrape: so does the operator, naming what it found."""
    with pytest.raises(MetricsParseError, match=f"{reason}.*# EOF"):
        parse_metrics(metrics_text(extra_lines=[line]))


def test_prometheus_clients_own_openmetrics_exemplars_are_read_as_the_samples_without_them() -> None:
    """prometheus_client (vLLM's exporter) writes exemplars with a timestamp in fractional seconds."""
    def body(exemplar: dict[str, str] | None) -> str:
        registry = CollectorRegistry()
        Counter("vllm:request_success", "", ["finished_reason"], registry=registry).labels("stop").inc(
            12, exemplar=exemplar)
        Histogram("vllm:inter_token_latency_seconds", "", registry=registry).observe(0.03, exemplar=exemplar)
        return generate_latest(registry).decode()

    with_exemplars = body({"trace_id": "0af7651916cd43dd8448eb211c80319c"})
    assert ' # {trace_id="0af7651916cd43dd8448eb211c80319c"} 12.0 1' in with_exemplars
    names = {"vllm_request_success_total", "vllm_inter_token_latency_seconds_bucket"}
    samples = parse_samples(with_exemplars, names)
    assert samples == parse_samples(body(None), names) and ("vllm_request_success_total",
                                                            frozenset({("finished_reason", "stop")}), 12.0) in samples
