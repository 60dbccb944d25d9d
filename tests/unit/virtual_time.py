"""An event loop whose clock moves only when the loop would wait: timers cost nothing and no load delays them.

A test of timer logic (a quiet period, a debounce, a backoff) on the real clock depends on the machine:
a stall of the test process longer than the gap between two of its steps reorders them. On this loop a
step's `asyncio.sleep(0.05)` lasts exactly 0.05 loop-seconds, whatever else the machine is doing.

When nothing is ready and a timer is pending, the loop jumps its clock to that timer instead of blocking
(the idea of kopf's `looptime`). With no timer pending it blocks on real I/O as usual. Only for code that
schedules on the loop's clock (`asyncio.sleep`, `call_later`, `asyncio.timeout`): `time.monotonic()` stays real.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        selector: selectors.BaseSelector = self._selector  # type: ignore[attr-defined]
        real_select = selector.select

        def select(timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            ready = real_select(0)
            if ready or timeout == 0:
                return ready
            if timeout is None:
                return real_select(None)  # no timer pending: only I/O can wake the loop
            self._now += timeout  # the next timer is due now
            return []

        selector.select = select  # type: ignore[method-assign]

    def time(self) -> float:
        return self._now


def run_in_virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh VirtualTimeLoop, outside the test session's loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
