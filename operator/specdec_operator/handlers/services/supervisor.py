"""Supervised background tasks: the operator-wide loops that run beside kopf's handlers.

The scrape scheduler and the memory watcher run for the operator's whole life, outside any kopf handler,
so nothing in kopf notices when one of them dies: a bare task that raised stops scraping fleet-wide without
a sign, and canaries then time out. A supervisor runs each such loop, and when it raises (or returns,
which a loop meant to run forever never should), it logs the error with its traceback, counts it in
`specdec_background_task_restarts_total{task}` and starts the loop again after a capped exponential
backoff. A loop that fails `RestartPolicy.give_up_failures` times in a row, no run lasting
`healthy_after_s` in between, is reported unhealthy, and the operator's liveness probe (kopf's, see
handlers/register.py) then fails, so the kubelet restarts the container: a fresh process is the last
resort, and it is the platform's, not ours. The supervisor keeps trying meanwhile; a run that lasts
`healthy_after_s` ends the streak and the probe passes again.

The policy is pure (`FailureStreak` takes the clock's readings); the supervisor takes its clock and
sleep as arguments, so tests drive it without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from specdec_operator.metrics import BACKGROUND_TASK_RESTARTS

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 1.0  # after the first failure of a streak
    factor: float = 2.0  # each further failure in the streak multiplies the delay by this
    max_delay_s: float = 60.0
    healthy_after_s: float = 120.0  # a run this long ends the streak: the next failure starts over
    give_up_failures: int = 5  # this many failures in one streak: unhealthy (liveness fails)

    def delay(self, failures: int) -> float:
        """Seconds to wait before the next start, after the streak's `failures`-th failure (1 = first)."""
        exponent = min(max(0, failures - 1), 64)  # past the cap long before; keeps the power finite
        return float(min(self.max_delay_s, self.first_delay_s * self.factor**exponent))


@dataclass
class FailureStreak:
    """Consecutive failures of one task, each run having ended before it lasted `healthy_after_s`."""

    policy: RestartPolicy
    failures: int = 0
    last_error: str | None = None

    def ended(self, ran_s: float, error: str) -> float:
        """A run that lasted `ran_s` failed with `error`: the delay before the next start."""
        if ran_s >= self.policy.healthy_after_s:
            self.failures = 0  # it ran long enough to count as recovered: a fresh streak
        self.failures += 1
        self.last_error = error
        return self.policy.delay(self.failures)

    def ran_well(self, ran_s: float) -> None:
        """The current run has lasted `ran_s` without failing."""
        if ran_s >= self.policy.healthy_after_s:
            self.failures = 0
            self.last_error = None

    @property
    def gave_up(self) -> bool:
        return self.failures >= self.policy.give_up_failures


@dataclass
class _Supervised:
    name: str
    streak: FailureStreak
    task: asyncio.Task[None] | None = None
    started_at: float = 0.0
    restarts: int = 0
    running: bool = False


class Supervisor:
    """Runs named background loops, restarting each after an unexpected error (see the module's doc)."""

    def __init__(
        self,
        policy: RestartPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.policy = policy or RestartPolicy()
        self._clock = clock
        self._sleep = sleep
        self._tasks: dict[str, _Supervised] = {}

    def start(self, name: str, loop: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run `loop()` under supervision as task `name` until close(); `loop` makes a fresh coroutine per run."""
        if name in self._tasks:
            raise ValueError(f"a task named {name!r} is already supervised")
        supervised = _Supervised(name, FailureStreak(self.policy))
        self._tasks[name] = supervised
        BACKGROUND_TASK_RESTARTS.labels(task=name).inc(0)  # the series exists from the start, at 0
        supervised.task = asyncio.create_task(self._supervise(supervised, loop), name=name)
        return supervised.task

    async def _supervise(self, supervised: _Supervised, loop: Callable[[], Awaitable[None]]) -> None:
        while True:
            supervised.started_at = self._clock()
            supervised.running = True
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any error of the loop: that is what the supervisor is for
                failure = f"{type(error).__name__}: {error}"
                LOG.exception("background task %r failed: %s", supervised.name, failure)
            else:
                failure = "returned, though it should run until stopped"
                LOG.error("background task %r %s", supervised.name, failure)
            supervised.running = False
            delay = supervised.streak.ended(self._clock() - supervised.started_at, failure)
            supervised.restarts += 1
            BACKGROUND_TASK_RESTARTS.labels(task=supervised.name).inc()
            if supervised.streak.gave_up:
                LOG.error("background task %r failed %d times in a row: reporting the operator unhealthy; "
                          "next try in %.1fs", supervised.name, supervised.streak.failures, delay)
            else:
                LOG.warning("background task %r restarts in %.1fs", supervised.name, delay)
            await self._sleep(delay)

    def unhealthy(self) -> dict[str, str]:
        """Tasks that failed too often to count as recovering, with their last error."""
        now = self._clock()
        found = {}
        for supervised in self._tasks.values():
            if supervised.running:
                supervised.streak.ran_well(now - supervised.started_at)
            if supervised.streak.gave_up:
                found[supervised.name] = f"{supervised.streak.failures} failures in a row, last: " \
                                         f"{supervised.streak.last_error}"
        return found

    def report(self) -> dict[str, dict[str, object]]:
        """Per task: running or waiting to restart, restarts so far, failures in the current streak."""
        self.unhealthy()  # refreshes the streaks of long-running tasks
        return {
            name: {"running": s.running, "restarts": s.restarts, "failures": s.streak.failures}
            for name, s in self._tasks.items()
        }

    async def close(self) -> None:
        """Cancel every supervised task and wait for each to end."""
        tasks = [s.task for s in self._tasks.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # each ends cancelled; a cancellation of close() itself propagates
        self._tasks.clear()
