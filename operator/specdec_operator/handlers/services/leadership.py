"""Which replica acts: kopf's own peering verdict, exported as `specdec_active` (1 acts, 0 stands by).

Kopf pauses a replica when a live peer in the peering object has a higher priority, and resumes it when
no such peer is left. It keeps that verdict in private toggles, one per peering object (one cluster-wide,
or one per watched namespace), and announces every flip of a toggle in a log line of its peering module:
"Pausing operations ..." / "Pausing all operators ..." when one turns on, "Resuming operations ..." when
one turns off. Listening to those lines reads kopf's decision itself instead of re-deriving it from the
peering object (which could disagree with kopf for a moment). Kopf starts every toggle on when peering is
mandatory, so a peered replica is a standby until kopf says otherwise. A unit test drives kopf's real
peering code against this listener, so a kopf upgrade that rewords the lines fails CI, not production.

When a replica pauses, kopf stops the per-model daemons (whose exit forgets each model's series); the
listener also clears every per-model series at once, so a standby never exports a number it no longer
maintains.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from specdec_operator.metrics import ACTIVE, forget_all_models

KOPF_PEERING_LOGGER = "kopf._core.engines.peering"
_PAUSED_PREFIXES = ("Pausing operations", "Pausing all operators")
_RESUMED_PREFIX = "Resuming operations"


class LeadershipTracker(logging.Handler):
    """Counts paused peering objects; the replica acts when none is paused."""

    def __init__(self, peerings: int, standalone: bool, on_pause: Callable[[], None] | None = None) -> None:
        super().__init__(level=logging.DEBUG)
        self.peerings = max(peerings, 1)
        self.paused = 0 if standalone else self.peerings
        self._on_pause = on_pause
        self._publish()

    @property
    def active(self) -> bool:
        return self.paused == 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(_PAUSED_PREFIXES):
            self.paused = min(self.paused + 1, self.peerings)
            if self._on_pause is not None:
                self._on_pause()  # kopf closed its watches: once resumed, its indices catch up kind by kind
        elif message.startswith(_RESUMED_PREFIX):
            self.paused = max(self.paused - 1, 0)
        else:
            return
        self._publish()

    def _publish(self) -> None:
        ACTIVE.set(1 if self.active else 0)
        if not self.active:
            forget_all_models()


def track_leadership(
    peerings: int, standalone: bool, on_pause: Callable[[], None] | None = None
) -> LeadershipTracker:
    """Attach a tracker to kopf's peering logger (replacing one attached before) and return it. `on_pause` is
    called whenever kopf pauses this replica (handlers/services/cache.py: its indices may lag once it resumes)."""
    logger = logging.getLogger(KOPF_PEERING_LOGGER)
    for handler in [h for h in logger.handlers if isinstance(h, LeadershipTracker)]:
        logger.removeHandler(handler)
    tracker = LeadershipTracker(peerings, standalone, on_pause)
    logger.addHandler(tracker)
    if logger.getEffectiveLevel() > logging.INFO:
        # The lines we read are INFO and WARNING; keep them flowing even when kopf is configured quieter.
        logger.setLevel(logging.INFO)
    return tracker
