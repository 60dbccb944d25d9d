"""The kubelet's pod termination, for the fleet drivers: a pod being deleted keeps serving through its preStop
wait, then gets SIGTERM (vLLM drains its in-flight requests for --shutdown-timeout seconds), is killed at the end
of its grace period if it still runs, and only then is its pod object deleted.

On a real node the pod object stays (Terminating) until the kubelet has stopped its containers, so its IP is not
handed to another pod while it drains. KWOK's own pod-delete stage would delete it at once; the local cluster
leaves runtime pods to their driver (and to a stage that deletes them at the end of their grace period, should no
driver run: hack/localcluster/build.py). A termination runs beside the driver's loop, one task per pod, so one
pod's drain never holds up another pod's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection

from specdec_runtime.fleet_kube import RuntimePod

logger = logging.getLogger(__name__)

# SIGTERM, then wait at most this long (seconds, the grace period's remainder) for the container to exit.
Stop = Callable[[float], Awaitable[None]]
Finish = Callable[[RuntimePod], Awaitable[None]]


class Terminations:
    """The pods being terminated, by UID: each runs the sequence once, in a task of its own."""

    def __init__(self, finish: Finish | None) -> None:
        self._finish = finish
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running: set[str] = set()  # UIDs whose container has not stopped yet

    def __contains__(self, uid: str) -> bool:
        """Under way, or done (until the pod disappears); a termination whose final deletion failed is not."""
        task = self._tasks.get(uid)
        return task is not None and not _failed(task)

    @property
    def holding(self) -> int:
        """Containers still running (in their preStop wait or draining): they hold their memory until they exit."""
        return len(self._running)

    def begin(self, pod: RuntimePod, stop: Stop | None) -> None:
        """Terminate `pod` (its `terminating` set) once; `stop` is None when no container of it runs."""
        if pod.uid in self:
            return
        if stop is not None:
            self._running.add(pod.uid)
        self._tasks[pod.uid] = asyncio.create_task(self._terminate(pod, stop), name=f"terminate {pod.name}")

    def forget(self, present: Collection[str]) -> None:
        """Drop finished terminations of pods that are gone."""
        for uid in [uid for uid, task in self._tasks.items() if task.done() and uid not in present]:
            _failed(self._tasks.pop(uid))  # a failed deletion was logged; retrieved, so asyncio does not log it again

    async def close(self) -> None:
        """The driver is stopping: no more waits (its engines die with it; its simulators with its event loop)."""
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def _terminate(self, pod: RuntimePod, stop: Stop | None) -> None:
        termination = pod.terminating
        assert termination is not None
        where = f"{pod.namespace}/{pod.name}"
        try:
            if stop is not None:
                # The preStop hook: the container still serves while Services and Gateways drop the pod.
                await asyncio.sleep(max(0.0, min(termination.pre_stop_s, termination.deadline - time.monotonic())))
                await self._stop(where, stop, termination.deadline)
        finally:
            self._running.discard(pod.uid)
        if self._finish is not None:
            try:
                await self._finish(pod)
            except Exception:
                logger.exception("deleting terminated pod %s failed; trying again", where)
                raise

    @staticmethod
    async def _stop(where: str, stop: Stop, deadline: float) -> None:
        started = time.monotonic()
        try:
            await stop(max(0.0, deadline - started))
        except Exception:
            logger.exception("stopping the container of %s failed", where)
        logger.info("terminated %s: container stopped %.1fs after SIGTERM", where, time.monotonic() - started)


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None
