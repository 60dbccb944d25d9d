r"""Sample lines of the Prometheus text exposition format 0.0.4, read strictly and cheaply.

The operator reads a handful of families out of every runtime pod's /metrics on every scrape, on its
event loop. prometheus_client's parser builds Metric objects for whole families and re-scans quoted
text character by character in Python, which costs milliseconds per body. This reader looks only at
the sample lines whose metric name is wanted, reads each label set once per body (the same label text
repeats on many lines) and reads values written as prometheus_client writes them without a regex.

Grammar (what Prometheus's own Go parser accepts for a sample line):

    line   = name ([blanks] "{" [blanks] [label ([blanks] "," [blanks] label)* [[blanks] ","]] [blanks] "}"
                   [blanks] | blanks) value [blanks timestamp] [blanks]
    label  = label_name [blanks] "=" [blanks] '"' escaped text '"'

with blanks being spaces and tabs; label names `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved,
which also covers `__name__`) and not repeated in one line; label values escaping only `\\`, `\"` and
`\n`; values in Go float syntax (decimal, exponent, `Inf`/`Infinity` with a sign, `NaN`), no `_`, no hex,
and no finite literal too large for a float; the timestamp an integer (milliseconds), not read.

Deliberately not read: comment lines (`# HELP`, `# TYPE`, any other `#` line) and blank lines. Names
are taken as the sample lines write them: prometheus_client would rename the samples of a family
declared `# TYPE x counter` to `x_total`, Prometheus itself does not, and vLLM (through
prometheus_client's exposition) always writes counters' samples and TYPE lines with `_total`. A line
that starts with a blank names no metric and is skipped like any other unwanted line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Set

# Label names starting with "__" are reserved (that covers __name__, which would rename the sample).
_LABEL_NAME = r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*"
_EXPONENT = r"(?:[eE][+-]?[0-9]+)?"
_INFINITY = r"[iI][nN][fF](?:[iI][nN][iI][tT][yY])?"
_FLOAT = rf"[+-]?(?:[0-9]+(?:\.[0-9]*)?{_EXPONENT}|\.[0-9]+{_EXPONENT}|{_INFINITY})|[nN][aA][nN]"
# What follows the label set, or the name when there is none: the value, maybe a timestamp.
_VALUE = re.compile(rf"[ \t]*({_FLOAT})(?:[ \t]+[+-]?[0-9]+)?[ \t]*")
# A value written as prometheus_client writes finite numbers: one blank, then these characters only.
# On them Python's float() and Go's ParseFloat accept the same strings, so no expression is needed.
_DECIMAL_CHARACTERS = "0123456789.eE+-"
_BLANKS = " \t"


def _label_grammar(value_text: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(a whole label set between its braces, one label of an accepted set) for values `value_text`."""
    label = rf'{_LABEL_NAME}[ \t]*=[ \t]*"{value_text}"'
    label_set = re.compile(rf"[ \t]*(?:{label}[ \t]*,[ \t]*)*(?:{label}[ \t]*)?")
    return label_set, re.compile(rf'({_LABEL_NAME})[ \t]*=[ \t]*"({value_text})"')


# Two spellings of one grammar. Python's regex engine scans `[^"]*` several times faster than
# `[^"\\]*`, so label sets without a backslash (nearly all) use the first; the second reads escapes.
_PLAIN_LABEL_SET, _PLAIN_LABEL = _label_grammar(r'[^"]*')
_ESCAPED_LABEL_SET, _ESCAPED_LABEL = _label_grammar(r'[^"\\]*(?:\\[\\"n][^"\\]*)*')
# One label of a set written as prometheus_client writes them, `name="value",name="value"`, split
# at `",` and without its closing quote. Such a set needs no whole-set expression: in it `",` ends a
# value and nothing else, since a value without backslashes holds no quote.
_WRITTEN_LABEL = re.compile(rf'({_LABEL_NAME})="([^"]*)')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
_NAME_BEFORE_BLANK = re.compile(r"[^ \t]*")

