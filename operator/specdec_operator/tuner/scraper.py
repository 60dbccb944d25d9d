"""Scrape runtime pods' `/metrics` over HTTP: bounded concurrency, a timeout per pod, never an exception.

Every outcome (ok, incomplete, parse_error, timeout, http_error, refused) comes back as a
`ScrapeResult` and is counted in the operator's own metrics, so a broken or slow pod is visible and
harmless: the tuner treats anything but a complete sample as "no new data".
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import aiohttp

from specdec_operator.metrics import SCRAPE_SECONDS, SCRAPES
from specdec_operator.tuner.samples import MetricsParseError, ScrapeResult, ScrapeTarget, parse_metrics

# vLLM's /metrics is tens of KiB; anything far larger is not vLLM and is not read to the end.
MAX_BODY_BYTES = 8 * 1024 * 1024
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


class _ScrapeFailed(Exception):
    """The pod answered, but not with a /metrics body we will read."""


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
) -> list[ScrapeResult]:
    """Scrape every target, at most `concurrency` at once; results in target order."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(target: ScrapeTarget) -> ScrapeResult:
        async with gate:
            return await _scrape_one(target, timeout_s, session, allow_non_loopback, clock)

    return list(await asyncio.gather(*(one(target) for target in targets)))


async def _scrape_one(
    target: ScrapeTarget,
    timeout_s: float,
    session: aiohttp.ClientSession,
    allow_non_loopback: bool,
    clock: Callable[[], float],
) -> ScrapeResult:
    started = time.perf_counter()
    try:
        url = scrape_url(target, allow_non_loopback=allow_non_loopback)
    except ValueError as err:
        return _finish(ScrapeResult(target, clock(), "refused", error=str(err)))
    try:
        async with asyncio.timeout(timeout_s):
            text = await _fetch(session, url)
        sample = parse_metrics(text)
    except _ScrapeFailed as err:
        result = ScrapeResult(target, clock(), "http_error", error=str(err))
    except TimeoutError:
        result = ScrapeResult(target, clock(), "timeout", error=f"no answer within {timeout_s:g}s")
    except MetricsParseError as err:
        result = ScrapeResult(target, clock(), "parse_error", error=str(err))
    except (aiohttp.ClientError, OSError, ValueError) as err:
        result = ScrapeResult(target, clock(), "http_error", error=f"{type(err).__name__}: {err}"[:300])
    else:
        problems = "; ".join(sample.problems)
        result = ScrapeResult(target, clock(), "ok" if sample.complete else "incomplete", sample, problems)
    return _finish(replace(result, duration_s=time.perf_counter() - started))


async def _fetch(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url, allow_redirects=False) as response:
        if response.status != 200:
            raise _ScrapeFailed(f"HTTP {response.status}")
        body = await response.content.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES:
            raise _ScrapeFailed(f"body larger than {MAX_BODY_BYTES} bytes")
        return body.decode("utf-8", errors="replace")


def _finish(result: ScrapeResult) -> ScrapeResult:
    SCRAPES.labels(result=result.outcome).inc()
    if result.outcome != "refused":
        SCRAPE_SECONDS.observe(result.duration_s)
    return result
