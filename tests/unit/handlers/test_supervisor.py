"""Supervised background tasks: an unexpected error is logged, counted and followed by a restart with capped
backoff; a task that cannot recover fails the liveness probe. The policy and the supervisor run on an injected
clock and sleep, so nothing here waits out a backoff."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import kopf
import pytest

from specdec_operator.handlers.context import OperatorContext
from specdec_operator.handlers.register import background_tasks, start_background_tasks
from specdec_operator.handlers.services import scrapes as scrapes_module
from specdec_operator.handlers.services.scrapes import ScrapeScheduler
from specdec_operator.handlers.services.supervisor import FailureStreak, RestartPolicy, Supervisor
from specdec_operator.metrics import BACKGROUND_TASK_RESTARTS
from specdec_operator.settings import OperatorEnvSettings
from specdec_operator.tuner.scraper import scrape_session
from tests.unit.handlers.test_scrapes import Pod, serve, targets


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


POLICY = RestartPolicy(first_delay_s=1.0, factor=2.0, max_delay_s=10.0, healthy_after_s=60.0, give_up_failures=5)


def restarts(task: str) -> float:
    return BACKGROUND_TASK_RESTARTS.labels(task=task)._value.get()


def test_the_backoff_doubles_from_the_first_delay_and_stops_at_the_cap() -> None:
    assert [POLICY.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert POLICY.delay(10_000) == 10.0  # no overflow however long the streak


def test_a_streak_gives_up_after_that_many_quick_failures_and_a_long_run_starts_a_new_one() -> None:
    streak = FailureStreak(POLICY)
    delays = [streak.ended(ran_s=0.5, error="boom") for _ in range(4)]
    assert delays == [1.0, 2.0, 4.0, 8.0] and not streak.gave_up
    assert streak.ended(ran_s=59.0, error="boom") == 10.0 and streak.gave_up
    # It ran a healthy while: the failure after that is the first of a new streak.
    assert streak.ended(ran_s=60.0, error="again") == 1.0 and streak.failures == 1 and not streak.gave_up
    streak.ran_well(30.0)
    assert streak.failures == 1
    streak.ran_well(61.0)
    assert streak.failures == 0 and streak.last_error is None


class FakeTime:
    """A clock that moves only when the supervisor sleeps; sleeps past `blocks_after` never return."""

    def __init__(self, blocks_after: int) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.blocks_after = blocks_after
        self.blocked = asyncio.Event()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if len(self.sleeps) >= self.blocks_after:
            self.blocked.set()
            await asyncio.Event().wait()


def failing(runs: list[int], error: Exception | None) -> Callable[[], Awaitable[None]]:
    async def loop() -> None:
        runs.append(1)
        if error is not None:
            raise error

    return loop


@pytest.fixture
async def supervisor_and_time() -> AsyncIterator[tuple[Supervisor, FakeTime]]:
    fake = FakeTime(blocks_after=5)
    supervisor = Supervisor(POLICY, clock=fake.clock, sleep=fake.sleep)
    yield supervisor, fake
    await supervisor.close()


async def test_a_task_that_keeps_failing_restarts_with_backoff_then_fails_the_liveness_probe(
    supervisor_and_time: tuple[Supervisor, FakeTime], caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor, fake = supervisor_and_time
    runs: list[int] = []
    before = restarts("test_failing")
    with caplog.at_level(logging.WARNING, logger="specdec_operator.handlers.services.supervisor"):
        supervisor.start("test_failing", failing(runs, RuntimeError("unexpected")))
        await asyncio.wait_for(fake.blocked.wait(), 10)
    assert fake.sleeps == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert len(runs) == 5 and restarts("test_failing") - before == 5
    assert "RuntimeError: unexpected" in caplog.text and "Traceback" in caplog.text
    assert supervisor.unhealthy() == {"test_failing": "5 failures in a row, last: RuntimeError: unexpected"}
    context = type("Context", (), {"supervisor": supervisor})()
    with pytest.raises(kopf.PermanentError, match="test_failing"):
        await background_tasks(memo=type("Memo", (), {"context": context})())


async def test_a_task_that_returns_is_restarted_too(supervisor_and_time: tuple[Supervisor, FakeTime]) -> None:
    supervisor, fake = supervisor_and_time
    runs: list[int] = []
    supervisor.start("test_returning", failing(runs, None))
    await asyncio.wait_for(fake.blocked.wait(), 10)
    assert len(runs) == 5 and restarts("test_returning") == 5


async def test_a_healthy_task_keeps_the_probe_passing_and_close_cancels_it() -> None:
    fake = FakeTime(blocks_after=1)
    supervisor = Supervisor(POLICY, clock=fake.clock, sleep=fake.sleep)
    running = asyncio.Event()

    async def forever() -> None:
        running.set()
        await asyncio.Event().wait()

    task = supervisor.start("test_forever", forever)
    await asyncio.wait_for(running.wait(), 10)
    context = type("Context", (), {"supervisor": supervisor})()
    report = await background_tasks(memo=type("Memo", (), {"context": context})())
    assert report == {"test_forever": {"running": True, "restarts": 0, "failures": 0}}
    with pytest.raises(ValueError, match="already supervised"):
        supervisor.start("test_forever", forever)
    await supervisor.close()
    assert task.cancelled() and fake.sleeps == []


async def test_a_killed_scrape_scheduler_restarts_and_scraping_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's own wiring (handlers/register.py): the scheduler's task dies of an unexpected error in
    the middle of a round; the supervisor starts it again and the model gets a scrape round after that."""
    server = Pod()
    scraped = asyncio.Event()
    handle = server.handle

    async def noted(request: object) -> object:
        scraped.set()
        return await handle(request)  # type: ignore[arg-type]

    server.handle = noted  # type: ignore[method-assign]
    runner, port = await serve(server)
    real_scrape = scrapes_module.scrape
    kills: list[int] = []

    async def scrape_killed_once(*args: object, **kwargs: object) -> object:
        if not kills:
            kills.append(1)
            raise KeyError("a bug in the scrape path")
        return await real_scrape(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scrapes_module, "scrape", scrape_killed_once)
    fake = FakeTime(blocks_after=100)
    session = scrape_session(pool_size=4)
    context = OperatorContext(settings=OperatorEnvSettings(), api=None, http=session)  # type: ignore[arg-type]
    context.supervisor = Supervisor(POLICY, clock=fake.clock, sleep=fake.sleep)  # restarts without waiting
    context.scrapes = ScrapeScheduler(session, interval_s=0.2, timeout_s=2, concurrency=4, allow_non_loopback=False)
    round_done = asyncio.Event()
    run_round = context.scrapes.run_round

    async def noted_round() -> None:
        await run_round()
        round_done.set()

    context.scrapes.run_round = noted_round  # type: ignore[method-assign]
    before = restarts("scrape_scheduler")
    try:
        start_background_tasks(context)
        context.scrapes.want(("ns", "m"), targets(port, "m", 2))
        # The first scrape raised: the round and the task ended; the supervisor counted it and restarted.
        await asyncio.wait_for(scraped.wait(), 30)
        assert kills == [1] and restarts("scrape_scheduler") - before == 1 and fake.sleeps == [1.0]
        await asyncio.wait_for(round_done.wait(), 30)  # the restarted scheduler finished a round
        (results,) = context.scrapes.take(("ns", "m"))
        assert sorted(r.target.uid for r in results) == ["m-0", "m-1"]
        assert context.supervisor.unhealthy() == {}
    finally:
        await context.supervisor.close()
        await session.close()
        await runner.cleanup()


