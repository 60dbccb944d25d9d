"""Does a live object still carry everything we would apply? Decides whether a write is needed at all."""

from __future__ import annotations

from typing import Any


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
