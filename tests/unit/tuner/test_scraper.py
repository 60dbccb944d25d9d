"""The scraper against a real aiohttp server on 127.0.0.1: every outcome, the bound, and the loopback rule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from specdec_operator.metrics import REGISTRY
from specdec_operator.tuner.samples import ScrapeTarget
from specdec_operator.tuner.scraper import (
    DEFAULT_MAX_BODY_BYTES,
    scrape,
    scrape_session,
    scrape_trace_config,
    scrape_url,
)
from tests.unit.tuner.factories import metrics_text

GOOD = metrics_text()
PARTIAL = "".join(line + "\n" for line in GOOD.splitlines() if "generation_tokens" not in line)

# Pods that answer get a timeout no loaded machine comes near (a stall of the test process must not turn an
# answer into a timeout); only the pod that never answers in time gets a short one.
ANSWERS_IN_TIME_S = 60.0


class Pods:
    """One loopback server whose path /<name>/metrics answers like a pod in state <name>."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0
        self.released = asyncio.Event()  # a "slow" pod answers only once the test is over

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.02)
            kind = request.match_info["kind"]
            if kind == "slow":
                await self.released.wait()
            if kind == "steady":
                await asyncio.sleep(0.3)
            if kind == "error":
                return web.Response(status=500, text="boom")
            bodies = {"ok": GOOD, "slow": GOOD, "steady": GOOD, "garbage": "\x00\x01 not metrics {{{\n",
                      "partial": PARTIAL}
            return web.Response(text=bodies[kind])
        finally:
            self.in_flight -= 1


