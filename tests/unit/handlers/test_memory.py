"""Memory goes back to the system once a burst of model deletions is over, not once per model."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time

import pytest

from specdec_operator.handlers import memory
from specdec_operator.handlers.memory import MemoryRelease, release_memory


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


async def test_a_fleet_that_keeps_shrinking_after_its_models_went_is_released_again_once_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
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


async def test_the_watch_samples_the_caches_until_cancelled() -> None:
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
        "from specdec_operator.handlers.memory import release_memory, stranded_heap_mib\n"
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


@pytest.mark.parametrize(("models", "forgot_any", "acting", "stranded", "above", "restarts"), [
    (0, True, True, 40.0, 24.0, True),  # the fleet went and left its heap stranded
    (0, True, True, 10.0, 24.0, False),  # under the limit: a restart would give back little
    (1, True, True, 400.0, 24.0, False),  # a model left to manage: its tuner windows are worth more
    (0, False, True, 40.0, 24.0, False),  # never held a model (a fresh process after a restart)
    (0, True, False, 40.0, 24.0, False),  # a standby: a new priority would make it contend
    (0, True, True, None, 24.0, False),  # no glibc figures: no evidence
    (0, True, True, 40.0, 0.0, False),  # turned off
])
def test_restart_in_place_only_with_no_model_and_enough_stranded_heap(
    models: int, forgot_any: bool, acting: bool, stranded: float | None, above: float, restarts: bool,
) -> None:
    reason = memory.restart_reason(models, forgot_any, acting, stranded, above)
    assert (reason is not None) is restarts
    if reason is not None:
        assert "40 MiB" in reason and "limit 24 MiB" in reason


async def test_a_release_with_no_model_left_and_a_stranded_heap_requests_one_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "release_memory", lambda: (200.0, 180.0))
    stranded = [60.0]
    monkeypatch.setattr(memory, "stranded_heap_mib", lambda: stranded[0])
    models = [1]
    restart = memory.RestartInPlace(stop_grace_s=None)  # no exec timer in the test process
    release = MemoryRelease(quiet_s=0.05)
    release.restart_when_stranded(restart, 24.0, models=lambda: models[0], acting=lambda: True)

    release.after_forget()  # one model of two went
    await asyncio.sleep(0.15)
    assert not restart.requested and not restart.stop_flag.is_set()

    models[0] = 0
    release.after_forget()  # the last one
    await asyncio.sleep(0.15)
    assert restart.requested and restart.stop_flag.is_set()
    assert restart.reason is not None and "60 MiB" in restart.reason
    first = restart.reason
    stranded[0] = 90.0
    release.after_forget()
    await asyncio.sleep(0.15)
    assert restart.reason == first  # requested once; kopf is already stopping
    await release.close()


async def test_without_a_restart_wired_a_release_only_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    released: list[bool] = []
    monkeypatch.setattr(memory, "release_memory", lambda: (released.append(True), (200.0, 180.0))[1])
    measured: list[bool] = []
    monkeypatch.setattr(memory, "stranded_heap_mib", lambda: (measured.append(True), 500.0)[1])
    release = MemoryRelease(quiet_s=0.05)  # as when kopf runs the handlers without `specdec-operator run`
    release.after_forget()
    await asyncio.sleep(0.15)
    assert released == [True] and measured == [True]  # released and logged; nothing wired to restart
    await release.close()


def test_a_restart_in_place_execs_the_same_command_line_in_the_same_process() -> None:
    # Interpreter options survive (-X dev here, PYTHONMALLOC in the image's environment), and the PID
    # stays: the kubelet sees no container restart.
    code = (
        "import os, sys\n"
        "from specdec_operator.handlers.memory import RestartInPlace, restarts_so_far\n"
        "print(os.getpid(), sys.flags.dev_mode, os.environ.get('ROUND', '1'), restarts_so_far(), flush=True)\n"
        "if 'ROUND' not in os.environ:\n"
        "    os.environ['ROUND'] = '2'\n"
        "    restart = RestartInPlace()\n"
        "    restart.request('test')\n"
        "    assert restart.stop_flag.is_set()\n"
        "    restart.exec()\n"
    )
    result = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True,
                            check=True, timeout=60,
                            env={k: v for k, v in os.environ.items() if k not in ("ROUND", memory.RESTARTS_ENV)})
    first, second = (line.split() for line in result.stdout.splitlines())
    assert first[0] == second[0]  # same PID
    # dev mode, round, and the restart count the new image reads (specdec_restarts_in_place_total)
    assert first[1:] == ["True", "1", "0"] and second[1:] == ["True", "2", "1"]


def test_a_stop_that_hangs_does_not_keep_the_restart_from_happening(monkeypatch: pytest.MonkeyPatch) -> None:
    execs: list[str | None] = []
    restart = memory.RestartInPlace(stop_grace_s=0.05)
    monkeypatch.setattr(restart, "exec", lambda: execs.append(restart.reason))
    restart.request("stranded")
    assert restart.stop_flag.is_set() and execs == []
    deadline = time.monotonic() + 5
    while not execs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert execs == ["stranded"]  # kopf never returned: the timer execs


def test_a_sigterm_during_the_restart_stops_the_operator_instead() -> None:
    # In a child: kopf would absorb the signal while it stops, and the kubelet's stop would meet a fresh
    # process. After the request the signal is ours, cancels the exec, and the process ends.
    code = (
        "import asyncio, os, signal\n"
        "from specdec_operator.handlers.memory import RestartInPlace\n"
        "async def main():\n"
        "    restart = RestartInPlace(stop_grace_s=0.5)\n"
        "    restart.request('stranded')\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    await asyncio.sleep(1.0)  # past the grace: the overdue timer was cancelled too\n"
        "    print(restart.requested, restart.due, restart.cancelled_by.name, flush=True)\n"
        "asyncio.run(main())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.split() == ["True", "False", "SIGTERM"]
    assert "SIGTERM during the restart in place" in result.stderr
