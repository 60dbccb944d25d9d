"""Memory goes back to the system once a burst of model deletions is over, not once per model."""

from __future__ import annotations

import asyncio

import pytest

from specdec_operator.handlers import memory
from specdec_operator.handlers.memory import MemoryRelease, release_memory


def test_release_collects_garbage_and_reports_resident_memory() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    before, after = release_memory()
    assert before is not None and after is not None and after > 0  # /proc/self/statm on Linux
    assert memory._malloc_trim() is not None  # glibc here: the trim really runs


async def test_a_burst_of_forgets_releases_once_after_it_goes_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    released: list[float] = []
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(memory, "release_memory", lambda: (released.append(loop.time()), (None, None))[1])
    release = MemoryRelease(quiet_s=0.2)
    for _ in range(5):
        release.after_forget()
        await asyncio.sleep(0.05)
    assert released == []  # still inside the burst
    await asyncio.sleep(0.35)
    assert len(released) == 1
    release.after_forget()
    await release.close()  # an operator shutting down cancels a pending release
    assert len(released) == 1
