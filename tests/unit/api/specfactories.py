"""SpeculativeModel spec factories: a minimal valid wire dict, and one deep override per test case."""

from __future__ import annotations

import copy
from typing import Any

from specdec_operator.api.spec import SpeculativeModelSpec

MINIMAL_WIRE: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "placement": {"gfxTargets": ["gfx942"]},
}


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: nested dicts merge, everything else (lists included) replaces."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def spec_wire(**overrides: Any) -> dict[str, Any]:
    """The minimal wire spec with camelCase `overrides` deep-merged in, e.g. speculation={"maxK": 4}."""
    return merged(MINIMAL_WIRE, overrides)


def spec(**overrides: Any) -> SpeculativeModelSpec:
    return SpeculativeModelSpec.model_validate(spec_wire(**overrides))


def drafter_wire(method: str, model: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"method": method, **extra}
    if model is not None:
        body["model"] = model
    return body
