"""Stopping promptly on SIGTERM or SIGINT.

Two things kept the operator alive after a stop signal. The restart in place (removed) gave kopf a
`threading.Event` as its stop flag; kopf waits for such a flag in a thread of the loop's default executor,
blocked in `Event.wait()` for good, so after kopf had stopped (`Activity 'close' succeeded`) asyncio.run()
waited for that thread forever, until kopf's ultimate SIGKILL ten minutes later. The stop flag here is an
`asyncio.Event`: no thread.

The other: kopf's graceful stop has no time limit of its own: it cancels its
root tasks once and then waits for each to finish, however long that takes (only its "ultimate
termination" SIGKILLs the process, ten minutes later). One of them does slow work in its `finally`: the
peering keep-alive removes this replica from the peering object with a PATCH that is shielded from the
cancellation and retried with kopf's networking settings, eight back-offs adding up to 54 s, each attempt
allowed kopf's 5-minute request timeout. With the API server gone the operator then outlived its grace
period by minutes, and the standby waited for it. Nothing in kopf's stop needs retries: the process is
ending, and the peering entry expires by itself anyway.

So the operator handles the signals itself (after kopf's `spawn_tasks()`, which installs kopf's own):
- it turns kopf's requests to fail fast (one attempt, `STOPPING_REQUEST_TIMEOUT_S`) for the rest of the
  process's life, so the peering clean-up is tried once and the standby learns of the stop at once when
  the API server answers;
- it raises kopf's stop flag, the graceful path: the per-model daemons stop, the cleanup handlers run;
- after `grace_s` it cancels what is left of kopf (kopf's own urgent path: every task is cancelled again,
  shielded ones included), and a second signal does that at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import kopf

LOG = logging.getLogger(__name__)
STOPPING_REQUEST_TIMEOUT_S = 2.0  # one try per API request while stopping; longer means the server is not there
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def fail_fast(settings: kopf.OperatorSettings, request_timeout_s: float = STOPPING_REQUEST_TIMEOUT_S) -> None:
    """Make kopf's API requests from now on a single attempt bounded by `request_timeout_s`."""
    networking = settings.networking
    networking.error_backoffs = ()
    networking.request_timeout = min(networking.request_timeout or request_timeout_s, request_timeout_s)
    networking.connect_timeout = min(networking.connect_timeout or request_timeout_s, request_timeout_s)


class Stopper:
    """Turns SIGTERM/SIGINT into kopf's stop flag, with a deadline after which kopf is cancelled."""

    def __init__(self, settings: kopf.OperatorSettings, grace_s: float) -> None:
        self.settings = settings
        self.grace_s = grace_s
        self.stop_flag = asyncio.Event()
        self.signalled: signal.Signals | None = None
        self._kopf: asyncio.Task[Any] | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def watch(self, kopf_task: asyncio.Task[Any]) -> None:
        """Handle the stop signals for the task running kopf (replacing kopf's own handlers)."""
        self._kopf = kopf_task
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self.on_signal, signum)

    def on_signal(self, signum: signal.Signals) -> None:
        if self.signalled is not None:
            LOG.warning("%s while stopping: cancelling what is left of the operator now", signum.name)
            self._cancel_kopf()
            return
        self.signalled = signum
        LOG.info("%s received: the operator stops (at most %.0f s)", signum.name, self.grace_s)
        fail_fast(self.settings)
        self.stop_flag.set()
        self._deadline = asyncio.get_running_loop().call_later(self.grace_s, self._overdue)

    def _overdue(self) -> None:
        LOG.warning("the operator had not stopped %.0f s after %s: cancelling what is left of it",
                    self.grace_s, self.signalled.name if self.signalled else "the signal")
        self._cancel_kopf()

    def _cancel_kopf(self) -> None:
        if self._kopf is not None and not self._kopf.done():
            self._kopf.cancel()

    def close(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


async def run_operator(grace_s: float, settings: kopf.OperatorSettings, **kopf_kwargs: Any) -> None:
    """kopf.operator(), stopped by SIGTERM or SIGINT within about `grace_s` (see the module's doc).

    Laid out as kopf.operator() is: spawn_tasks(), then run_tasks() in this same task, which is what a
    deadline cancels (kopf's run_tasks() then cancels its root and hung tasks again and re-raises).
    """
    stopper = Stopper(settings, grace_s)
    this_task = asyncio.current_task()
    assert this_task is not None
    existing = {task for task in asyncio.all_tasks() if task is not this_task}
    tasks = await kopf.spawn_tasks(settings=settings, stop_flag=stopper.stop_flag, **kopf_kwargs)
    stopper.watch(this_task)  # after spawn_tasks(): replaces the signal handlers kopf installed there
    try:
        await kopf.run_tasks(tasks, ignored=existing)
    except asyncio.CancelledError:
        if stopper.signalled is None:
            raise  # cancelled from outside, not by a stop signal
        this_task.uncancel()
    finally:
        stopper.close()
