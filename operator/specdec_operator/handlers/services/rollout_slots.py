"""Which models of this install have a rollout in flight, for the fleet's limit (settings.max_concurrent_rollouts).

The pure side is reconcile/rollout_limit.py. Here: each pass reads a snapshot (`in_flight`) right after gather's
last await (handlers/reconciler.py reconcile), and says what its plan does (`record`) right after the evaluation,
before its first write: no other pass runs in between (one event loop), so two models cannot both take the last
slot. A model keeps its slot until one of its passes plans no rollout (its Deployments all run their template, no
canary) or its loop ends.

This is memory, rebuilt from the watch cache when first read: after a restart the models whose Deployments are
mid-rollout or have a canary hold their slots before any other model's pass can take one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from specdec_operator.handlers.model_memory import ModelKey
from specdec_operator.reconcile.rollout_limit import RolloutsInFlight


class RolloutSlots:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._holders: set[ModelKey] = set()
        self._waiting: set[ModelKey] = set()  # queued models, woken when a slot frees
        self._seeded = False

    def in_flight(self, key: ModelKey, seed: Callable[[], Iterable[ModelKey]]) -> RolloutsInFlight | None:
        """The pass's view of the limit; None without one. `seed`: the models the watch cache shows mid-rollout,
        read once, on first use."""
        if self.limit <= 0:
            return None
        if not self._seeded:
            self._holders.update(seed())
            self._seeded = True
        others = tuple(sorted(f"{namespace}/{name}" for namespace, name in self._holders if (namespace, name) != key))
        return RolloutsInFlight(self.limit, others, holds_slot=key in self._holders)

    def record(self, key: ModelKey, rolls_out: bool | None, queued: bool) -> list[ModelKey]:
        """What the model's plan does; returns the queued models to wake (a slot freed)."""
        if self.limit <= 0 or rolls_out is None:
            return []
        if rolls_out:
            self._holders.add(key)
            self._waiting.discard(key)
            return []
        if queued:
            self._waiting.add(key)  # a queued model holds no slot (RolloutsInFlight.full)
            return []
        return self.release(key)

    def release(self, key: ModelKey) -> list[ModelKey]:
        """The model's rollout ended (or its loop did): its slot frees, and every queued model gets to look."""
        self._waiting.discard(key)
        if key not in self._holders:
            return []
        self._holders.discard(key)
        return sorted(self._waiting)
