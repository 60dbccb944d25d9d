"""Does a live object still carry everything we would apply? Decides whether a write is needed at all.

The API server stores some fields in a normal form (quantities, omitted empty strings). Rendering in
that form already is what keeps `covers` exact: what we apply is then what the server stores.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>\d*)(?:\.(?P<frac>\d*))?(?P<suffix>[eE][+-]?\d+|[KMGTPE]i|[numkMGTPE]?)"
)
_DECIMAL_SUFFIX_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIXES = {exponent: suffix for suffix, exponent in _DECIMAL_SUFFIX_EXPONENTS.items()}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_NANO = Fraction(1, 10**9)
_INT64_MAX = 2**63 - 1


def canonical_quantity(text: str) -> str:
    """A Kubernetes quantity as apimachinery serialises it: "0.5" -> "500m", "1.5Gi" -> "1536Mi".

    Mirrors resource.Quantity's CanonicalizeBytes: binary suffixes stay binary while the value is a
    whole number of at least 1024, decimal exponents stay exponents, everything else is decimal SI;
    the mantissa is an integer and the suffix (a power of 1000 or 1024) as large as possible. Values
    are rounded up to nano precision as the server does. Text that is not a quantity is returned as
    is, so the API server's own error reaches the user.
    """
    match = _QUANTITY.fullmatch(text)
    if match is None or not (match["int"] or match["frac"]):
        return text
    digits, fraction, suffix = match["int"], match["frac"] or "", match["suffix"]
    magnitude = Fraction(int(digits + fraction or "0"), 10 ** len(fraction))
    if suffix.endswith("i"):
        magnitude *= 1024 ** _BINARY_SUFFIXES.index(suffix)
        style = "binary"
    elif len(suffix) > 1:
        magnitude *= Fraction(10) ** int(suffix[1:])
        style = "exponent"
    else:
        magnitude *= Fraction(10) ** _DECIMAL_SUFFIX_EXPONENTS[suffix]
        style = "decimal"
    magnitude = math.ceil(magnitude / _NANO) * _NANO
    if magnitude == 0:
        return "0"
    sign = "-" if match["sign"] == "-" else ""
    if style == "binary":
        magnitude = min(magnitude, Fraction(_INT64_MAX))
        if magnitude < 1024 or magnitude.denominator != 1:
            style = "decimal"  # as the server does, rather than round a binary value
        else:
            return sign + _binary_form(int(magnitude))
    return sign + _decimal_form(magnitude, style == "exponent")


def _binary_form(value: int) -> str:
    power = 0
    while value % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
        value //= 1024
        power += 1
    return f"{value}{_BINARY_SUFFIXES[power]}"


def _decimal_form(magnitude: Fraction, exponent_style: bool) -> str:
    mantissa, exponent = int(magnitude / _NANO), -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    if exponent_style:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    # apimachinery drops the suffix past E (1000E reads back as "1"); we keep the value instead.
    while exponent > max(_DECIMAL_SUFFIXES):
        mantissa *= 1000
        exponent -= 3
    return f"{mantissa}{_DECIMAL_SUFFIXES[exponent]}"


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def covers(live: Any, desired: Any) -> bool:
    """True when every field of `desired` has the same value in `live`.

    The API server adds defaults (imagePullPolicy, terminationMessagePath, ...) that we never set, so
    extra live fields are fine; a missing or different field of ours means drift or a change.
    """
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return _empty(desired) and live is None
        # An empty list or map of ours may be dropped by the server; it carries nothing to compare.
        return all(_empty(value) or covers(live.get(key), value) for key, value in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(
            covers(item_live, item) for item_live, item in zip(live, desired, strict=True)
        )
    return bool(live == desired)
