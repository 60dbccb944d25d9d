"""Shared pieces of the differential tests of the /metrics parser (test_exposition*.py).

`reference_parse_metrics` is the old parse_metrics. On real output (the simulator's, the fixtures the
other tests use) the two must agree exactly, # HELP / # TYPE lines included. On crafted and fuzzed
text the reference reads the same lines minus comments (the new parser does not read them), and:
- when every wanted sample line is valid by the exposition grammar, checked here by an independent
  scanner (`valid_line`), both give the same PodSample or both raise MetricsParseError;
- otherwise the new parser raises MetricsParseError (prometheus_client accepts some such lines).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from specdec_operator.tuner.samples import _WANTED_NAMES, MetricsParseError, PodSample, parse_metrics
from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.profile import PACKAGED_PROFILES_DIR, load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from tests.unit.canary.exposition import Scrape, scrape_text
from tests.unit.tuner.factories import metrics_text
from tests.unit.tuner.reference_parser import reference_parse_metrics

PROFILES = sorted(PACKAGED_PROFILES_DIR.glob("*.yaml"))
PARSE_ERROR = "MetricsParseError"


def outcome(parse: Callable[[str], PodSample], text: str) -> str:
    """What a parser makes of text, comparable across parsers (repr keeps NaN and -0.0 apart)."""
    try:
        return repr(parse(text))
    except MetricsParseError:
        return PARSE_ERROR


def reference_without_comments(text: str) -> PodSample:
    return reference_parse_metrics(text, comments=False)


# --- an independent reading of the grammar (Prometheus's Go text parser), for the fuzzed text ---

_GO_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_GO_INTEGER = re.compile(r"[+-]?[0-9]+")


def _go_float(token: str) -> bool:
    unsigned = token[1:] if token[:1] in "+-" else token
    if unsigned.lower() in ("inf", "infinity") or token.lower() == "nan":
        return True
    return _GO_DECIMAL.fullmatch(token) is not None and math.isfinite(float(token))


def valid_line(line: str, name: str) -> bool:
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


def sample_name(line: str) -> str:
    return re.match(r"[^{ \t]*", line).group()  # type: ignore[union-attr]


def wanted_lines_valid(text: str) -> bool:
    return all(
        valid_line(line, sample_name(line)) for line in text.splitlines() if sample_name(line) in _WANTED_NAMES
    )


def assert_agrees_or_is_stricter(text: str) -> None:
    new = outcome(parse_metrics, text)
    if wanted_lines_valid(text):
        assert new == outcome(reference_without_comments, text), text
    else:
        assert new == PARSE_ERROR, text



def simulator_body(profile_index: int, k: int, *, seconds: float = 90.0) -> str:
    profile = load_profile(PROFILES[profile_index])
    spec = SpeculativeSettings(method="eagle3", model="org/drafter", num_speculative_tokens=k) if k else None
    replica = VirtualReplica(profile, spec, model_name="meta-llama/Llama-3.1-8B-Instruct", seed=profile_index * 8 + k)
    replica.advance_to(profile.restart_s + seconds)
    return replica.metrics_text()


def data_parallel(body: str, engines: int) -> str:
    """The body as a pod with `engines` data-parallel engines serves it: each sample line once per engine."""
    samples = [line for line in body.splitlines() if line and not line.startswith("#")]
    extra = [line.replace('engine="0"', f'engine="{engine}"') for engine in range(1, engines) for line in samples]
    return body + "".join(line + "\n" for line in extra)



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
