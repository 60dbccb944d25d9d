"""Kubernetes string formats, written once and used twice: as CEL rules at admission and as Python checks.

Every spec field that ends up in an owned object is checked here against what the API server (or, for
image references, the kubelet) would refuse downstream, so a bad value is refused when it is applied,
with a message naming the field, instead of failing later in a Deployment nobody is watching.

The patterns mirror k8s.io/apimachinery v0.36 (pkg/util/validation) and distribution/reference, written
without backslashes or quotes so that one string is both a Python and a CEL (RE2) regular expression.
CEL's `matches` searches, so rules anchor the pattern; Python uses `fullmatch`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from pydantic import AfterValidator, Field
from pydantic.config import JsonDict

from specdec_operator.api.base import cel

_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = f"{_DNS1123_LABEL}([.]{_DNS1123_LABEL})*"
# The name part of a qualified name (label and annotation keys): at most 63 characters.
_QUALIFIED_NAME_PART = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_CONFIG_KEY = "[-._a-zA-Z0-9]+"
# distribution/reference: [domain[:port]/]path[:tag][@digest]; repository paths are lowercase. A bracketed
# IPv6 registry host is not accepted.
_DOMAIN_COMPONENT = "([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = "[a-z0-9]+(([._]|__|[-]+)[a-z0-9]+)*"
_IMAGE = (
    f"({_DOMAIN_COMPONENT}([.]{_DOMAIN_COMPONENT})*(:[0-9]+)?/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*"
    "(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?"
)
# resource.ParseQuantity: sign, digits with at most one '.', then an SI, binary or exponent suffix.
QUANTITY_PATTERN = (
    "(?P<sign>[+-]?)(?P<int>[0-9]*)([.](?P<frac>[0-9]*))?(?P<suffix>[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE]?)"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


@dataclass(frozen=True)
class KubeFormat:
    """A string format: every pattern must match the whole string, which is at most `max_length` long."""

    patterns: tuple[str, ...]
    max_length: int
    description: str
    # Endings refused on top of the patterns (RE2 has no lookaround to say "does not end with").
    refused_suffixes: tuple[str, ...] = ()

    def valid(self, text: str) -> bool:
        return (
            len(text) <= self.max_length
            and all(re.fullmatch(p, text) for p in self.patterns)
            and not text.endswith(self.refused_suffixes)
        )

    def cel(self, expr: str) -> str:
        """A CEL expression that holds when the string `expr` has this format."""
        matches = [f"{expr}.matches('^({p})$')" for p in self.patterns]
        endings = [f"!{expr}.endsWith('{suffix}')" for suffix in self.refused_suffixes]
        return " && ".join([f"size({expr}) <= {self.max_length}", *matches, *endings])


DNS1123_LABEL = KubeFormat((_DNS1123_LABEL,), 63, "a DNS-1123 label (lowercase letters, digits and '-', at most 63)")
DNS1123_SUBDOMAIN = KubeFormat(
    (_DNS1123_SUBDOMAIN,), 253, "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253)"
)
# [prefix/]name: the prefix a DNS-1123 subdomain of at most 253 characters, the name at most 63.
QUALIFIED_NAME = KubeFormat(
    (f"({_DNS1123_SUBDOMAIN}/)?{_QUALIFIED_NAME_PART}", "[^/]*|[^/]{1,253}/.*"),
    253 + 1 + 63,
    "a qualified name: [DNS-subdomain prefix/]name, the name at most 63 letters, digits, '-', '_' or '.' "
    "starting and ending alphanumeric",
)
LABEL_VALUE = KubeFormat(
    (f"({_QUALIFIED_NAME_PART})?",),
    63,
    "a label value: empty, or at most 63 letters, digits, '-', '_' or '.' starting and ending alphanumeric",
)
# A node selector requirement's value: a label value for In and NotIn, an integer for Gt and Lt, whose threshold
# may be negative (`Gt -1` matches every node whose label is a non-negative number).
NODE_SELECTOR_VALUE = KubeFormat(
    (f"({_QUALIFIED_NAME_PART})?|-[0-9]{{1,19}}",),
    63,
    f"{LABEL_VALUE.description}, or for Gt and Lt a negative integer",
)
# RelaxedEnvironmentVariableValidation (GA in 1.34): printable ASCII except '='.
ENV_VAR_NAME = KubeFormat(("[ -<>-~]+",), 256, "at most 256 printable ASCII characters other than '='")
CONFIG_KEY = KubeFormat(
    (_CONFIG_KEY, "[^.].*|[.][^.].*"), 253, "a key: letters, digits, '-', '_' or '.', neither '.' nor starting '..'"
)
IMAGE_REFERENCE = KubeFormat(
    (_IMAGE,), 512, "an image reference such as registry.example.com/team/vllm:0.33.0 or repo/name@sha256:<digest>"
)

# Paths, written so that one pattern also refuses empty, '.' and '..' segments (and so '//' and a trailing
# '/'): a segment is printable ASCII without space or '/', and after at most two leading dots has a character
# that is neither '.' nor '/'. [!-.0-~] is printable ASCII but '/'; [-!-,0-~] is that but '.' too.
_PATH_SEGMENT = "[.]{0,2}[-!-,0-~][!-.0-~]*"
_ABSOLUTE_PATH = f"(/{_PATH_SEGMENT})+"
_RELATIVE_PATH = f"{_PATH_SEGMENT}(/{_PATH_SEGMENT})*"
# huggingface_hub.utils.validate_repo_id (2.4, the one vLLM 0.33 installs): [namespace/]name of ASCII letters,
# digits, '-', '_' and '.', each part starting and ending with a letter, digit or '_' and at most 96 long, no
# '--' nor '..', no '.git' ending. A run of separators alternates '-' and '.'. tests/unit/api/
# test_naming_strings.py holds the hub's verdicts on edge cases; 14,030 generated ids gave no difference.
_HF_SEPARATORS = "(-([.]-)*[.]?|[.](-[.])*-?)"
_HF_PART = f"[A-Za-z0-9_]+({_HF_SEPARATORS}[A-Za-z0-9_]+)*"
_HF_REPO_ID = f"({_HF_PART}/)?{_HF_PART}"
_HF_PART_LENGTHS = "/.*|([^/]{1,96}/)?[^/]{1,96}"  # a path's segments are not capped

# What vLLM loads a model from: a Hugging Face repo id, or a local directory given as an absolute path
# (a relative one would depend on the image's working directory).
MODEL_REFERENCE = KubeFormat(
    (f"{_HF_REPO_ID}|{_ABSOLUTE_PATH}", _HF_PART_LENGTHS),
    512,
    "a Hugging Face repo id ([org/]name of letters, digits, '-', '_' and '.', each part starting and ending "
    "with a letter, digit or '_' and at most 96 characters, without '--' or '..') or an absolute path "
    "without '.' or '..' segments, at most 512 characters, not ending in .git",
    refused_suffixes=(".git",),
)
RELATIVE_PATH = KubeFormat(
    (_RELATIVE_PATH,),
    512,
    "a relative path (printable ASCII without spaces, no leading '/', no empty, '.' or '..' segments, "
    "at most 512 characters)",
)
# --served-model-name: clients send it as the request's "model"; a leading '-' would read as a flag.
SERVED_MODEL_NAME = KubeFormat(
    ("[!-,.-~][!-~]*",),
    253,
    "a name of printable ASCII characters without spaces, not starting with '-', at most 253 characters",
)
# A packaged simulator profile (bursty, bursty.yaml) or a path to a profile file in the image.
SIMULATOR_PROFILE = KubeFormat(
    ("/?[A-Za-z0-9_.][-A-Za-z0-9_.]*(/[A-Za-z0-9_.][-A-Za-z0-9_.]*)*",),
    253,
    "a profile name or file path: letters, digits, '-', '_', '.' and '/', no empty segment, no segment "
    "starting with '-', at most 253 characters",
)


def format_message(fmt: KubeFormat, field: str) -> str:
    return f"{field} must be {fmt.description}"


def formatted(fmt: KubeFormat, field: str) -> tuple[object, object]:
    """Field metadata for a string of this format: the CEL rule at admission and the same check in Python.

    Use as `Annotated[str, *formatted(FMT, "spec.x.y")]`; the message is word for word the same.
    """
    message = format_message(fmt, field)

    def check(value: str) -> str:
        if not fmt.valid(value):
            raise ValueError(message)
        return value

    # maxLength bounds the rule's cost at admission; in Python `check` covers it, with the same message.
    extra: JsonDict = {"maxLength": fmt.max_length, "x-kubernetes-validations": [cel(fmt.cel("self"), message)]}
    return Field(json_schema_extra=extra), AfterValidator(check)


def keys_rule(fmt: KubeFormat, field: str) -> JsonDict:
    """A CEL rule on a map: every key has the format."""
    return cel(f"self.all(k, {fmt.cel('k')})", f"{field} keys must be {fmt.description}")


def check_keys(fmt: KubeFormat, field: str, keys: object) -> None:
    assert isinstance(keys, dict)
    if not all(fmt.valid(key) for key in keys):
        raise ValueError(f"{field} keys must be {fmt.description}")


def is_quantity(text: str) -> bool:
    """CEL's isQuantity: what resource.ParseQuantity accepts."""
    match = _QUANTITY.fullmatch(text)
    return match is not None and bool(match["int"] or match["frac"])


def quantity_value(text: str) -> Fraction:
    """The exact value of a quantity (callers check `is_quantity` first)."""
    match = _QUANTITY.fullmatch(text)
    assert match is not None
    digits, fraction, suffix = match["int"], match["frac"] or "", match["suffix"]
    value = Fraction(int(digits + fraction or "0"), 10 ** len(fraction))
    if suffix.endswith("i"):
        value *= 1024 ** _BINARY_SUFFIXES.index(suffix)
    elif len(suffix) > 1:
        value *= Fraction(10) ** int(suffix[1:])
    else:
        value *= Fraction(10) ** _DECIMAL_EXPONENTS[suffix]
    return -value if match["sign"] == "-" else value
