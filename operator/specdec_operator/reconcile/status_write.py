"""What a status write sends (pure): a merge patch that also removes keys, and the bounded stats refresh.

Status is computed whole each reconcile. The patch to get from the stored status to it sends changed
values, and an explicit null for every key the new status no longer has, so removed fields disappear.
Lists are replaced whole (we compute them whole). Live statistics change with every scrape; they ride
along with any other change, and otherwise reach status only when what the tuner decides from (acceptance,
mean accepted length, traffic present or not) has moved past a tolerance since it was stored, at most once
per period (handlers/writes.py: after a model's provisional first figures, one refresh may come sooner).
Throughput follows the offered load, not the speculation, so it never causes a write by itself. A settled
fleet thus writes nothing whatever its load does: the exact, fresh figures are on the operator's /metrics.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

# Paths (under status) of figures that change with traffic, not with a decision or a condition.
LIVE_SPECULATION_KEYS = ("acceptanceRate", "meanAcceptedLength", "tokensPerSecond", "pools")
LIVE_SUMMARY_KEYS = ("acceptance",)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch turning `old` into `new`; empty when they are equal."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif before != value or key not in old:
            patch[key] = copy.deepcopy(value)
    return patch


def without_live_stats(status: Mapping[str, Any]) -> dict[str, Any]:
    stripped = copy.deepcopy(dict(status))
    speculation = stripped.get("speculation")
    if isinstance(speculation, dict):
        for key in LIVE_SPECULATION_KEYS:
            speculation.pop(key, None)
    summary = stripped.get("summary")
    if isinstance(summary, dict):
        for key in LIVE_SUMMARY_KEYS:
            summary.pop(key, None)
    return stripped


def with_live_stats_of(status: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """`status` with the live statistics of `source` (the stored status): used while a refresh is not due."""
    merged = without_live_stats(status)
    for section, keys in (("speculation", LIVE_SPECULATION_KEYS), ("summary", LIVE_SUMMARY_KEYS)):
        kept = source.get(section)
        if not isinstance(kept, Mapping):
            continue
        target = merged.setdefault(section, {})
        for key in keys:
            if key in kept:
                target[key] = copy.deepcopy(kept[key])
    return merged


# How far live statistics may drift from the stored ones before a refresh is worth a write. Acceptance
# rates are fractions (0.05 is five points, what the printer column's percentage can show at a glance);
# mean accepted length moves with the prompt mix, so it gets a relative band. tokensPerSecond has no band:
# it moves with every change in offered load (a diurnal curve, a client's retry storm), which is a number
# for /metrics, not a status change; it is refreshed whenever anything else is written.
ACCEPTANCE_TOLERANCE = 0.05
ACCEPTED_LENGTH_TOLERANCE = 0.10
_ABSOLUTE_KEYS = ("acceptanceRate",)
_RELATIVE_KEYS = (("meanAcceptedLength", ACCEPTED_LENGTH_TOLERANCE),)


def _figure_moved(old: Any, new: Any, tolerance: float, relative: bool) -> bool:
    if old is None or new is None:
        return (old is None) != (new is None)
    if not isinstance(old, int | float) or not isinstance(new, int | float):
        return bool(old != new)
    band = tolerance * max(abs(float(old)), abs(float(new))) if relative else tolerance
    return abs(float(new) - float(old)) > band


def _figures_moved(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    if any(_figure_moved(old.get(key), new.get(key), ACCEPTANCE_TOLERANCE, False) for key in _ABSOLUTE_KEYS):
        return True
    return any(_figure_moved(old.get(key), new.get(key), band, True) for key, band in _RELATIVE_KEYS)


def _pool_stats_moved(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    # Per-position acceptance and the recommended K are left out: deep positions see few drafts and the
    # recommendation flips between near-equal Ks with every window, so they would refresh status all the
    # time. They ride along with any other refresh; /metrics has them fresh, lastDecision has what acted.
    if _figures_moved(old, new):
        return True
    return (int(old.get("drafts") or 0) > 0) != (int(new.get("drafts") or 0) > 0)  # traffic started or stopped


def live_stats_moved(stored: Mapping[str, Any], computed: Mapping[str, Any]) -> bool:
    """Whether `computed`'s live statistics differ from `stored`'s by more than the tolerances: a new or
    vanished figure or pool, traffic starting or stopping, or a figure outside its band."""
    old = stored.get("speculation") or {}
    new = computed.get("speculation") or {}
    if _figures_moved(old, new):
        return True
    old_pools = {p.get("pool"): p for p in old.get("pools") or [] if isinstance(p, Mapping)}
    new_pools = {p.get("pool"): p for p in new.get("pools") or [] if isinstance(p, Mapping)}
    if old_pools.keys() != new_pools.keys():
        return True
    return any(_pool_stats_moved(old_pools[pool], new_pools[pool]) for pool in new_pools)


def first_statistics(stored: Mapping[str, Any], computed: Mapping[str, Any]) -> bool:
    """A model's acceptance becomes known for the first time: worth a write at once, not after a period
    (once per model, unless its pools stop reporting altogether)."""
    def known(status: Mapping[str, Any]) -> bool:
        return (status.get("speculation") or {}).get("acceptanceRate") is not None
    return known(computed) and not known(stored)


def write_cause(stored: Mapping[str, Any], written: Mapping[str, Any]) -> str:
    """Why a status write happens: `state` (a decision, a condition, pools, the canary: anything but live
    statistics), `first_statistics` (acceptance became known) or `statistics` (a due refresh that moved)."""
    if without_live_stats(stored) != without_live_stats(written):
        return "state"
    return "first_statistics" if first_statistics(stored, written) else "statistics"


def status_to_write(
    stored: Mapping[str, Any], computed: Mapping[str, Any], stats_due: bool
) -> tuple[dict[str, Any], bool]:
    """(the status to store, whether it carries fresh statistics). Fresh statistics go out whenever anything
    else changes too, when acceptance is first known, or when their refresh is due and they have moved past
    the tolerances; otherwise the stored ones are kept and nothing is written."""
    if without_live_stats(stored) != without_live_stats(computed):
        return dict(computed), True
    if first_statistics(stored, computed):
        return dict(computed), True
    if stats_due and live_stats_moved(stored, computed):
        return dict(computed), True
    return with_live_stats_of(computed, stored), False
