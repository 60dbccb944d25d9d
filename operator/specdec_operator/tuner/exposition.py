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

OpenMetrics 1.0 (what prometheus_client serves a client that asks for it, Prometheus 2 among them) is read too: a
body whose last line is `# EOF`, which every OpenMetrics body ends with and no Prometheus text body does. Its sample
lines add, per its ABNF,

    line     = name [labels] blanks value [blanks timestamp] [exemplar] [blanks]
    exemplar = blanks "#" blanks "{" [label ("," label)*] "}" blanks value [blanks timestamp]

with the timestamp a real number of seconds (`1764500000.123`, an exponent allowed; no `Inf`, no `NaN`) and an
exemplar's labels, names and values together, at most EXEMPLAR_LABEL_CHARACTERS characters. Exemplars and timestamps
are checked and not read. A Prometheus text body (no `# EOF`) with either is refused, as Prometheus refuses it,
saying what it holds: a body cut from an OpenMetrics scrape with its `# EOF` lost is not read as another format.

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
# OpenMetrics' realnumber: a timestamp in seconds, fractional or not, never Inf or NaN.
_REAL = rf"[+-]?(?:[0-9]+(?:\.[0-9]*)?{_EXPONENT}|\.[0-9]+{_EXPONENT})"
# A value written as prometheus_client writes finite numbers: one blank, then these characters only.
# On them Python's float() and Go's ParseFloat accept the same strings, so no expression is needed.
_DECIMAL_CHARACTERS = "0123456789.eE+-"
_BLANKS = " \t"


def _label_set_text(value_text: str) -> str:
    """The expression of a whole label set between its braces, for values `value_text`."""
    label = rf'{_LABEL_NAME}[ \t]*=[ \t]*"{value_text}"'
    return rf"[ \t]*(?:{label}[ \t]*,[ \t]*)*(?:{label}[ \t]*)?"


