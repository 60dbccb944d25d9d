"""The operator-wide scrape scheduler against a real loopback server standing in for many pods."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from specdec_operator.handlers.services.scrapes import SPREAD, ScrapeScheduler, phase
from specdec_operator.tuner.samples import ScrapeResult, ScrapeTarget
from specdec_operator.tuner.scraper import scrape_session
from tests.unit.tuner.factories import metrics_text
from tests.unit.virtual_time import run_in_virtual_time

BODY = metrics_text()


class Pod:
    """Answers /metrics after `delay_s`, remembering when each request came and the most in flight."""

    def __init__(self, delay_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.delay_s = delay_s
        self.clock = clock
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def handle(self, _: web.Request) -> web.Response:
        self.arrivals.append(self.clock())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            return web.Response(text=BODY)
        finally:
            self.in_flight -= 1


async def serve(pod: Pod) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/metrics", pod.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


@pytest.fixture
async def pod() -> AsyncIterator[tuple[Pod, int]]:
    server = Pod(delay_s=0.01)
    runner, port = await serve(server)
    yield server, port
    await runner.cleanup()


def targets(port: int, model: str, count: int) -> list[ScrapeTarget]:
    return [ScrapeTarget(pod=f"ns/{model}-{i}", uid=f"{model}-{i}", ip="127.0.0.1", port=port, pool="p",
                         revision="r", k=3) for i in range(count)]


def scheduler(session: object, interval_s: float = 0.5, concurrency: int = 8) -> ScrapeScheduler:
    return ScrapeScheduler(session, interval_s=interval_s, timeout_s=60, concurrency=concurrency,  # type: ignore[arg-type]
                           allow_non_loopback=False)


async def test_results_are_stamped_on_the_monotonic_clock_the_tuner_keeps(pod: tuple[Pod, int]) -> None:
    # The tuner compares scrape times with the monotonic times a reconcile hands it (its windows' starts).
    _, port = pod
    async with scrape_session(pool_size=4) as session:
        scrapes = scheduler(session)
        scrapes.want(("ns", "a"), targets(port, "a", 2))
        before = time.monotonic()
        await scrapes.run_round()
        after = time.monotonic()
        ((first, second),) = scrapes.take(("ns", "a"))
        assert before <= first.at <= after and before <= second.at <= after


async def test_each_wanted_pod_is_scraped_once_per_round_and_results_go_to_their_model(
    pod: tuple[Pod, int],
) -> None:
    server, port = pod
    async with scrape_session(pool_size=4) as session:
        scrapes = scheduler(session)
        scrapes.want(("ns", "a"), targets(port, "a", 3))
        scrapes.want(("ns", "b"), targets(port, "b", 2))
        await scrapes.run_round()
        assert len(server.arrivals) == 5
        (a,), (b,) = scrapes.take(("ns", "a")), scrapes.take(("ns", "b"))
        assert sorted(r.target.uid for r in a) == ["a-0", "a-1", "a-2"]
        assert sorted(r.target.uid for r in b) == ["b-0", "b-1"]
        assert {r.outcome for r in a + b} == {"ok"}
        assert scrapes.take(("ns", "a")) == [], "take hands each result out once"


def test_scrapes_are_spread_over_the_interval_not_fired_at_once() -> None:
    """On a loop whose clock moves only when it would wait (tests/unit/virtual_time.py), so a loaded machine
    that starves the test process cannot bunch the arrivals: each pod is scraped at its phase."""

    async def scenario() -> tuple[Pod, list[ScrapeTarget]]:
        clock = asyncio.get_running_loop().time
        server = Pod(delay_s=0.01, clock=clock)
        runner, port = await serve(server)
        try:
            async with scrape_session(pool_size=32) as session:
                scrapes = ScrapeScheduler(session, interval_s=1.0, timeout_s=60, concurrency=32,
                                          allow_non_loopback=False, clock=clock)
                wanted = targets(port, "m", 20)
                scrapes.want(("ns", "m"), wanted)
                await scrapes.run_round()
        finally:
            await runner.cleanup()
        return server, wanted

    server, wanted = run_in_virtual_time(scenario())
    spread = max(server.arrivals) - min(server.arrivals)
    phases = sorted(phase(t.uid) for t in wanted)
    assert spread > 0.5 * (phases[-1] - phases[0]) * SPREAD, f"arrivals span only {spread:.2f}s"
    assert server.most_in_flight < 10


async def test_concurrency_is_bounded_operator_wide(pod: tuple[Pod, int]) -> None:
    server, port = pod
    server.delay_s = 0.2
    async with scrape_session(pool_size=64) as session:
        scrapes = scheduler(session, interval_s=0.01, concurrency=3)  # everything due at once
        for model in "abcd":
            scrapes.want(("ns", model), targets(port, model, 3))
        await scrapes.run_round()
    assert len(server.arrivals) == 12
    assert server.most_in_flight == 3


async def test_forgotten_models_and_dropped_pods_are_not_scraped_or_kept(pod: tuple[Pod, int]) -> None:
    server, port = pod
    async with scrape_session(pool_size=4) as session:
        scrapes = scheduler(session)
        scrapes.want(("ns", "a"), targets(port, "a", 3))
        scrapes.want(("ns", "b"), targets(port, "b", 2))
        await scrapes.run_round()
        scrapes.forget(("ns", "b"))
        scrapes.want(("ns", "a"), targets(port, "a", 3)[:1])
        assert [[r.target.uid for r in round_] for round_ in scrapes.take(("ns", "a"))] == [["a-0"]], \
            "a dropped pod's results go with it"
        server.arrivals.clear()
        await scrapes.run_round()
        assert len(server.arrivals) == 1
        assert scrapes.models == {("ns", "a")} and scrapes.pods == 1
        assert scrapes.take(("ns", "b")) == []


async def test_an_untaken_model_keeps_only_its_newest_rounds(pod: tuple[Pod, int]) -> None:
    _, port = pod
    async with scrape_session(pool_size=4) as session:
        scrapes = scheduler(session, interval_s=0.01)
        scrapes.want(("ns", "a"), targets(port, "a", 1))
        for _ in range(7):
            await scrapes.run_round()
        kept = scrapes.take(("ns", "a"))
    assert len(kept) == 4 and all(len(round_) == 1 for round_ in kept)
    times = [round_[0].at for round_ in kept]
    assert times == sorted(times)


async def test_run_waits_idle_until_a_model_wants_scrapes(pod: tuple[Pod, int]) -> None:
    server, port = pod
    async with scrape_session(pool_size=4) as session:
        scrapes = scheduler(session, interval_s=0.2)
        runner = asyncio.create_task(scrapes.run())
        await asyncio.sleep(0.3)
        assert scrapes.rounds == 0 and server.arrivals == []
        scrapes.want(("ns", "a"), targets(port, "a", 2))
        for _ in range(1200):  # two 0.2 s rounds; up to a minute for a machine busy with other lanes
            if scrapes.rounds >= 2:
                break
            await asyncio.sleep(0.05)
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
    assert scrapes.rounds >= 2 and len(server.arrivals) >= 4


def _uids_by_phase(prefix: str, count: int, low: float, high: float) -> list[str]:
    """`count` pod UIDs whose stable phase lies in [low, high): the test decides who is due first."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        uid = f"{prefix}-{i}"
        if low <= phase(uid) < high:
            found.append(uid)
        i += 1
    return found


