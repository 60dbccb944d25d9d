"""What a status write sends (pure): a merge patch that also removes keys, and the bounded stats refresh.

Status is computed whole each reconcile. The patch to get from the stored status to it sends changed
values, and an explicit null for every key the new status no longer has, so removed fields disappear.
Lists are replaced whole (we compute them whole). Live statistics change with every scrape; they ride
along with any other change and otherwise reach status at a bounded rate.
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


def status_to_write(
    stored: Mapping[str, Any], computed: Mapping[str, Any], stats_due: bool
) -> tuple[dict[str, Any], bool]:
    """(the status to store, whether it carries fresh statistics). Fresh statistics go out whenever anything
    else changes too, or when their refresh is due; otherwise the stored ones are kept and nothing is written."""
    if stats_due or without_live_stats(stored) != without_live_stats(computed):
        return dict(computed), True
    return with_live_stats_of(computed, stored), False
