"""The period of a model's loop (monotonic clock): full reconciles, scrapes in between, backoff after failures."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec_operator.kube.retry import Backoff

# A held pass (its inputs not known yet) retries after a second, doubling while it stays held, up to the cap or
# the reconcile interval, whichever is shorter: each may LIST the model's objects (handlers/resync.py), and
# after a failover every model of the fleet is held at once. A watch event still runs the next pass at once.
HELD_RETRY_S = 1.0
HELD_RETRY_CAP_S = 15.0


@dataclass
class LoopSchedule:
    """When one model's loop runs what, on the monotonic clock.

    A full reconcile runs on a change (nudge), every reconcileIntervalSeconds, when the tuner's evaluation or
    a backed-off retry of a refused object falls due, and after a failure with exponential backoff; the
    tuner's scrapes in between are reads only. A due time a full reconcile left in the past (the tuner did
    not evaluate: invalid spec, unreadable status) is ignored until it moves, so the loop never spins.
    """

    reconcile_interval_s: float
    error_backoff: Backoff = field(default_factory=lambda: Backoff(base_s=1.0, cap_s=60.0))
    next_full: float = 0.0
    failures: int = 0
    holds: int = 0  # held passes in a row
    _spent: set[float] = field(default_factory=set)  # due times a full reconcile has already served

    def _due(self, *times: float | None) -> list[float]:
        return [t for t in times if t is not None and t not in self._spent]

    def full_due(self, now: float, nudged: bool, evaluation_at: float | None, retry_at: float | None) -> bool:
        if self.failures:
            return now >= self.next_full  # a failing model waits out its backoff even when nudged
        return nudged or now >= min([self.next_full, *self._due(evaluation_at, retry_at)])

    def ran_full(self, now: float, evaluation_at: float | None, retry_at: float | None) -> None:
        """Call after every full reconcile with the due times as they stand afterwards."""
        self._spent = {t for t in (evaluation_at, retry_at) if t is not None and t <= now}

    def succeeded(self, now: float, invalid_spec: bool, held: bool = False) -> None:
        self.failures = 0
        # An invalid spec cannot heal by retrying: wait for the next change instead of the interval. A held
        # pass (its inputs not known yet, e.g. a watch cache catching up) tries again soon, backing off.
        if held:
            delay = min(HELD_RETRY_S * 2.0 ** min(self.holds, 16), HELD_RETRY_CAP_S, self.reconcile_interval_s)
            self.holds += 1
        else:
            delay = 3600.0 if invalid_spec else self.reconcile_interval_s
            self.holds = 0
        self.next_full = now + delay

    def failed(self, now: float, retry_after_s: float | None = None) -> float:
        delay = self.error_backoff.delay(self.failures, retry_after_s)
        self.failures += 1
        self.next_full = now + delay
        return delay

    def wake_at(self, scrape_at: float | None, evaluation_at: float | None, retry_at: float | None) -> float:
        if self.failures:
            return self.next_full
        return min([self.next_full, *self._due(scrape_at, evaluation_at, retry_at)])