def _label_grammar(value_text: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(a whole label set between its braces, one label of an accepted set) for values `value_text`."""
    label_set = re.compile(_label_set_text(value_text))
    return label_set, re.compile(rf'({_LABEL_NAME})[ \t]*=[ \t]*"({value_text})"')


# Two spellings of one grammar. Python's regex engine scans `[^"]*` several times faster than
# `[^"\\]*`, so label sets without a backslash (nearly all) use the first; the second reads escapes.
_PLAIN_LABEL_SET, _PLAIN_LABEL = _label_grammar(r'[^"]*')
_ESCAPED_VALUE = r'[^"\\]*(?:\\[\\"n][^"\\]*)*'
_ESCAPED_LABEL_SET, _ESCAPED_LABEL = _label_grammar(_ESCAPED_VALUE)
# An OpenMetrics line that may hold an exemplar has a second label set: the sample's closes at the first "}" outside
# its quoted values, which this finds (a value holds no unescaped quote, so the match cannot end inside one).
_CLOSED_LABEL_SET = re.compile(rf"[ \t]*\{{({_label_set_text(_ESCAPED_VALUE)})\}}")
# What follows an OpenMetrics sample's label set: value, maybe a timestamp in seconds, maybe an exemplar.
_OPENMETRICS_VALUE = re.compile(
    rf"[ \t]*({_FLOAT})(?:[ \t]+{_REAL})?"
    rf"(?:[ \t]+#[ \t]+\{{({_label_set_text(_ESCAPED_VALUE)})\}}[ \t]+({_FLOAT})(?:[ \t]+{_REAL})?)?[ \t]*"
)
# OpenMetrics 1.0: an exemplar's label names and values together MUST NOT exceed 128 UTF-8 characters.
EXEMPLAR_LABEL_CHARACTERS = 128
OPENMETRICS_EOF = "# EOF"
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
    openmetrics = is_openmetrics(text)
    value_grammar = _OPENMETRICS_VALUE if openmetrics else _VALUE
    for line in text.splitlines():
        # The name ends at the first "{", blank or tab; most lines have labels, so split at "{" first.
        name = line.partition("{")[0]
        if name not in names:
            if line.startswith("#") or (" " not in name and "\t" not in name):
                continue
            name = _NAME_BEFORE_BLANK.match(name).group()  # type: ignore[union-attr]  # matches ""
            if name not in names:
                continue
        try:
            if openmetrics and "#" in line:
                # An exemplar's label set may follow: the sample's own closes at its first "}" outside quotes.
                labels, rest = _openmetrics_labels(line, name, label_sets, written_labels)
            else:
                # In a line without an exemplar the label set closes at the last "}": none can follow in value or
                # timestamp.
                head, brace, rest = line.rpartition("}")
                if brace:
                    opening = head.find("{", len(name))
                    if opening != len(name) and (opening < 0 or head[len(name) : opening].strip(_BLANKS)):
                        raise MalformedSample(f"malformed sample line {line[:200]!r}")
                    label_text = head[opening + 1 :]
                    known = label_sets.get(label_text)
                    if known is None:
                        known = label_sets[label_text] = _label_set(label_text, written_labels, line)
                    labels = known
                else:
                    labels, rest = NO_LABELS, line[len(name) :]
            value_text = rest[1:]
            if rest[:1] == " " and not value_text.strip(_DECIMAL_CHARACTERS):
                try:
                    value = float(value_text)
                except ValueError:
                    raise MalformedSample(f"malformed value in {line[:200]!r}") from None
            else:
                match = value_grammar.fullmatch(rest)
                if match is None:
                    raise MalformedSample(f"malformed sample line {line[:200]!r}")
                value_text = match.group(1)
                value = float(value_text)
                if openmetrics and match.group(2) is not None:
                    _check_exemplar(match.group(2), match.group(3), line)
            if value in _INFINITIES:
                _check_infinity(value_text, line)
        except MalformedSample:
            if not openmetrics:
                _refuse_openmetrics_syntax(line, name)
            raise
        samples.append((name, labels, value))
    return samples


def is_openmetrics(text: str) -> bool:
    """Whether `text` is OpenMetrics: its last line is `# EOF`, as every OpenMetrics body's is and no Prometheus
    text body's."""
    return text.rstrip().rpartition("\n")[2].strip() == OPENMETRICS_EOF


def _openmetrics_labels(
    line: str, name: str, label_sets: dict[str, Labels], written_labels: dict[str, tuple[str, str]]
) -> tuple[Labels, str]:
    """(the labels, what follows them) of an OpenMetrics line that may end with an exemplar."""
    match = _CLOSED_LABEL_SET.match(line, len(name))
    if match is None:
        if line[len(name) :].lstrip(_BLANKS).startswith("{"):
            raise MalformedSample(f"malformed label set in {line[:200]!r}")
        return NO_LABELS, line[len(name) :]
    label_text = match.group(1)
    labels = label_sets.get(label_text)
    if labels is None:
        labels = label_sets[label_text] = _label_set(label_text, written_labels, line)
    return labels, line[match.end() :]


def _check_exemplar(label_text: str, value_text: str, line: str) -> None:
    """An exemplar is not read, only checked: its label set as a sample's, within OpenMetrics' length limit, and a
    value a float can hold."""
    try:
        labels = _label_set(label_text, {}, line)
    except MalformedSample:
        raise MalformedSample(f"repeated label name in the exemplar of {line[:200]!r}") from None
    characters = sum(len(name) + len(value) for name, value in labels)
    if characters > EXEMPLAR_LABEL_CHARACTERS:
        raise MalformedSample(f"exemplar labels of {characters} characters, more than OpenMetrics' "
                              f"{EXEMPLAR_LABEL_CHARACTERS}, in {line[:200]!r}")
    if float(value_text) in _INFINITIES:
        _check_infinity(value_text, line)


def _refuse_openmetrics_syntax(line: str, name: str) -> None:
    """Raise why a Prometheus text line that OpenMetrics would take is refused; return when OpenMetrics would not."""
    try:
        parse_samples(f"{line}\n{OPENMETRICS_EOF}\n", {name})
        labels_and_rest = _openmetrics_labels(line, name, {}, {})
    except MalformedSample:
        return
    match = _OPENMETRICS_VALUE.fullmatch(labels_and_rest[1])
    what = ("an exemplar, which only OpenMetrics has" if match is not None and match.group(2) is not None
            else "a timestamp in seconds, which only OpenMetrics has (Prometheus text: integer milliseconds)")
    raise MalformedSample(f"{what}, in {line[:200]!r}; the body does not end with {OPENMETRICS_EOF!r}, so it is not "
                          "OpenMetrics")


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


def _check_infinity(value_text: str, line: str) -> None:
    if not any(letter in value_text for letter in "iI"):
        # Go's ParseFloat refuses a finite literal beyond the float range; Python reads it as inf.
        raise MalformedSample(f"value out of range in {line[:200]!r}")
