"""The /metrics parser (tuner/exposition.py) against the prometheus_client path it replaced.

`reference_parse_metrics` is the old parse_metrics. On real output (the simulator's, the fixtures the
other tests use) the two must agree exactly, # HELP / # TYPE lines included. On crafted and fuzzed
text the reference reads the same lines minus comments (the new parser does not read them), and:
- when every wanted sample line is valid by the exposition grammar, checked here by an independent
  scanner (`_valid_line`), both give the same PodSample or both raise MetricsParseError;
- otherwise the new parser raises MetricsParseError (prometheus_client accepts some such lines).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.tuner.exposition import parse_samples
from specdec_operator.tuner.samples import _WANTED_NAMES, MetricsParseError, PodSample, parse_metrics
from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.profile import PACKAGED_PROFILES_DIR, load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from tests.unit.canary.exposition import Scrape, scrape_text
from tests.unit.tuner.factories import metrics_text
from tests.unit.tuner.reference_parser import reference_parse_metrics

PROFILES = sorted(PACKAGED_PROFILES_DIR.glob("*.yaml"))
PARSE_ERROR = "MetricsParseError"


def _outcome(parse: Callable[[str], PodSample], text: str) -> str:
    """What a parser makes of text, comparable across parsers (repr keeps NaN and -0.0 apart)."""
    try:
        return repr(parse(text))
    except MetricsParseError:
        return PARSE_ERROR


def _reference_without_comments(text: str) -> PodSample:
    return reference_parse_metrics(text, comments=False)


# --- an independent reading of the grammar (Prometheus's Go text parser), for the fuzzed text ---

_GO_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_GO_INTEGER = re.compile(r"[+-]?[0-9]+")


def _go_float(token: str) -> bool:
    unsigned = token[1:] if token[:1] in "+-" else token
    if unsigned.lower() in ("inf", "infinity") or token.lower() == "nan":
        return True
    return _GO_DECIMAL.fullmatch(token) is not None and math.isfinite(float(token))


def _valid_line(line: str, name: str) -> bool:
    """Whether a sample line whose metric name is `name` follows the 0.0.4 text grammar."""
    i, end = len(name), len(line)

    def blanks(at: int) -> int:
        while at < end and line[at] in " \t":
            at += 1
        return at

    after_name = blanks(i)
    if after_name < end and line[after_name] == "{":
        i, seen = blanks(after_name + 1), set()
        while i < end and line[i] != "}":
            start = i
            while i < end and line[i].isascii() and (line[i].isalnum() or line[i] == "_"):
                i += 1
            label = line[start:i]
            if not label or label[0].isdigit() or label.startswith("__") or label in seen:
                return False
            seen.add(label)
            i = blanks(i)
            if i >= end or line[i] != "=":
                return False
            i = blanks(i + 1)
            if i >= end or line[i] != '"':
                return False
            i += 1
            while i < end and line[i] != '"':
                if line[i] == "\\":
                    if i + 1 >= end or line[i + 1] not in '\\"n':
                        return False
                    i += 1
                i += 1
            if i >= end:
                return False
            i = blanks(i + 1)
            if i < end and line[i] == ",":
                i = blanks(i + 1)
            elif i < end and line[i] != "}":
                return False
        if i >= end:
            return False
        i += 1
    elif after_name == i:
        return False  # the value must be apart from the name
    tokens = [token for token in re.split(r"[ \t]+", line[i:]) if token]
    return (
        len(tokens) in (1, 2)
        and _go_float(tokens[0])
        and (len(tokens) == 1 or _GO_INTEGER.fullmatch(tokens[1]) is not None)
    )


def _sample_name(line: str) -> str:
    return re.match(r"[^{ \t]*", line).group()  # type: ignore[union-attr]


def _wanted_lines_valid(text: str) -> bool:
    return all(
        _valid_line(line, _sample_name(line)) for line in text.splitlines() if _sample_name(line) in _WANTED_NAMES
    )


def _assert_agrees_or_is_stricter(text: str) -> None:
    new = _outcome(parse_metrics, text)
    if _wanted_lines_valid(text):
        assert new == _outcome(_reference_without_comments, text), text
    else:
        assert new == PARSE_ERROR, text


# --- real output: identical to the old path, comments and all ---


def _simulator_body(profile_index: int, k: int, *, seconds: float = 90.0) -> str:
    profile = load_profile(PROFILES[profile_index])
    spec = SpeculativeSettings(method="eagle3", model="org/drafter", num_speculative_tokens=k) if k else None
    replica = VirtualReplica(profile, spec, model_name="meta-llama/Llama-3.1-8B-Instruct", seed=profile_index * 8 + k)
    replica.advance_to(profile.restart_s + seconds)
    return replica.metrics_text()


def _data_parallel(body: str, engines: int) -> str:
    """The body as a pod with `engines` data-parallel engines serves it: each sample line once per engine."""
    samples = [line for line in body.splitlines() if line and not line.startswith("#")]
    extra = [line.replace('engine="0"', f'engine="{engine}"') for engine in range(1, engines) for line in samples]
    return body + "".join(line + "\n" for line in extra)


@pytest.mark.parametrize("k", range(8))
@pytest.mark.parametrize("profile", range(len(PROFILES)), ids=[path.stem for path in PROFILES])
def test_simulator_output_parses_as_before(profile: int, k: int) -> None:
    body = _simulator_body(profile, k)
    new = parse_metrics(body)
    assert repr(new) == repr(reference_parse_metrics(body))
    assert new.complete, new.problems
    assert new.k == k
    assert new.generation_tokens


@pytest.mark.parametrize("engines", [2, 4])
@pytest.mark.parametrize("k", [0, 3, 7])
def test_data_parallel_simulator_output_parses_as_before(k: int, engines: int) -> None:
    single = _simulator_body(7, k, seconds=300.0)
    body = _data_parallel(single, engines)
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


FIXTURE_BODIES = {
    "default": metrics_text(),
    "no-speculation": metrics_text(per_position=None),
    "no-created": metrics_text(created=None),
    "big-counters": metrics_text(drafts=9_999_999.0, per_position=(9e6, 8e6, 7e6, 6e6, 5e6, 4e6, 3e6)),
    "negative": metrics_text(running=-1),
    "missing-position": metrics_text().replace('position="1"', 'position="5"'),
    "canary-empty": scrape_text(Scrape()),
    "canary-traffic": scrape_text(
        Scrape(
            k=3,
            drafts=100.0,
            draft_tokens=300.0,
            accepted_tokens=150.0,
            generation_tokens=250.0,
            tpot_buckets=((0.05, 10.0), (0.1, 20.0), (math.inf, 25.0)),
            finished={"stop": 20.0, "error": 5.0},
            http={"2xx": 20.0, "5xx": 5.0},
        )
    ),
    "canary-no-speculation": scrape_text(Scrape(k=0, generation_tokens=1e9, http={"2xx": 3.0})),
}


@pytest.mark.parametrize("body", FIXTURE_BODIES.values(), ids=FIXTURE_BODIES.keys())
def test_fixture_bodies_parse_as_before(body: str) -> None:
    assert _outcome(parse_metrics, body) == _outcome(reference_parse_metrics, body)


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
    assert _wanted_lines_valid(text) or _outcome(_reference_without_comments, text) == PARSE_ERROR
    _assert_agrees_or_is_stricter(text)
    assert _outcome(parse_metrics, text) == _outcome(_reference_without_comments, text)


@pytest.mark.parametrize("line", STRICTER.values(), ids=STRICTER.keys())
def test_lines_outside_the_grammar_are_refused_though_prometheus_client_took_them(line: str) -> None:
    text = _with(line)
    assert not _wanted_lines_valid(text)
    assert _outcome(_reference_without_comments, text) != PARSE_ERROR
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
    assert _outcome(reference_parse_metrics, broken_comment) == PARSE_ERROR
    assert repr(parse_metrics(broken_comment)) == repr(parse_metrics(_BASE))


# --- fuzzing: mutations of real lines, and lines built from grammar pieces ---

_TRICKY = ['"', "\\", "{", "}", ",", "=", " ", "\t", "#", "\n", "\r", ".", "e", "E", "+", "-", "_", "0", "9",
           "x", ":", "I", "n", "N", "\u0663", "\xa0", "\x85"]


def _mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    wanted = [i for i, line in enumerate(lines) if _sample_name(line) in _WANTED_NAMES]
    for _ in range(rng.randint(1, 3)):
        i = rng.choice(wanted) if rng.random() < 0.9 else rng.randrange(len(lines))
        line = lines[i]
        at = rng.randrange(len(line))
        kind = rng.randrange(4)
        if kind == 0:
            line = line[:at] + line[at + 1 :]
        elif kind == 1:
            line = line[:at] + rng.choice(_TRICKY) + line[at:]
        elif kind == 2:
            line = line[:at] + rng.choice(_TRICKY) + line[at + 1 :]
        else:
            line = line[:at] + line[rng.randrange(len(line)) :]
        lines[i] = line
    return "".join(lines)


_FUZZ_BASES = [
    metrics_text(),
    FIXTURE_BODIES["canary-traffic"],
    _simulator_body(7, 3),
    _data_parallel(_simulator_body(8, 2), 2),
]


@pytest.mark.parametrize("base", range(len(_FUZZ_BASES)))
def test_mutated_bodies_agree_or_are_refused(base: int) -> None:
    rng = random.Random(12 + base)
    refused = 0
    for _ in range(600):
        text = _mutate(_FUZZ_BASES[base], rng)
        _assert_agrees_or_is_stricter(text)
        refused += _outcome(parse_metrics, text) == PARSE_ERROR
    assert 0 < refused < 600  # the mutations reach both sides


def test_truncated_bodies_agree_at_every_cut() -> None:
    body = FIXTURE_BODIES["canary-traffic"]
    for cut in range(0, len(body), 7):
        _assert_agrees_or_is_stricter(body[:cut])
        _assert_agrees_or_is_stricter(body[:cut] + "\n")


_LABEL_NAMES = st.sampled_from(["engine", "model_name", "le", "position", "finished_reason", "status", "a:b",
                                "__x", "_", "9a", ""])
_LABEL_VALUES = st.lists(
    st.sampled_from(['"', "\\", "n", "t", "{", "}", ",", "=", " ", "0", "1", "x", "+Inf", "☃"]), max_size=6
).map("".join)
_BLANK = st.sampled_from(["", " ", "\t", "  "])
_VALUES = st.sampled_from(["0", "1", "7.5", "-1", "1e3", "1E-2", ".5", "5.", "+Inf", "-Inf", "Inf", "infinity",
                           "NaN", "nan", "-nan", "1e400", "1_0", "0x1", "", "x", "--1", "1.2.3", "\u0663"])
_TIMESTAMPS = st.sampled_from(["", " 1764500000000", " -1", " 1.5", "\t7", " x", " 1 2"])


@st.composite
def _sample_lines(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(sorted(_WANTED_NAMES)))
    if draw(st.booleans()):
        labels = [
            f'{draw(_LABEL_NAMES)}{draw(_BLANK)}={draw(_BLANK)}"{draw(_LABEL_VALUES)}"'
            for _ in range(draw(st.integers(0, 4)))
        ]
        separator = draw(st.sampled_from([",", " , ", ",,", ""]))
        trailing = draw(st.sampled_from(["", ","]))
        head = f"{name}{draw(_BLANK)}{{{draw(_BLANK)}{separator.join(labels)}{trailing}{draw(_BLANK)}}}"
    else:
        head = name
    return f"{head}{draw(_BLANK)} {draw(_VALUES)}{draw(_TIMESTAMPS)}{draw(_BLANK)}"


@settings(max_examples=800, deadline=None)
@given(st.lists(_sample_lines(), min_size=1, max_size=6), st.integers(0, 2))
def test_generated_lines_agree_or_are_refused(lines: list[str], where: int) -> None:
    added = "".join(line + "\n" for line in lines)
    text = [added, _BASE + added, added + _BASE][where]
    _assert_agrees_or_is_stricter(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([*_TRICKY, "vllm:generation_tokens_total", "vllm:num_requests_running", 'engine="0"', "1"]),
        max_size=30,
    ).map("".join)
)
def test_arbitrary_wanted_text_agrees_or_is_refused(noise: str) -> None:
    _assert_agrees_or_is_stricter(_BASE + noise + "\n")
    _assert_agrees_or_is_stricter("vllm:num_requests_running" + noise + "\n")
