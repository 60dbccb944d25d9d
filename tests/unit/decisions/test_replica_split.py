"""The pure rule that spreads a model-wide replica count over its pools (capacity, per-pool bounds, order)."""

from __future__ import annotations

import pytest

from specdec_operator.decisions.replica_split import ReplicaSplit, split_replicas


@pytest.mark.parametrize(
    ("total", "slots", "bounds", "expected", "unplaced"),
    [
        # No bounds: fill in gfxTargets order, as totalReplicas always did.
        (3, (2, 8), (0, None), (2, 1), 0),
        (2, (8, 4), (0, None), (2, 0), 0),
        (9, (4, 4), (0, None), (4, 4), 1),
        (0, (4, 4), (0, None), (0, 0), 0),
        # A floor keeps every pool warm before the preferred pool takes the rest.
        (4, (8, 8), (1, None), (3, 1), 0),
        (6, (8, 8, 8), (2, None), (2, 2, 2), 0),
        # The scaler's count is the count that runs: a total below the floors leaves later pools short.
        (1, (8, 8), (1, None), (1, 0), 0),
        (3, (8, 8, 8), (2, None), (2, 1, 0), 0),
        # A ceiling spreads a large count over more pools.
        (5, (8, 8), (0, 3), (3, 2), 0),
        (7, (8, 8), (0, 3), (3, 3), 1),
        # Capacity caps floors and ceilings alike (a mixed fleet: a small gfx90a pool beside a large gfx942 one).
        (6, (1, 16), (2, 4), (1, 4), 1),
        (6, (0, 16), (1, None), (0, 6), 0),
        (10, (16, 2, 4), (1, 5), (5, 2, 3), 0),
    ],
)
def test_split(total: int, slots: tuple[int, ...], bounds: tuple[int, int | None],
               expected: tuple[int, ...], unplaced: int) -> None:
    assert split_replicas(total, slots, *bounds) == ReplicaSplit(expected, unplaced)


@pytest.mark.parametrize(
    ("total", "slots", "bounds"), [(4, (8,), (3, 2)), (-1, (8,), (0, None)), (1, (-1,), (0, None))]
)
def test_inconsistent_inputs_are_refused(total: int, slots: tuple[int, ...], bounds: tuple[int, int | None]) -> None:
    with pytest.raises(ValueError, match="must not"):
        split_replicas(total, slots, *bounds)


@pytest.mark.parametrize("total", range(0, 30))
def test_the_split_never_loses_or_invents_a_replica(total: int) -> None:
    slots = (3, 0, 7, 2)
    result = split_replicas(total, slots, 1, 5)
    assert sum(result.replicas) + result.unplaced == total
    assert all(r <= min(s, 5) for r, s in zip(result.replicas, slots, strict=True))