async def test_one_model_with_many_slow_pods_cannot_take_every_slot() -> None:
    """Twelve slow pods of one model are due first and would fill all four slots for seconds; the other model's
    pod, due a moment later, still gets a slot at once: a model holds at most half the slots while another waits."""
    slow, fast = Pod(delay_s=1.5), Pod()
    (slow_runner, slow_port), (fast_runner, fast_port) = await serve(slow), await serve(fast)
    greedy = [ScrapeTarget(pod=f"ns/{uid}", uid=uid, ip="127.0.0.1", port=slow_port, pool="p", revision="r", k=3)
              for uid in _uids_by_phase("greedy", 12, 0.0, 0.4)]
    (small_uid,) = _uids_by_phase("small", 1, 0.6, 0.9)
    small = ScrapeTarget(pod=f"ns/{small_uid}", uid=small_uid, ip="127.0.0.1", port=fast_port, pool="p",
                         revision="r", k=3)
    try:
        async with scrape_session(pool_size=64) as session:
            scrapes = ScrapeScheduler(session, interval_s=0.25, timeout_s=60, concurrency=4,
                                      allow_non_loopback=False, rng=random.Random(0))
            scrapes.want(("ns", "greedy"), greedy)
            scrapes.want(("ns", "small"), [small])
            started = time.monotonic()
            await scrapes.run_round()
    finally:
        await slow_runner.cleanup()
        await fast_runner.cleanup()
    assert len(slow.arrivals) == 12 and len(fast.arrivals) == 1
    waited = fast.arrivals[0] - started
    assert waited < 1.0, f"the small model's pod waited {waited:.2f}s behind the greedy model's slow pods"
    assert slow.most_in_flight <= 2
    assert {r.outcome for r in scrapes.take(("ns", "small"))[0]} == {"ok"}


async def test_a_model_alone_uses_every_slot() -> None:
    slow = Pod(delay_s=0.3)
    runner, port = await serve(slow)
    try:
        async with scrape_session(pool_size=64) as session:
            scrapes = ScrapeScheduler(session, interval_s=0.01, timeout_s=60, concurrency=4,
                                      allow_non_loopback=False)
            scrapes.want(("ns", "only"), targets(port, "only", 8))
            await scrapes.run_round()
    finally:
        await runner.cleanup()
    assert slow.most_in_flight == 4


class HangingPod(Pod):
    """Answers only once released: a pod that holds its scrape up to the timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        try:
            await self.released.wait()
            return web.Response(text=BODY)
        finally:
            self.in_flight -= 1


async def test_a_model_gets_its_round_while_another_models_pod_still_hangs() -> None:
    hanging, quick = HangingPod(), Pod()
    (hanging_runner, hanging_port), (quick_runner, quick_port) = await serve(hanging), await serve(quick)
    try:
        async with scrape_session(pool_size=8) as session:
            scrapes = scheduler(session, interval_s=0.05)
            scrapes.want(("ns", "hanging"), targets(hanging_port, "hanging", 1))
            scrapes.want(("ns", "quick"), targets(quick_port, "quick", 1))
            round_ = asyncio.create_task(scrapes.run_round())
            rounds: list[list[ScrapeResult]] = []
            # The quick model's round, and the hanging pod's scrape under way (each starts at its own offset in the
            # round, and on a loaded machine the hanging pod's server may take its request after the quick one
            # answered): up to a minute.
            for _ in range(1200):
                rounds += scrapes.take(("ns", "quick"))
                if rounds and hanging.in_flight == 1:
                    break
                await asyncio.sleep(0.05)
            assert len(rounds) == 1 and len(rounds[0]) == 1
            assert hanging.in_flight == 1, "the hanging pod's scrape never started"
            assert not round_.done(), "the quick model's round came while the hanging pod still held the round"
            round_.cancel()
            with pytest.raises(asyncio.CancelledError):
                await round_
    finally:
        hanging.released.set()
        await hanging_runner.cleanup()
        await quick_runner.cleanup()