async def test_kopfs_liveness_endpoint_answers_500_while_a_task_cannot_recover() -> None:
    """The real endpoint: kopf's health reporter runs the probe handlers (ours among them) per request."""
    from kopf._cogs.structs import ephemera
    from kopf._core.engines import probing
    from kopf._core.intents import registries

    fake = FakeTime(blocks_after=1)
    supervisor = Supervisor(RestartPolicy(give_up_failures=1), clock=fake.clock, sleep=fake.sleep)
    memo = ephemera.AnyMemo(kopf.Memo(context=OperatorContext(
        settings=OperatorEnvSettings(), api=None, http=None)))  # type: ignore[arg-type]
    memo.context.supervisor = supervisor
    port = free_port()
    serving = asyncio.Event()
    reporter = asyncio.create_task(probing.health_reporter(
        f"http://127.0.0.1:{port}/healthz", memo=memo, indices={},  # type: ignore[arg-type]
        registry=registries.get_default_registry(), settings=kopf.OperatorSettings(), ready_flag=serving))
    try:
        await asyncio.wait_for(serving.wait(), 10)
        supervisor.start("test_probe", failing([], RuntimeError("unexpected")))
        await asyncio.wait_for(fake.blocked.wait(), 10)
        # (Asked first: kopf caches a passing probe for 10 s, a failing one not at all.)
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as response:
            assert response.status == 500  # the kubelet restarts the container after failureThreshold
    finally:
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)
        await supervisor.close()
