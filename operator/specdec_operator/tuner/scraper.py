"""Scrape runtime pods' `/metrics` over HTTP: bounded concurrency, a timeout per pod, never an exception. And
GET their `/health` during a canary (`probe_health`): a pod vLLM reports dead fails the canary at once.

The per-pod timeout covers the pod's own time: connecting, sending, and reading the whole body. Time spent
waiting for a pooled connection is not the pod's fault: counting it made a busy operator report healthy pods
as timing out (and, during a canary, fail them), so that wait pauses the clock and the rest of the budget
resumes after it; nothing restarts the budget, so no scrape runs longer than one timeout of the pod's time.
Sessions with `scrape_trace_config` (those from `scrape_session`) carry the hooks that pause it; with any
other session the timeout runs from the call, as a plain `asyncio.timeout` would.

The body is read to its end, chunk by chunk, and refused as soon as it passes the size cap: a body cut at
the first chunk parsed with series silently missing, and a body far larger than vLLM's is not read at all.

Every outcome (ok, incomplete, parse_error, timeout, http_error, refused) comes back as a
`ScrapeResult` and is counted in the operator's own metrics, so a broken or slow pod is visible and
harmless: the tuner treats anything but a complete sample as "no new data".
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import aiohttp

from specdec_operator.metrics import SCRAPE_SECONDS, SCRAPES
from specdec_operator.tuner.samples import MetricsParseError, ScrapeResult, ScrapeTarget, parse_metrics

# The default cap on a /metrics body (settings.scrape_max_body_bytes). vLLM's /metrics is 15-20 KiB per engine;
# a data-parallel pod repeats its samples per engine, about 125 KiB with 8 engines. 2 MiB leaves 16 times that
# for more engines, LoRA adapters and label growth, and bounds what one pod costs a scrape: reading and parsing
# 2 MiB of wanted samples takes ~0.2 s, where the old 8 MiB cap let one pod cost 4-6 s and ~110 MiB.
DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
# Bodies larger than this are parsed in a worker thread, so a large body delays other pods' scrapes by a thread
# switch rather than by its whole parse. Smaller ones (every healthy pod's) parse inline: a thread hop costs more.
INLINE_PARSE_BYTES = 256 * 1024
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


class _ScrapeFailed(Exception):
    """The pod answered, but not with a /metrics body we will read."""


@dataclass
class _Deadline:
    """The one request's timeout, which the session's trace hooks pause and resume: the pod gets `budget_s`
    of its own time in all, however often it waits for a pooled connection in between."""

    timeout: asyncio.Timeout
    budget_s: float
    paused_at: float | None = None

    def pause(self) -> None:
        if self.paused_at is None:
            self.paused_at = asyncio.get_running_loop().time()
            when = self.timeout.when()
            self.budget_s = max(0.0, when - self.paused_at) if when is not None else self.budget_s
            self.timeout.reschedule(None)

    def resume(self) -> None:
        if self.paused_at is not None:
            self.paused_at = None
            self.timeout.reschedule(asyncio.get_running_loop().time() + self.budget_s)


def _deadline_of(trace_config_ctx: SimpleNamespace) -> _Deadline | None:
    deadline = trace_config_ctx.trace_request_ctx
    return deadline if isinstance(deadline, _Deadline) else None


async def _on_queued(_: aiohttp.ClientSession, trace_config_ctx: SimpleNamespace, __: Any) -> None:
    if (deadline := _deadline_of(trace_config_ctx)) is not None:
        deadline.pause()  # waiting for a pooled connection: not the pod's time


async def _on_dequeued(_: aiohttp.ClientSession, trace_config_ctx: SimpleNamespace, __: Any) -> None:
    if (deadline := _deadline_of(trace_config_ctx)) is not None:
        deadline.resume()


def scrape_trace_config() -> aiohttp.TraceConfig:
    """The hooks that stop a scrape's clock while it waits for a pooled connection."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_queued_start.append(_on_queued)
    trace.on_connection_queued_end.append(_on_dequeued)
    return trace


def scrape_session(pool_size: int) -> aiohttp.ClientSession:
    """The operator's HTTP session for pods: a pool of `pool_size` connections, and deadlines that skip pool waits."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=pool_size),
                                 trace_configs=[scrape_trace_config()])


@asynccontextmanager
async def timed_get(
    session: aiohttp.ClientSession, url: str, timeout_s: float
) -> AsyncIterator[aiohttp.ClientResponse]:
    """session.get(url) whose `timeout_s` covers connecting, sending and everything read inside the block;
    waiting in the pool's queue is free.
    """
    async with asyncio.timeout(timeout_s) as timeout:
        deadline = _Deadline(timeout, timeout_s)
        async with session.get(url, allow_redirects=False, trace_request_ctx=deadline) as response:
            yield response


def scrape_url(target: ScrapeTarget, *, allow_non_loopback: bool) -> str:
    """The pod's /metrics URL. Raises ValueError for an IP we may not (or cannot) connect to."""
    address = ipaddress.ip_address(target.ip)
    if not allow_non_loopback and not (address.version == 4 and address in _LOOPBACK):
        raise ValueError(f"{target.ip} is not a 127.0.0.0/8 address and non-loopback scraping is off")
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{host}:{target.port}/metrics"


