"""Giving memory back to the system once a fleet shrinks.

Deleting hundreds of models frees their Python objects, yet the process keeps the pages: CPython's
allocator returns an arena only when it is wholly empty, and glibc gives back only the top of its heap
unless asked. On a long-lived operator whose fleet grew and then shrank that reads as a leak. After the
last model in a burst of deletions is forgotten (a quiet period with no further ones), a full garbage
collection and glibc's malloc_trim(0), which releases every whole free page in every arena, bring the
resident size back near what the remaining fleet needs.

Model deletions are not the end of it: the garbage collector deletes a model's ReplicaSets and pods
minutes later, and each leaves the watch caches then. A release at the last model's forget would keep
what those free. So the size of the watch caches is sampled too, and a fall of a tenth or more since the
last release arms the same quiet-period release.

What a trim cannot give back is a page that still holds one live object. The heap a fleet grew is full
of them when long-lived objects were (re)allocated at the peak: bounded library caches churned by every
pod's address (emptied here before the trim), kopf's watch streams and per-object workers, resized
tables of long-lived dicts. Measured at 200 models x 4 replicas: those few thousand objects keep about a
fifth of the idle resident size, at 500 x 4 two fifths; this heap, resident yet free, is what we call
stranded. Only a new process image gives it back. So once the last model is gone, when the stranded heap
is over `restart_when_stranded_mib`, the operator restarts in place: kopf stops as on SIGTERM (cleanup
handlers, peering presence withdrawn) and the process execs its own command line again, keeping its PID,
pod and log streams. With no model to manage that loses nothing a restarted operator would not rebuild
from the API server; a fleet that shrank but still has models keeps its pages, since a restart would
cost their tuner windows (its resident size stays under the peak's).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

LOG = logging.getLogger(__name__)
QUIET_S = 30.0  # a burst of deletions (kubectl delete --all, a namespace going) is over after this long
SHRINK_SHARE = 0.1  # a fall of the watched objects by this share since the last release is worth one
SAMPLE_S = 10.0  # how often the watch caches are counted
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _glibc_function(name: str, argtypes: list[Any], restype: Any) -> Any:
    """A glibc function by name, or None where there is none (musl, macOS, an older glibc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None."""
    trim: Callable[[int], int] | None = _glibc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    return trim


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    """glibc's mallinfo2 (2.33+), or None."""
    mallinfo2: Callable[[], _MallInfo2] | None = _glibc_function("mallinfo2", [], _MallInfo2)
    return mallinfo2


def _resident_heap_mib() -> float | None:
    """Resident size of the process's [heap] mapping (glibc's main arena)."""
    try:
        with open("/proc/self/smaps") as smaps:
            in_heap = False
            for line in smaps:
                if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    in_heap = line.rstrip().endswith("[heap]")
                elif in_heap and line.startswith("Rss:"):
                    return int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        return None
    return None


def stranded_heap_mib() -> float | None:
    """Heap that is resident yet free in malloc's books, after a trim: pages pinned by a few live objects.

    The [heap] mapping's resident size minus the bytes malloc has in use in every arena (other arenas
    are not in [heap], so this errs low). None without glibc's mallinfo2 or /proc.
    """
    mallinfo2, resident = _mallinfo2(), _resident_heap_mib()
    if mallinfo2 is None or resident is None:
        return None
    in_use: int = mallinfo2().uordblks
    return max(0.0, resident - in_use / 2**20)


def resident_mib() -> float | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return None


# Libraries whose module-level LRU caches are keyed by URL, netloc or host. Every pod's address passes
# through them on every scrape, so at fleet scale their entries are replaced all the time and the last
# ones were allocated at the fleet's peak, scattered over the heap the fleet grew: a few thousand small
# survivors, each pinning a page that malloc_trim cannot give back. They are bounded (128-512 entries),
# cost one parse to refill, and hold nothing of ours.
URL_CACHE_PACKAGES = ("yarl", "aiohttp", "urllib", "ipaddress")


def clear_url_caches() -> None:
    """Empty the LRU caches of URL_CACHE_PACKAGES' loaded modules."""
    for name, module in list(sys.modules.items()):
        if module is None or name.partition(".")[0] not in URL_CACHE_PACKAGES:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()


def release_memory() -> tuple[float | None, float | None]:
    """Collect garbage and hand free heap pages back; (resident MiB before, after)."""
    before = resident_mib()
    clear_url_caches()
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    return before, resident_mib()


STOP_GRACE_S = 60.0  # kopf's stop with no model left takes seconds; after this long, exec regardless
# Carries the number of restarts in place across each exec (the process's own environment, not a setting).
RESTARTS_ENV = "_SPECDEC_RESTARTS_IN_PLACE"


def restarts_so_far() -> int:
    """Restarts in place this process has been through since the container started."""
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0


class RestartInPlace:
    """A request from inside the operator to stop kopf and run the same command line again.

    `stop_flag` goes to kopf.run(), which returns once kopf has stopped; the caller then calls exec() if
    the restart is still `due`.
    """

    def __init__(self, stop_grace_s: float | None = STOP_GRACE_S) -> None:
        """`stop_grace_s`: how long kopf may take to stop before exec() runs regardless (None: no limit)."""
        self.stop_flag = threading.Event()
        self.reason: str | None = None
        self.stop_grace_s = stop_grace_s
        self._overdue: threading.Timer | None = None
        self._exec_once = threading.Lock()
        self.cancelled_by: signal.Signals | None = None  # a SIGTERM or SIGINT after the request

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self._take_signals()
            self.stop_flag.set()
            # Kopf never SIGKILLs itself after a stop flag; a stop that hangs must not leave a process that
            # neither manages models nor exits.
            if self.stop_grace_s is not None:
                self._overdue = threading.Timer(self.stop_grace_s, self._stop_overdue)
                self._overdue.daemon = True
                self._overdue.start()

    def _take_signals(self) -> None:
        """From the request on, SIGTERM and SIGINT cancel the exec: kopf, already stopping, would absorb them
        and the kubelet's stop would meet a fresh process."""
        try:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._cancel, signum)
        except (RuntimeError, ValueError, NotImplementedError):
            pass  # no running loop, or not its main thread: kopf's handlers stay

    def _cancel(self, signum: signal.Signals) -> None:
        LOG.warning("%s during the restart in place: the operator stops instead", signum.name)
        self.cancelled_by = signum
        if self._overdue is not None:
            self._overdue.cancel()

    @property
    def due(self) -> bool:
        """Requested and not cancelled by a signal: exec once kopf has stopped."""
        return self.requested and self.cancelled_by is None

    def _stop_overdue(self) -> None:
        LOG.warning("kopf had not stopped %.0f s after the restart request: restarting in place now",
                    self.stop_grace_s)
        self.exec()

    @property
    def requested(self) -> bool:
        return self.reason is not None

    @staticmethod
    def command() -> list[str]:
        """This process's command line, interpreter options included (python -X ..., -m, a script)."""
        return [sys.executable, *sys.orig_argv[1:]]

    def exec(self) -> NoReturn:
        self._exec_once.acquire()  # the overdue timer and the main thread may race here; one execs
        if self._overdue is not None:
            self._overdue.cancel()
        os.environ[RESTARTS_ENV] = str(restarts_so_far() + 1)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.execv(sys.executable, self.command())


