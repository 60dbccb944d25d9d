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

What a trim cannot give back is a page that still holds one live object (the heap a fleet grew is full
of them when long-lived objects were reallocated at the peak); only a new process would. The operator
does not re-execute itself for that: the pages stay resident until the pod is replaced, which a
controller in the field leaves to its Deployment. Bounded library caches churned by every pod's address
are emptied before each trim, since they are the commonest such survivors.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

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


class MemoryRelease:
    """Runs release_memory() once a burst of forgotten models, or of objects leaving the watch caches, has
    been quiet for `quiet_s`."""

    def __init__(self, quiet_s: float = QUIET_S, shrink_share: float = SHRINK_SHARE) -> None:
        self.quiet_s = quiet_s
        self.shrink_share = shrink_share
        self._pending: asyncio.TimerHandle | None = None
        self._last_size = 0  # watched objects at the previous sample
        self._high_size = 0  # the most since the last release

    def after_forget(self) -> None:
        """A model's state was dropped: release once no other follows for the quiet period."""
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

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