async def scrape(
    targets: Sequence[ScrapeTarget],
    *,
    timeout_s: float,
    concurrency: int,
    session: aiohttp.ClientSession,
    allow_non_loopback: bool = False,
    clock: Callable[[], float] = time.time,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> list[ScrapeResult]:
    """Scrape every target, at most `concurrency` at once; results in target order."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(target: ScrapeTarget) -> ScrapeResult:
        async with gate:
            return await _scrape_one(target, timeout_s, session, allow_non_loopback, clock, max_body_bytes)

    return list(await asyncio.gather(*(one(target) for target in targets)))


async def _scrape_one(
    target: ScrapeTarget,
    timeout_s: float,
    session: aiohttp.ClientSession,
    allow_non_loopback: bool,
    clock: Callable[[], float],
    max_body_bytes: int,
) -> ScrapeResult:
    started = time.perf_counter()
    try:
        url = scrape_url(target, allow_non_loopback=allow_non_loopback)
    except ValueError as err:
        return _finish(ScrapeResult(target, clock(), "refused", error=str(err)))
    try:
        text = await _fetch(session, url, timeout_s, max_body_bytes)
        # The counters are as of the answer, not of the end of the parse: parsing takes a while on a busy machine,
        # and a late stamp stretches the interval that the batch size (latencies over wall time) is divided by.
        answered = clock()
        sample = parse_metrics(text) if len(text) <= INLINE_PARSE_BYTES else await asyncio.to_thread(
            parse_metrics, text)
    except _ScrapeFailed as err:
        result = ScrapeResult(target, clock(), "http_error", error=str(err))
    except TimeoutError:
        result = ScrapeResult(target, clock(), "timeout", error=f"no answer within {timeout_s:g}s")
    except MetricsParseError as err:
        result = ScrapeResult(target, clock(), "parse_error", error=str(err))
    except (aiohttp.ClientError, OSError, ValueError) as err:
        result = ScrapeResult(target, clock(), "http_error", error=f"{type(err).__name__}: {err}"[:300])
    else:
        problems = "; ".join((*sample.violations, *sample.problems))[:500]
        result = ScrapeResult(target, answered, "ok" if sample.complete else "incomplete", sample, problems)
    return _finish(replace(result, duration_s=time.perf_counter() - started))


async def _fetch(session: aiohttp.ClientSession, url: str, timeout_s: float, max_body_bytes: int) -> str:
    """The whole body, read to EOF within the timeout; a body over `max_body_bytes` fails the scrape unread."""
    too_large = f"body larger than {max_body_bytes} bytes (settings: scrape_max_body_bytes)"
    async with timed_get(session, url, timeout_s) as response:
        if response.status != 200:
            raise _ScrapeFailed(f"HTTP {response.status}")
        if response.content_length is not None and response.content_length > max_body_bytes:
            raise _ScrapeFailed(too_large)
        chunks: list[bytes] = []
        size = 0
        # readany() returns whatever has arrived (one TCP segment or more); EOF is an empty chunk.
        while chunk := await response.content.readany():
            size += len(chunk)
            if size > max_body_bytes:
                raise _ScrapeFailed(too_large)
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")


def _finish(result: ScrapeResult) -> ScrapeResult:
    SCRAPES.labels(result=result.outcome).inc()
    if result.outcome != "refused":
        SCRAPE_SECONDS.observe(result.duration_s)
    return result


async def _healthy(target: ScrapeTarget, session: aiohttp.ClientSession, timeout_s: float, allow: bool) -> bool:
    try:
        url = scrape_url(target, allow_non_loopback=allow).removesuffix("/metrics") + "/health"
    except ValueError:
        return True  # refused to dial: nothing measured, so nothing to hold against the pod
    try:
        async with timed_get(session, url, timeout_s) as response:
            return response.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def probe_health(
    targets: Sequence[ScrapeTarget], session: aiohttp.ClientSession, timeout_s: float, allow_non_loopback: bool
) -> list[tuple[ScrapeTarget, bool]]:
    """Each pod with whether its /health answered 200."""
    answers = await asyncio.gather(*(_healthy(t, session, timeout_s, allow_non_loopback) for t in targets))
    return list(zip(targets, answers, strict=True))
