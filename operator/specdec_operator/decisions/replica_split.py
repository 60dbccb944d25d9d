"""How a model-wide replica count (`spec.placement.totalReplicas`, what `kubectl scale`, an HPA or KEDA set)
is spread over its pools.

The rule, in order:
1. Every pool gets its floor, `minReplicasPerPool` (capped by what its nodes hold), in gfxTargets order while
   the total lasts, so a scaler's count is the count that runs: a total smaller than the floors leaves the
   later pools at fewer.
2. What is left fills pools in gfxTargets order (the user's preference) up to each pool's ceiling, the smaller
   of `maxReplicasPerPool` and what its nodes hold.
3. What still does not fit is reported as unplaced.

Without bounds this is the fill-in-preference-order split `totalReplicas` always had. The function is pure and
knows nothing of nodes: placement computes each pool's slots and calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaSplit:
    replicas: tuple[int, ...]  # per pool, in the order given
    unplaced: int  # replicas of the total that no pool could take


def split_replicas(
    total: int, slots: Sequence[int], min_per_pool: int = 0, max_per_pool: int | None = None
) -> ReplicaSplit:
    """Spread `total` over pools that hold `slots[i]` replicas each (see the module docstring)."""
    if total < 0 or min_per_pool < 0 or any(s < 0 for s in slots):
        raise ValueError("replica counts and slots must not be negative")
    if max_per_pool is not None and max_per_pool < min_per_pool:
        raise ValueError("maxReplicasPerPool must not be below minReplicasPerPool")
    ceilings = [s if max_per_pool is None else min(s, max_per_pool) for s in slots]
    replicas = [0] * len(slots)
    left = total
    for i, ceiling in enumerate(ceilings):
        floor = min(min_per_pool, ceiling, left)
        replicas[i] = floor
        left -= floor
    for i, ceiling in enumerate(ceilings):
        extra = min(ceiling - replicas[i], left)
        replicas[i] += extra
        left -= extra
    return ReplicaSplit(tuple(replicas), left)
