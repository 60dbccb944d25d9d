"""The status write: merge patches that remove keys, and live statistics that move only past a tolerance."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from specdec_operator.reconcile.status_write import (
    first_statistics,
    live_stats_moved,
    merge_patch,
    status_to_write,
    write_cause,
)


def status(acceptance: float | None = 0.70, tokens: float | None = 1200.0, recommended: int | None = 3,
           positions: list[float] | None = None, drafts: int = 5000, k: int = 3) -> dict[str, Any]:
    pool: dict[str, Any] = {"pool": "m-gfx942", "drafts": drafts, "perPositionAcceptance": positions or [0.8, 0.6]}
    if acceptance is not None:
        pool["acceptanceRate"] = acceptance
    if tokens is not None:
        pool["tokensPerSecond"] = tokens
    if recommended is not None:
        pool["recommendedK"] = recommended
    speculation: dict[str, Any] = {"pools": [pool]}
    if acceptance is not None:
        speculation["acceptanceRate"] = acceptance
        speculation["meanAcceptedLength"] = 1 + 2 * acceptance
    if tokens is not None:
        speculation["tokensPerSecond"] = tokens
    return {
        "pools": [{"name": "m-gfx942", "gfxTarget": "gfx942", "drafter": {"method": "eagle3"}, "effectiveK": k}],
        "speculation": speculation,
        "summary": {"acceptance": "" if acceptance is None else f"{acceptance:.0%}", "effectiveK": str(k)},
    }


def test_steady_traffic_noise_is_not_a_move() -> None:
    stored = status()
    # Deep positions and the recommended K flip with every window: they ride along with other refreshes.
    noisy = status(acceptance=0.72, tokens=1300.0, positions=[0.82, 0.38, 0.2], drafts=9000, recommended=4)
    assert not live_stats_moved(stored, noisy)
    wanted, fresh = status_to_write(stored, noisy, stats_due=True)
    assert (wanted, fresh) == (stored, False)
    assert merge_patch(stored, wanted) == {}  # nothing is written


@pytest.mark.parametrize("moved", [
    status(acceptance=0.60),                 # ten points of acceptance
    status(acceptance=0.60, tokens=500.0),   # ... whatever the throughput did
    status(drafts=0),                        # traffic stopped
    status(acceptance=None, tokens=None),    # figures vanished (no samples in the window)
])
def test_a_move_past_the_tolerance_is_written_when_due(moved: dict[str, Any]) -> None:
    stored = status()
    assert live_stats_moved(stored, moved)
    wanted, fresh = status_to_write(stored, moved, stats_due=True)
    assert (wanted, fresh) == (moved, True)
    # Not due yet: the stored figures are kept and nothing is written.
    kept, fresh = status_to_write(stored, moved, stats_due=False)
    assert not fresh and merge_patch(stored, kept) == {}


@pytest.mark.parametrize("tokens", [0.5, 700.0, 4800.0, None])
def test_throughput_alone_never_causes_a_write(tokens: float | None) -> None:
    # Load halving overnight or quadrupling at peak is not a change in the speculation: /metrics has it.
    stored = status()
    loaded = status(tokens=tokens)
    assert not live_stats_moved(stored, loaded)
    wanted, fresh = status_to_write(stored, loaded, stats_due=True)
    assert not fresh and merge_patch(stored, wanted) == {}
    # It rides along, fresh, with the next write that has a reason of its own.
    decided = status(tokens=tokens, k=4)
    wanted, fresh = status_to_write(stored, decided, stats_due=False)
    assert fresh and wanted == decided


def test_first_statistics_and_new_pools_are_moves() -> None:
    empty = {"pools": status()["pools"], "speculation": {"pools": []}, "summary": {"effectiveK": "3"}}
    assert live_stats_moved(empty, status())
    two_pools = status()
    two_pools["speculation"]["pools"].append({**two_pools["speculation"]["pools"][0], "pool": "m-gfx90a"})
    assert live_stats_moved(status(), two_pools)


def test_a_decision_carries_the_fresh_statistics_along_whatever_their_size() -> None:
    stored = status()
    decided = status(acceptance=0.71, k=4)
    wanted, fresh = status_to_write(stored, decided, stats_due=False)
    assert fresh and wanted == decided
    patch = merge_patch(stored, wanted)
    assert patch["pools"][0]["effectiveK"] == 4 and patch["speculation"]["acceptanceRate"] == 0.71


def test_merge_patch_removes_what_the_new_status_no_longer_has() -> None:
    stored = status()
    gone = copy.deepcopy(stored)
    del gone["speculation"]["tokensPerSecond"]
    assert merge_patch(stored, gone) == {"speculation": {"tokensPerSecond": None}}


def test_the_first_known_acceptance_is_written_at_once_not_after_a_period() -> None:
    unknown = status(acceptance=None, tokens=None)
    known = status()
    assert first_statistics(unknown, known) and not first_statistics(known, status(acceptance=0.9))
    wanted, fresh = status_to_write(unknown, known, stats_due=False)
    assert (wanted, fresh) == (known, True)
    # Acceptance becoming unknown again (no samples in the window) waits for the period like any move.
    kept, fresh = status_to_write(known, unknown, stats_due=False)
    assert not fresh and merge_patch(known, kept) == {}


def test_each_write_names_its_cause() -> None:
    unknown, known = status(acceptance=None), status(acceptance=0.70, tokens=1000.0)
    assert write_cause(unknown, known) == "first_statistics"
    assert write_cause(known, status(acceptance=0.60, tokens=1000.0)) == "statistics"
    assert write_cause(known, status(k=5, acceptance=0.60, tokens=1000.0)) == "state"  # a decision moved K
    conditioned = {**known, "conditions": [{"type": "Ready", "status": "False"}]}
    assert write_cause(known, conditioned) == "state"