def restart_reason(models: int, forgot_any: bool, acting: bool, stranded_mib: float | None,
                   above_mib: float) -> str | None:
    """Why the process should restart in place to give its stranded heap back, or None if it should not."""
    if above_mib <= 0 or stranded_mib is None or stranded_mib < above_mib:
        return None
    # A process that never let a model go grew nothing to strand (and a fresh one after a restart never
    # restarts again until it has held models); a standby holds none, and a new priority would make it
    # contend for leadership.
    if models or not forgot_any or not acting:
        return None
    return f"no model left and {stranded_mib:.0f} MiB of heap resident yet free (limit {above_mib:.0f} MiB)"


class _RestartWiring(NamedTuple):
    """What MemoryRelease needs to ask for a restart in place: see restart_when_stranded()."""

    restart: RestartInPlace
    above_mib: float
    models: Callable[[], int]  # models this process manages now
    acting: Callable[[], bool]  # this replica acts (kopf peering did not pause it)


class MemoryRelease:
    """Runs release_memory() once a burst of forgotten models, or of objects leaving the watch caches, has
    been quiet for `quiet_s`; then, if restart_when_stranded() set it up, may ask for a restart in place."""

    def __init__(self, quiet_s: float = QUIET_S, shrink_share: float = SHRINK_SHARE) -> None:
        self.quiet_s = quiet_s
        self.shrink_share = shrink_share
        self._pending: asyncio.TimerHandle | None = None
        self._last_size = 0  # watched objects at the previous sample
        self._high_size = 0  # the most since the last release
        self._forgot_any = False  # a model's state was dropped since the process started
        self._restart: _RestartWiring | None = None

    def restart_when_stranded(self, restart: RestartInPlace, above_mib: float, models: Callable[[], int],
                              acting: Callable[[], bool]) -> None:
        """After each release, request `restart` when restart_reason() gives one."""
        self._restart = _RestartWiring(restart, above_mib, models, acting)

    def after_forget(self) -> None:
        """A model's state was dropped: release once no other follows for the quiet period."""
        self._forgot_any = True
        self._arm()

    def _arm(self) -> None:
        """Release after the quiet period, unless armed again before it ends."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a synchronous caller in tests): nothing long-lived to shrink
        if self._pending is not None:
            self._pending.cancel()
        self._pending = loop.call_later(self.quiet_s, self._release)

    def observe_watched(self, size: int) -> None:
        """The watch caches hold `size` objects now. While they keep falling, and have fallen by
        `shrink_share` since the last release, a release is armed for when they stop."""
        last, self._last_size = self._last_size, size
        self._high_size = max(self._high_size, size)
        if size < last and size <= self._high_size * (1 - self.shrink_share):
            self._arm()

    async def watch(self, count_watched: Callable[[], int], every_s: float = SAMPLE_S) -> None:
        """Sample `count_watched()` every `every_s` until cancelled."""
        while True:
            self.observe_watched(count_watched())
            await asyncio.sleep(every_s)

    def _release(self) -> None:
        self._pending = None
        self._high_size = self._last_size
        before, after = release_memory()
        stranded = stranded_heap_mib()
        if before is not None and after is not None:
            LOG.info("fleet shrank: resident memory %.0f MiB -> %.0f MiB after collection and trim "
                     "(%s MiB of heap resident yet free)", before, after,
                     "unknown" if stranded is None else f"{stranded:.0f}")
        wiring = self._restart
        if wiring is None or wiring.restart.requested:
            return
        reason = restart_reason(wiring.models(), self._forgot_any, wiring.acting(), stranded, wiring.above_mib)
        if reason is not None:
            LOG.warning("restarting in place to give memory back: %s", reason)
            wiring.restart.request(reason)

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
