"""One operator-wide scrape scheduler: every wanted pod scraped once per interval, spread over it.

Model loops used to scrape their own pods on their own timers, so 500 models could all fire at once
and a model's scrape round waited on every other model's. Here each model says which pods it wants
scraped (`want`) and picks up what came back (`take`), one list per finished round, since the tuner's
windows read a round as "every pod the model has" (a pod missing from a round is a pod gone). One loop
runs the rounds:

- each pod has a stable phase in the interval (from its UID) plus a little random jitter, so load is
  even and a pod's scrapes are about one interval apart;
- at most `concurrency` scrapes are in flight, and each pod's timeout starts when its request is sent
  (tuner/scraper.py), so queueing behind other pods never looks like a slow pod;
- the slots are shared fairly between models (`FairGate`): while another model waits or scrapes, no model holds
  more than half of them, and a freed slot goes to the waiting model that holds fewest, so one model with many
  slow (or hostile) pods delays its own round, not everyone's;
- a model that stops wanting scrapes (deleted, tuning off) is forgotten with everything it had.

Rounds never overlap: a round that overruns its interval delays the next, and that shows in
specdec_scrape_round_duration_seconds. Each model's results are handed over as soon as its own pods answered,
so a pod that answers at the timeout delays its own model's round only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import aiohttp

from specdec_operator.handlers.model_memory import ModelKey
from specdec_operator.metrics import SCRAPE_LAST_ROUND_SECONDS, SCRAPE_ROUND_SECONDS, SCRAPE_TARGETS
from specdec_operator.tuner.samples import ScrapeResult, ScrapeTarget
from specdec_operator.tuner.scraper import DEFAULT_MAX_BODY_BYTES, scrape

logger = logging.getLogger(__name__)

# Scrapes start within this share of the interval, leaving the rest for the slowest answers.
SPREAD = 0.8
JITTER = 0.05  # of the interval, random per round, on top of the pod's stable phase
# A model that does not take its results keeps at most this many rounds (the newest).
KEPT_ROUNDS = 4


def phase(uid: str) -> float:
    """A stable position in [0, 1) for the pod: the same every round, different between pods."""
    return (zlib.crc32(uid.encode()) & 0xFFFFFFFF) / 2**32


class FairGate:
    """`slots` scrapes in flight at once, shared between models.

    A model may hold every slot only while it is the only model (`models()`: the models that want scrapes; by
    default those holding or awaiting a slot); otherwise it holds at most half of them (at least one), so the
    other half is free for the rest the moment they are due, however long one model's pods take to answer.
    Each freed slot goes to the waiting model holding the fewest (the longest-waiting among equals). The
    per-model state is dropped when a model holds and awaits nothing, so the gate's memory follows the models
    scraping now.
    """

    def __init__(self, slots: int, models: Callable[[], int] | None = None) -> None:
        self.slots = max(1, slots)
        self._models = models
        self._held: Counter[ModelKey] = Counter()
        self._waiting: dict[ModelKey, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._arrivals = itertools.count()

    def _cap(self) -> int:
        known = self._models() if self._models is not None else 0
        return self.slots if max(known, self.models) <= 1 else max(1, self.slots // 2)

    def _dispatch(self) -> None:
        while sum(self._held.values()) < self.slots:
            cap = self._cap()
            eligible = [key for key, queue in self._waiting.items() if queue and self._held[key] < cap]
            if not eligible:
                return
            key = min(eligible, key=lambda k: (self._held[k], self._waiting[k][0][0]))
            queue = self._waiting[key]
            _, future = queue.popleft()
            if not queue:
                del self._waiting[key]
            if not future.done():
                self._held[key] += 1
                future.set_result(None)

    async def acquire(self, key: ModelKey) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (next(self._arrivals), future)
        self._waiting.setdefault(key, deque()).append(entry)
        self._dispatch()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(key)  # granted, then cancelled before it could run: give the slot back
            else:
                queue = self._waiting.get(key)
                if queue is not None and entry in queue:
                    queue.remove(entry)
                    if not queue:
                        del self._waiting[key]
            raise

    def release(self, key: ModelKey) -> None:
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]
        self._dispatch()

    @property
    def models(self) -> int:
        """Models holding or awaiting a slot now."""
        return len(set(self._waiting) | set(self._held))


@dataclass
class _ModelScrapes:
    targets: dict[str, ScrapeTarget] = field(default_factory=dict)  # by pod UID
    rounds: list[list[ScrapeResult]] = field(default_factory=list)  # finished rounds, oldest first


class ScrapeScheduler:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        interval_s: float,
        timeout_s: float,
        concurrency: int,
        allow_non_loopback: bool,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        rng: random.Random | None = None,
        # The tuner's clock (OperatorContext.clock): it compares when a pod was scraped with the times a reconcile
        # hands it (tuner/engine.py), so results are stamped on the same monotonic clock; rounds are paced on it.
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.allow_non_loopback = allow_non_loopback
        self.max_body_bytes = max_body_bytes
        self._gate = FairGate(concurrency, models=lambda: len(self._models))
        self._rng = rng or random.Random()
        self._clock = clock
        self._models: dict[ModelKey, _ModelScrapes] = {}
        self._wanted = asyncio.Event()
        self.rounds = 0
        self.delivered_at: dict[ModelKey, float] = {}  # when each model's latest round was handed over (the clock)

    # -- the models' side ---------------------------------------------------------------------

    def want(self, key: ModelKey, targets: Iterable[ScrapeTarget]) -> None:
        """Scrape these pods of the model from the next round on (replacing the model's previous set)."""
        model = self._models.setdefault(key, _ModelScrapes())
        model.targets = {target.uid: target for target in targets}
        wanted = set(model.targets)
        model.rounds = [[result for result in results if result.target.uid in wanted] for results in model.rounds]
        self._wanted.set()

    def take(self, key: ModelKey) -> list[list[ScrapeResult]]:
        """The model's finished rounds since its last take, oldest first; each lists every pod scraped."""
        model = self._models.get(key)
        if model is None:
            return []
        rounds, model.rounds = model.rounds, []
        return rounds

    def forget(self, key: ModelKey) -> None:
        self._models.pop(key, None)
        self.delivered_at.pop(key, None)

    @property
    def models(self) -> set[ModelKey]:
        return set(self._models)

    @property
    def pods(self) -> int:
        return sum(len(model.targets) for model in self._models.values())

    # -- the rounds -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run rounds until cancelled."""
        while True:
            if not self._models:
                self._wanted.clear()
                await self._wanted.wait()
            started = self._clock()
            await self.run_round()
            await asyncio.sleep(max(0.0, started + self.interval_s - self._clock()))

    async def run_round(self) -> None:
        started = self._clock()
        jobs = [
            (key, target)
            for key, model in self._models.items()
            for target in model.targets.values()
        ]
        SCRAPE_TARGETS.set(len(jobs))
        span = self.interval_s * SPREAD
        offsets = [((phase(target.uid) + self._rng.uniform(0, JITTER)) % 1.0) * span for _, target in jobs]
        by_model: dict[ModelKey, list[tuple[ScrapeTarget, float]]] = {}
        for (key, target), offset in zip(jobs, offsets, strict=True):
            by_model.setdefault(key, []).append((target, started + offset))
        # Task groups, not gather: if one scrape fails unexpectedly the others are cancelled with it, so a
        # round the supervisor restarts (handlers/services/supervisor.py) leaves no scrape behind holding the gate.
        async with asyncio.TaskGroup() as group:
            for key, model_jobs in by_model.items():
                group.create_task(self._model_round(key, model_jobs))
        self.rounds += 1
        if jobs:
            SCRAPE_ROUND_SECONDS.observe(self._clock() - started)
            SCRAPE_LAST_ROUND_SECONDS.set(self._clock() - started)

    async def _model_round(self, key: ModelKey, jobs: list[tuple[ScrapeTarget, float]]) -> None:
        """One model's share of a round, handed to the model as soon as its own pods answered: a slow pod of
        another model (up to the timeout) delays that model's round, not this one's."""
        async with asyncio.TaskGroup() as group:
            scrapes = [group.create_task(self._one(key, target, at)) for target, at in jobs]
        model = self._models.get(key)
        if model is None:
            return  # forgotten during the round
        wanted = model.targets.keys()
        model.rounds.append([result for scrape in scrapes
                             if (result := scrape.result()) is not None and result.target.uid in wanted])
        del model.rounds[:-KEPT_ROUNDS]
        self.delivered_at[key] = self._clock()

    async def _one(self, key: ModelKey, target: ScrapeTarget, at: float) -> ScrapeResult | None:
        await asyncio.sleep(max(0.0, at - self._clock()))
        model = self._models.get(key)
        if model is None or target.uid not in model.targets:
            return None  # the model or the pod went away since the round was planned
        await self._gate.acquire(key)
        try:
            (result,) = await scrape([target], timeout_s=self.timeout_s, concurrency=1, session=self.session,
                                     allow_non_loopback=self.allow_non_loopback, clock=self._clock,
                                     max_body_bytes=self.max_body_bytes)
        finally:
            self._gate.release(key)
        return result
