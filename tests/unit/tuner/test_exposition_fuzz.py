"""Fuzzed /metrics text: the parser (tuner/exposition.py) agrees with the prometheus_client path it
replaced or, where a wanted line breaks the grammar, refuses the body; see differential.py."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.tuner.samples import _WANTED_NAMES, parse_metrics
from tests.unit.tuner.differential import (
    FIXTURE_BODIES,
    PARSE_ERROR,
    assert_agrees_or_is_stricter,
    data_parallel,
    outcome,
    sample_name,
    simulator_body,
)
from tests.unit.tuner.factories import metrics_text

_BASE = metrics_text()

_TRICKY = ['"', "\\", "{", "}", ",", "=", " ", "\t", "#", "\n", "\r", ".", "e", "E", "+", "-", "_", "0", "9",
           "x", ":", "I", "n", "N", "\u0663", "\xa0", "\x85"]


def _mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    wanted = [i for i, line in enumerate(lines) if sample_name(line) in _WANTED_NAMES]
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
    simulator_body(7, 3),
    data_parallel(simulator_body(8, 2), 2),
]


@pytest.mark.parametrize("base", range(len(_FUZZ_BASES)))
def test_mutated_bodies_agree_or_are_refused(base: int) -> None:
    rng = random.Random(12 + base)
    refused = 0
    for _ in range(600):
        text = _mutate(_FUZZ_BASES[base], rng)
        assert_agrees_or_is_stricter(text)
        refused += outcome(parse_metrics, text) == PARSE_ERROR
    assert 0 < refused < 600  # the mutations reach both sides


def test_truncated_bodies_agree_at_every_cut() -> None:
    body = FIXTURE_BODIES["canary-traffic"]
    for cut in range(0, len(body), 7):
        assert_agrees_or_is_stricter(body[:cut])
        assert_agrees_or_is_stricter(body[:cut] + "\n")


def _mostly(valid: st.SearchStrategy[str], invalid: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Seven draws in eight from the valid pool: a line has several pieces, and about half the
    generated lines should be valid so that both sides of the comparison are exercised."""
    return st.integers(0, 7).flatmap(lambda n: invalid if n == 0 else valid)


# Each piece is drawn from a valid and an invalid pool.
_LABEL_NAMES = _mostly(
    st.sampled_from(["engine", "model_name", "le", "position", "finished_reason", "status", "_", "a_b9"]),
    st.sampled_from(["a:b", "__x", "9a", "", "a-b"]),
)
_LABEL_VALUES = _mostly(
    st.lists(st.sampled_from(["\\\\", '\\"', "\\n", "{", "}", ",", "=", " ", "0", "x", "+Inf", "☃", "#"]),
             max_size=6).map("".join),
    st.lists(st.sampled_from(['"', "\\", "\\t", "n", "{", "}", ",", "=", " ", "0", "1", "x"]), max_size=6).map("".join),
)
_BLANK = st.sampled_from(["", " ", "\t", "  "])
_VALUES = _mostly(
    st.sampled_from(["0", "1", "7.5", "-1", "1e3", "1E-2", ".5", "5.", "+Inf", "-Inf", "Inf", "infinity", "NaN",
                     "nan", "-0", "1.7e308", "1e-400", "123456789012345678901234567890"]),
    st.sampled_from(["-nan", "1e400", "1_0", "0x1", "", "x", "--1", "1.2.3", "\u0663", "1" * 400]),
)
_TIMESTAMPS = _mostly(
    st.sampled_from(["", " 1764500000000", " -1", "\t7", " +3"]), st.sampled_from([" 1.5", " x", " 1 2", " 1e3"])
)
_SEPARATORS = _mostly(st.sampled_from([",", " , ", ",\t"]), st.sampled_from([",,", "", " "]))


@st.composite
def _sample_lines(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(sorted(_WANTED_NAMES)))
    if draw(st.booleans()):
        labels = [
            f'{draw(_LABEL_NAMES)}{draw(_BLANK)}={draw(_BLANK)}"{draw(_LABEL_VALUES)}"'
            for _ in range(draw(st.integers(0, 4)))
        ]
        separator = draw(_SEPARATORS)
        trailing = draw(st.sampled_from(["", ","]))
        head = f"{name}{draw(_BLANK)}{{{draw(_BLANK)}{separator.join(labels)}{trailing}{draw(_BLANK)}}}"
    else:
        head = name
    return f"{head}{draw(_BLANK)} {draw(_VALUES)}{draw(_TIMESTAMPS)}{draw(_BLANK)}"


@settings(max_examples=800, deadline=None)
@given(st.lists(_sample_lines(), min_size=1, max_size=4), st.integers(0, 2))
def test_generated_lines_agree_or_are_refused(lines: list[str], where: int) -> None:
    added = "".join(line + "\n" for line in lines)
    text = [added, _BASE + added, added + _BASE][where]
    assert_agrees_or_is_stricter(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([*_TRICKY, "vllm:generation_tokens_total", "vllm:num_requests_running", 'engine="0"', "1"]),
        max_size=30,
    ).map("".join)
)
def test_arbitrary_wanted_text_agrees_or_is_refused(noise: str) -> None:
    assert_agrees_or_is_stricter(_BASE + noise + "\n")
    assert_agrees_or_is_stricter("vllm:num_requests_running" + noise + "\n")