@pytest.fixture
async def server() -> AsyncIterator[tuple[Pods, int]]:
    pods = Pods()
    app = web.Application()
    app.router.add_get("/{kind}/metrics", pods.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield pods, port
    pods.released.set()
    await runner.cleanup()


def _target(kind: str, port: int, ip: str = "127.0.0.1") -> ScrapeTarget:
    return ScrapeTarget(pod=f"ns/{kind}", uid=kind, ip=ip, port=port, pool="p", revision="r", k=3)


class _PathSession:
    """Routes each pod's URL to /<kind>/metrics on the one test server, as if every pod had its own IP."""

    def __init__(self, session: aiohttp.ClientSession, kinds: dict[int, str]) -> None:
        self._session, self._kinds = session, kinds

    def get(self, url: str, **kwargs: object) -> object:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        return self._session.get(url.replace("/metrics", f"/{self._kinds[port]}/metrics"), **kwargs)  # type: ignore[arg-type]


async def _scrape_kinds(port: int, kinds: list[str], **options: object) -> dict[str, str]:
    async with aiohttp.ClientSession() as session:
        results = []
        for kind in kinds:
            routed = _PathSession(session, {port: kind})
            results += await scrape([_target(kind, port)], session=routed, **options)  # type: ignore[arg-type]
    return {result.target.uid: result.outcome for result in results}


async def test_every_outcome_is_a_result_and_nothing_raises(server: tuple[Pods, int]) -> None:
    _, port = server
    outcomes = await _scrape_kinds(port, ["ok", "error", "garbage", "partial"], timeout_s=ANSWERS_IN_TIME_S,
                                   concurrency=4)
    outcomes |= await _scrape_kinds(port, ["slow"], timeout_s=0.5, concurrency=4)
    assert outcomes == {
        "ok": "ok",
        "error": "http_error",
        "slow": "timeout",
        "garbage": "parse_error",
        "partial": "incomplete",
    }


async def test_a_closed_port_is_an_http_error() -> None:
    async with aiohttp.ClientSession() as session:
        (result,) = await scrape([_target("ok", 1)], timeout_s=1, concurrency=1, session=session)
    assert result.outcome == "http_error"
    assert result.sample is None


async def test_samples_come_back_parsed_and_timed(server: tuple[Pods, int]) -> None:
    _, port = server
    async with aiohttp.ClientSession() as session:
        (result,) = await scrape(
            [_target("ok", port)],
            timeout_s=ANSWERS_IN_TIME_S,
            concurrency=1,
            session=_PathSession(session, {port: "ok"}),  # type: ignore[arg-type]
            clock=lambda: 42.0,
        )
    assert result.outcome == "ok" and result.at == 42.0
    assert result.sample is not None and result.sample.k == 3
    assert result.duration_s > 0


async def test_concurrency_is_bounded(server: tuple[Pods, int]) -> None:
    pods, port = server
    async with aiohttp.ClientSession() as session:
        results = await scrape(
            [_target("ok", port)] * 12,
            timeout_s=ANSWERS_IN_TIME_S,
            concurrency=3,
            session=_PathSession(session, {port: "ok"}),  # type: ignore[arg-type]
        )
    assert [r.outcome for r in results] == ["ok"] * 12
    assert pods.most_in_flight == 3


@pytest.mark.parametrize("ip", ["10.0.0.7", "192.168.1.1", "::1", "not-an-ip", "128.0.0.1"])
async def test_non_loopback_targets_are_refused_without_connecting(ip: str) -> None:
    async with aiohttp.ClientSession() as session:
        (result,) = await scrape([_target("ok", 8000, ip)], timeout_s=0.1, concurrency=1, session=session)
    assert result.outcome == "refused"


def test_production_clusters_may_opt_into_pod_ips() -> None:
    assert scrape_url(_target("ok", 8000, "10.1.2.3"), allow_non_loopback=True) == "http://10.1.2.3:8000/metrics"
    assert scrape_url(_target("ok", 8000, "fd00::1"), allow_non_loopback=True) == "http://[fd00::1]:8000/metrics"
    with pytest.raises(ValueError, match=r"not a 127\.0\.0\.0/8"):
        scrape_url(_target("ok", 8000, "10.1.2.3"), allow_non_loopback=False)


async def test_outcomes_are_counted_in_the_operator_metrics(server: tuple[Pods, int]) -> None:
    _, port = server

    def count() -> float:
        return REGISTRY.get_sample_value("specdec_scrapes_total", {"result": "parse_error"}) or 0.0

    before = count()
    await _scrape_kinds(port, ["garbage"], timeout_s=ANSWERS_IN_TIME_S, concurrency=1)
    assert count() == before + 1


async def test_waiting_for_a_pooled_connection_is_not_a_scrape_timeout(server: tuple[Pods, int]) -> None:
    """Eight pods answering in 0.3 s through a pool of one: the last waits ~2.1 s for a connection, longer than
    the 1.5 s timeout, then answers within it. Only the time after the request is sent counts against the pod.
    The margins are wide: a slow machine makes every answer later, and the naive pool below only later still."""
    _, port = server
    targets = [_target("steady", port)] * 8
    async with scrape_session(pool_size=1) as session:
        results = await scrape(targets, timeout_s=1.5, concurrency=8, session=_PathSession(session, {port: "steady"}))  # type: ignore[arg-type]
    assert [r.outcome for r in results] == ["ok"] * 8
    assert max(r.duration_s for r in results) > 1.5, "the pool made a scrape wait longer than the timeout"

    # The same pool without the deadline hooks counts the wait: the scrapes queued behind others time out.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as plain:
        naive = await scrape(targets, timeout_s=1.5, concurrency=8, session=_PathSession(plain, {port: "steady"}))  # type: ignore[arg-type]
    assert "timeout" in [r.outcome for r in naive]


async def test_a_pod_slow_after_the_send_still_times_out_behind_a_pool_wait(server: tuple[Pods, int]) -> None:
    _, port = server
    async with scrape_session(pool_size=1) as session:
        results = await scrape([_target("steady", port), _target("slow", port)], timeout_s=1.5, concurrency=2,
                               session=_KindSession(session, port))  # type: ignore[arg-type]
    assert [r.outcome for r in results] == ["ok", "timeout"]
    assert results[1].duration_s < 4, "the slow pod's timeout ran from its send, not until the pod answered"


class _KindSession:
    """Routes each target to /<uid>/metrics: the test's targets name their kind in their uid."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self._session, self._port = session, port
        self._next: list[str] = []

    def get(self, url: str, **kwargs: object) -> object:
        kind = "steady" if not self._next else "slow"
        self._next.append(kind)
        return self._session.get(url.replace("/metrics", f"/{kind}/metrics"), **kwargs)  # type: ignore[arg-type]


# --- hostile bodies through the real read path (issue 34) ---

SEGMENT = 64 * 1024


def _big_body(size: int) -> str:
    """A complete vLLM body padded with comment lines (which the parser skips) to about `size` bytes; the
    vLLM samples come LAST, so a reader that stops early loses them and the sample is incomplete."""
    filler_line = "# " + "x" * 1021 + "\n"
    body = metrics_text()
    filler = filler_line * max(0, (size - len(body)) // len(filler_line))
    return filler + body


async def _segmented_server(body: bytes, segment: int) -> tuple[web.AppRunner, int]:
    """Writes the body in `segment`-byte pieces, draining (flushing) after each and yielding to the loop,
    so the client sees it arrive over many reads, as a real network delivers a large /metrics."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
        await response.prepare(request)
        for start in range(0, len(body), segment):
            await response.write(body[start : start + segment])
            await asyncio.sleep(0.001)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def _scrape_body(body: bytes, **options: object) -> tuple[str, str, object]:
    runner, port = await _segmented_server(body, SEGMENT)
    try:
        async with scrape_session(pool_size=2) as session:
            (result,) = await scrape([_target("big", port)], timeout_s=ANSWERS_IN_TIME_S, concurrency=1,
                                     session=session, **options)  # type: ignore[arg-type]
    finally:
        await runner.cleanup()
    return result.outcome, result.error, result.sample


async def test_a_body_just_under_the_cap_in_64k_segments_is_read_to_the_end() -> None:
    body = _big_body(DEFAULT_MAX_BODY_BYTES - 4096).encode()
    assert DEFAULT_MAX_BODY_BYTES - 8192 < len(body) <= DEFAULT_MAX_BODY_BYTES
    outcome, error, sample = await _scrape_body(body)
    assert (outcome, error) == ("ok", "")
    assert sample is not None and sample.k == 3  # type: ignore[attr-defined]


async def test_a_body_over_the_cap_is_a_failed_scrape_not_a_partial_parse() -> None:
    body = _big_body(DEFAULT_MAX_BODY_BYTES + 256 * 1024).encode()
    outcome, error, sample = await _scrape_body(body)
    assert outcome == "http_error" and sample is None
    assert "larger than" in error and str(DEFAULT_MAX_BODY_BYTES) in error


async def test_the_cap_is_a_setting() -> None:
    body = _big_body(300 * 1024).encode()
    assert (await _scrape_body(body, max_body_bytes=256 * 1024))[0] == "http_error"
    assert (await _scrape_body(body, max_body_bytes=512 * 1024))[0] == "ok"


def test_the_default_cap_leaves_room_over_a_data_parallel_vllm_body() -> None:
    from tests.unit.tuner.differential import data_parallel, simulator_body

    eight_engines = len(data_parallel(simulator_body(7, 7, seconds=300.0), 8).encode())
    assert eight_engines * 8 < DEFAULT_MAX_BODY_BYTES <= 4 * 1024 * 1024


async def test_the_deadline_never_reaches_twice_the_timeout() -> None:
    """A pod that takes most of the timeout to accept the request and then dribbles the answer: the whole
    scrape (connect + send + read) is bounded by one timeout, not one for the connect and one after the send."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(100):  # a slowloris: a byte now and then, never the end
            await response.write(b"#")
            await asyncio.sleep(0.05)
        return response

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        session = aiohttp.ClientSession(connector=_SlowConnector(limit=1), trace_configs=[scrape_trace_config()])
        async with session:
            (result,) = await scrape([_target("slowloris", port)], timeout_s=1.0, concurrency=1, session=session)
    finally:
        await runner.cleanup()
    assert result.outcome == "timeout"
    assert result.duration_s < 1.6, f"the scrape took {result.duration_s:.2f}s with a 1s timeout"


class _SlowConnector(aiohttp.TCPConnector):
    """A connection that takes 0.8 s to open, like a SYN answered late by a loaded node."""

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.8)
        return await super()._create_connection(*args, **kwargs)
