"""Requests served over HTTP that ride in the engine's batch, as vLLM serves them.

A live request waits for a batch slot (vLLM's max_num_seqs, shared with the profile's virtual sequences), then
takes one engine step per round: the step's length is the profile's step time at the current batch size and K
(the batch counts every live request in flight, so concurrent requests slow each other down), and the step emits
the accepted draft prefix plus one token. Its first step is the prefill that emits its first token. When it
leaves the batch the engine counts it as vLLM does: tokens, drafts and accepted tokens per position, one
inter-token latency per step, its time per output token, and success or finished_reason="error".
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable

from specdec_runtime.simulator.engine import JITTER, LiveOutcome
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
    """Yields the tokens each engine step emits for one request; counts the request when it ends.

    A request that the client abandons (the generator is closed early) leaves the batch uncounted, as vLLM
    aborts it.
    """
    pause = sleep or asyncio.sleep
    replica = batch.replica
    held = prompt_tokens + max_tokens // 2
    arrived = clock()
    await batch.admit(held)
    emitted = drafts = draft_tokens = 0
    per_position: list[int] = []
    gaps: list[float] = []
    first_token_at = last_token_at = 0.0
    finished = False
    try:
        while emitted < max_tokens:
            engine = replica.engine
            batch.tick()
            k = engine.speculation.k_for_batch(engine.batch) if engine.speculation else 0
            segment, _ = replica.profile.segment_at(replica.now)
            acceptance = replica.profile.acceptance_for(segment)
            step_s = replica.profile.step_seconds(engine.batch, k) * (1 + JITTER * (2 * rng.random() - 1))
            await pause(step_s)
            accepted = 0
            if emitted > 0 and k > 0:  # the prefill step drafts nothing
                while accepted < k and rng.random() < rate_at(acceptance, accepted):
                    accepted += 1
                drafts += 1
                draft_tokens += k
                per_position.extend([0] * (k - len(per_position)))
                for position in range(accepted):
                    per_position[position] += 1
            tokens = 1 if emitted == 0 else min(max_tokens - emitted, accepted + 1)
            now = clock()
            if emitted == 0:
                first_token_at = now
            else:
                gaps.append(now - last_token_at)
            last_token_at = now
            emitted += tokens
            yield tokens
        finished = True
    finally:
        batch.leave(held)
        if finished:
            replica.engine.record_live(LiveOutcome(
                prompt_tokens=prompt_tokens, generated_tokens=emitted, drafts=drafts, draft_tokens=draft_tokens,
                accepted_per_position=tuple(per_position), inter_token_gaps=tuple(gaps),
                decode_seconds=last_token_at - first_token_at, first_token_seconds=first_token_at - arrived,
                latency_seconds=last_token_at - arrived, errored=errored,
            ))