# A label set as (name, value) pairs, names unique, values unescaped: a set, as Prometheus sees it, so
# two lines writing one series with the labels in another order or spelling compare equal.
Labels = frozenset[tuple[str, str]]
NO_LABELS: Labels = frozenset()
# name, labels, value
Sample = tuple[str, Labels, float]


class MalformedSample(ValueError):
    """A wanted sample line that is not valid exposition text."""


def parse_samples(text: str, names: Set[str]) -> list[Sample]:
    """The samples of `text` whose metric name is in `names`, in order. Lines of other names are not
    looked at; a wanted line that breaks the grammar raises MalformedSample.

    Lines are split as str.splitlines() splits them, so CRLF bodies read like LF bodies. Samples
    written with the same label text share one Labels object.
    """
    samples: list[Sample] = []
    # Label sets and labels repeat across the lines of a body (every line names the model).
    label_sets: dict[str, Labels] = {}
    written_labels: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        # The name ends at the first "{", blank or tab; most lines have labels, so split at "{" first.
        name = line.partition("{")[0]
        if name not in names:
            if line.startswith("#") or (" " not in name and "\t" not in name):
                continue
            name = _NAME_BEFORE_BLANK.match(name).group()  # type: ignore[union-attr]  # matches ""
            if name not in names:
                continue
        # In a valid line the label set closes at the last "}": none can follow in value or timestamp.
        head, brace, rest = line.rpartition("}")
        if brace:
            opening = head.find("{", len(name))
            if opening != len(name) and (opening < 0 or head[len(name) : opening].strip(_BLANKS)):
                raise MalformedSample(f"malformed sample line {line[:200]!r}")
            label_text = head[opening + 1 :]
            labels = label_sets.get(label_text)
            if labels is None:
                labels = label_sets[label_text] = _label_set(label_text, written_labels, line)
        else:
            labels, rest = NO_LABELS, line[len(name) :]
        number = rest[1:]
        if rest[:1] == " " and not number.strip(_DECIMAL_CHARACTERS):
            try:
                value = float(number)
            except ValueError:
                raise MalformedSample(f"malformed value in {line[:200]!r}") from None
        else:
            match = _VALUE.fullmatch(rest)
            if match is None:
                raise MalformedSample(f"malformed sample line {line[:200]!r}")
            value = float(match.group(1))
        if value in _INFINITIES:
            _check_infinity(rest, line)
        samples.append((name, labels, value))
    return samples


def _label_set(text: str, written_labels: dict[str, tuple[str, str]], line: str) -> Labels:
    pairs = _written_label_set(text, written_labels)
    if pairs is None:
        escaped = "\\" in text
        if (_ESCAPED_LABEL_SET if escaped else _PLAIN_LABEL_SET).fullmatch(text) is None:
            raise MalformedSample(f"malformed label set in {line[:200]!r}")
        if escaped:
            pairs = [(name, _ESCAPE.sub(_unescape, value)) for name, value in _ESCAPED_LABEL.findall(text)]
        else:
            pairs = _PLAIN_LABEL.findall(text)
    if len({name for name, _ in pairs}) != len(pairs):
        raise MalformedSample(f"repeated label name in {line[:200]!r}")
    return frozenset(pairs)


def _written_label_set(text: str, written_labels: dict[str, tuple[str, str]]) -> list[tuple[str, str]] | None:
    """The labels of a set written as prometheus_client writes them; None for any other spelling."""
    if not text.endswith('"') or "\\" in text:
        return None
    pairs: list[tuple[str, str]] = []
    for written in text[:-1].split('",'):
        pair = written_labels.get(written)
        if pair is None:
            match = _WRITTEN_LABEL.fullmatch(written)
            if match is None:
                return None
            pair = written_labels[written] = (match[1], match[2])
        pairs.append(pair)
    return pairs


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPED[match.group(1)]


_INFINITIES = (math.inf, -math.inf)


def _check_infinity(rest: str, line: str) -> None:
    if not any(letter in rest for letter in "iI"):
        # Go's ParseFloat refuses a finite literal beyond the float range; Python reads it as inf.
        raise MalformedSample(f"value out of range in {line[:200]!r}")
