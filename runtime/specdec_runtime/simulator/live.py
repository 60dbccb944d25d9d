"""Requests served over HTTP that ride in the engine's batch, as vLLM serves them.

A live request waits for a batch slot (vLLM's max_num_seqs, shared with the profile's virtual sequences), then
takes one engine step per round: the step's length is the profile's step time at the current batch size and K
(the batch counts every live request in flight, so concurrent requests slow each other down), and the step emits
the accepted draft prefix plus one token. Its first step is the prefill that emits its first token. The engine
counts each step as it ends, as vLLM counts per iteration: tokens, the draft and its accepted tokens per position,
one inter-token latency (the prefill: prompt tokens and time to first token). When the request finishes it counts
its time per output token, its end-to-end latency, and success or finished_reason="error". Where the profile has
kinds of request, a request draws its kind once and accepts as that kind at every step.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable

from specdec_runtime.simulator.engine import JITTER, LiveOutcome, LiveStep
from specdec_runtime.simulator.profile import RequestKinds
from specdec_runtime.simulator.sampling import rate_at
from specdec_runtime.simulator.virtual import VirtualReplica


class LiveBatch:
    """The queue in front of the engine's batch for live requests, first come first served."""

    def __init__(self, replica: VirtualReplica, tick: Callable[[], None]) -> None:
        self.replica = replica
        self.tick = tick
        self._queue: deque[asyncio.Future[None]] = deque()

    async def admit(self, held_tokens: int) -> None:
        engine = self.replica.engine
        self.tick()
        if not self._queue and engine.live_slots() > 0:
            engine.live_admitted(held_tokens)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(waiter)
        engine.live_waiting += 1
        try:
            await waiter
        finally:
            engine.live_waiting -= 1
        self.tick()
        engine.live_admitted(held_tokens)

    def leave(self, held_tokens: int) -> None:
        engine = self.replica.engine
        self.tick()  # steps so far were taken with this request in the batch
        engine.live_left(held_tokens)
        while self._queue and engine.live_slots() > 0:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break


async def generate(
    batch: LiveBatch,
    rng: random.Random,
    *,
    prompt_tokens: int,
    max_tokens: int,
    errored: bool,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> AsyncGenerator[int, None]:
    """Yields the tokens each engine step emits for one request; counts each step, and the request when it ends.

    A request that the client abandons (the generator is closed early) leaves the batch with its steps counted
    but not as a finished request, as vLLM aborts it.
    """
    pause = sleep or asyncio.sleep
    replica = batch.replica
    held = prompt_tokens + max_tokens // 2
    arrived = clock()
    kind_draw: float | None = None  # where this request falls among a profile's kinds of request, drawn once
    await batch.admit(held)
    emitted = 0
    first_token_at = last_token_at = 0.0
    # Each step ends at the previous step's end plus the step's time, as a GPU runs its steps back to back: the
    # host waking this coroutine late shortens the next wait rather than stretching every step after it (a delay
    # longer than a whole step still counts, as the step's own). Sleeping each step's time added the host's
    # scheduling delay to every step: on a busy test machine (e2e lanes sharing two cores) a healthy pool's TPOT
    # p90 read 55 ms in one run and 80 ms in another, and across the minutes between two canary steps it moved
    # enough that the 100% step, judged against the stable's p90 from the step before, held until it timed out.
    step_ends_at = clock()
    finished = False
    try:
        while emitted < max_tokens:
            engine = replica.engine
            batch.tick()
            k = engine.speculation.k_for_batch(engine.batch) if engine.speculation else 0
            segment, _ = replica.profile.segment_at(replica.now)
            kinds = replica.profile.kinds_for(segment)
            if len(kinds) > 1 and kind_draw is None:
                kind_draw = rng.random()
            acceptance = _kind_of(kinds, kind_draw)
            step_s = replica.profile.step_seconds(engine.batch, k) * (1 + JITTER * (2 * rng.random() - 1))
            step_ends_at = max(step_ends_at, clock() - step_s) + step_s
            await pause(max(0.0, step_ends_at - clock()))
            now = clock()
            if emitted == 0:  # the prefill step drafts nothing and emits the first token
                first_token_at = now
                step = LiveStep(tokens=1, drafted=0, accepted=0, prefill_prompt_tokens=prompt_tokens,
                                first_token_seconds=now - arrived)
            else:
                accepted = 0
                while accepted < k and rng.random() < rate_at(acceptance, accepted):
                    accepted += 1
                step = LiveStep(tokens=min(max_tokens - emitted, accepted + 1), drafted=k, accepted=accepted,
                                gap_seconds=now - last_token_at)
            # The engine as of now: a restart during the step (a K change) counts it in the new one's counters.
            replica.engine.record_live_step(step)
            last_token_at = now
            emitted += step.tokens
            yield step.tokens
        finished = True
    finally:
        batch.leave(held)
        if finished:
            replica.engine.record_live_finish(LiveOutcome(
                decode_seconds=last_token_at - first_token_at, generated_tokens=emitted,
                latency_seconds=last_token_at - arrived, errored=errored,
            ))


def _kind_of(kinds: RequestKinds, draw: float | None) -> tuple[float, ...]:
    """The acceptance of the kind a request's draw falls in, by the kinds' shares of requests."""
    if draw is not None:
        for share, acceptance in kinds:
            draw -= share
            if draw < 0:
                return acceptance
    return kinds[-1][1]
