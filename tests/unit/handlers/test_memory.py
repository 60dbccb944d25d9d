"""Memory goes back to the system once a burst of model deletions is over, not once per model."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys

import pytest

from specdec_operator.handlers.services import memory_release as memory
from specdec_operator.handlers.services.memory_release import MemoryRelease, release_memory
from tests.unit.virtual_time import run_in_virtual_time


def test_release_collects_garbage_and_reports_resident_memory() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    before, after = release_memory()
    assert before is not None and after is not None and after > 0  # /proc/self/statm on Linux
    assert memory._malloc_trim() is not None  # glibc here: the trim really runs


def test_release_empties_the_url_caches_every_scraped_address_passed_through() -> None:
    import urllib.parse

    import yarl
    from yarl import _parse

    for pod in range(300):  # more addresses than the caches hold: the last ones stay cached
        url = yarl.URL(f"http://127.0.0.{pod % 250}:{8000 + pod}/metrics")
        assert url.host is not None
        urllib.parse.urlsplit(str(url))
    assert _parse.split_netloc.cache_info().currsize > 0
    assert yarl.cache_info()["encode_host"].currsize > 0 and urllib.parse.urlsplit.cache_info().currsize > 0
    release_memory()
    assert _parse.split_netloc.cache_info().currsize == 0
    assert yarl.cache_info()["encode_host"].currsize == 0 and urllib.parse.urlsplit.cache_info().currsize == 0
    assert yarl.URL("http://127.0.0.1:8000/metrics").port == 8000  # and they refill on use


def test_a_burst_of_forgets_releases_once_after_it_goes_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
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

    run_in_virtual_time(scenario())


def test_a_fleet_that_keeps_shrinking_after_its_models_went_is_released_again_once_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        # The models' pods leave the watch caches minutes after the models (the garbage collector deletes
        # them): what they free must be given back too, once, when the fall is over.
        released: list[float] = []
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(memory, "release_memory", lambda: (released.append(loop.time()), (None, None))[1])
        release = MemoryRelease(quiet_s=0.2, shrink_share=0.1)
        for size in (0, 1000, 2000, 2000):  # the fleet grows: nothing to give back
            release.observe_watched(size)
        await asyncio.sleep(0.3)
        assert released == []
        release.observe_watched(1950)  # a rolling update's dip, under a tenth
        await asyncio.sleep(0.3)
        assert released == []
        for size in (1700, 1200, 600):  # the pods going, sampled while it lasts
            release.observe_watched(size)
            await asyncio.sleep(0.1)
        assert released == []  # still falling
        release.observe_watched(600)
        await asyncio.sleep(0.3)
        assert len(released) == 1
        release.observe_watched(600)  # level since the release: nothing more to give back
        release.observe_watched(580)  # a small fall measured from the level at the release
        await asyncio.sleep(0.3)
        assert len(released) == 1
        await release.close()

    run_in_virtual_time(scenario())


def test_the_watch_samples_the_caches_until_cancelled() -> None:
    async def scenario() -> None:
        sizes = itertools.chain([10, 5], itertools.repeat(5))
        seen: list[int] = []
        release = MemoryRelease(quiet_s=60)
        release.observe_watched = seen.append  # type: ignore[method-assign]
        task = asyncio.create_task(release.watch(lambda: next(sizes), every_s=0.01))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen[:2] == [10, 5] and len(seen) >= 3

    run_in_virtual_time(scenario())


def test_the_stranded_heap_is_resident_heap_that_malloc_holds_free() -> None:
    # Runs under pymalloc or malloc alike: a glibc process always has a [heap] and mallinfo2.
    stranded = memory.stranded_heap_mib()
    resident = memory._resident_heap_mib()
    assert stranded is not None and resident is not None
    assert 0 <= stranded <= resident


def test_fragmenting_the_heap_strands_what_a_trim_cannot_give_back() -> None:
    # In a child with glibc malloc for objects (the operator image's setting): many small objects, then
    # every 50th kept alive, so most pages keep one live neighbour through the trim.
    code = (
        "from specdec_operator.handlers.services.memory_release import release_memory, stranded_heap_mib\n"
        "fresh = stranded_heap_mib()\n"
        "grown = [str(i) * 10 for i in range(300_000)]\n"
        "pinned = grown[::50]\n"
        "del grown\n"
        "release_memory()\n"
        "print(fresh, stranded_heap_mib(), len(pinned))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONMALLOC": "malloc"},
                            capture_output=True, text=True, check=True, timeout=60)
    fresh, stranded, _ = (float(value) for value in result.stdout.split())
    assert fresh < 5 <= stranded  # ~24 MiB measured here; a fresh process ~0


def test_a_release_releases_and_measures_the_stranded_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        released: list[bool] = []
        monkeypatch.setattr(memory, "release_memory", lambda: (released.append(True), (200.0, 180.0))[1])
        measured: list[bool] = []
        monkeypatch.setattr(memory, "stranded_heap_mib", lambda: (measured.append(True), 500.0)[1])
        release = MemoryRelease(quiet_s=0.05)
        release.after_forget()
        await asyncio.sleep(0.15)
        assert released == [True] and measured == [True]  # released and logged; nothing else happens
        await release.close()

    run_in_virtual_time(scenario())


def test_the_operator_never_re_executes_itself() -> None:
    # The self-exec restart in place is gone: a controller leaves process restarts to its Deployment.
    import pathlib

    import specdec_operator

    package = pathlib.Path(specdec_operator.__file__).parent
    offenders = [str(path.relative_to(package)) for path in package.rglob("*.py")
                 if "os.exec" in path.read_text() or "os.spawn" in path.read_text()]
    assert offenders == []
