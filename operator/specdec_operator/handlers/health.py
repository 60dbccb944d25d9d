"""GET /health on runtime pods during a canary: a pod vLLM reports dead fails the canary at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from specdec_operator.tuner.samples import ScrapeTarget
from specdec_operator.tuner.scraper import scrape_url, timed_get


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
