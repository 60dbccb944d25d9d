"""An open-loop load generator that sends OpenAI-style requests as vLLM serves them.

Open loop: arrivals follow a Poisson process at the configured rate whatever the server does, so a slow server
sees requests pile up (as production traffic does) instead of a closed-loop client slowing down with it.
Bursts multiply the rate for a while, periodically. Prompt and output lengths are drawn per request from
log-normal distributions (the shape of chat traffic: most requests short, a long tail) clipped to bounds.
Everything random comes from one seed, so a run's schedule of arrivals and sizes is reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiohttp import ClientError, ClientSession, ClientTimeout


@dataclass(frozen=True)
class Lengths:
    """Log-normal token counts with this median and spread (sigma of the log), clipped to [low, high]."""

    median: int
    sigma: float = 0.5
    low: int = 1
    high: int = 4096

    def draw(self, rng: random.Random) -> int:
        value = round(self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))) if self.sigma > 0 else self.median
        return max(self.low, min(self.high, value))


@dataclass(frozen=True)
class Burst:
    """Every `every_s`, the rate is multiplied by `factor` for `duration_s`."""

    every_s: float
    duration_s: float
    factor: float


@dataclass(frozen=True)
class LoadShape:
    rate: float  # requests per second outside bursts
    prompt: Lengths = Lengths(median=128)
    output: Lengths = Lengths(median=64, high=512)
    burst: Burst | None = None
    chat: bool = False
    stream: bool = True
    seed: int = 0

    def rate_at(self, t: float) -> float:
        if self.burst is not None and t % self.burst.every_s < self.burst.duration_s:
            return self.rate * self.burst.factor
        return self.rate


@dataclass(frozen=True)
class PlannedRequest:
    at: float  # seconds after the start
    prompt_tokens: int
    max_tokens: int


def schedule(shape: LoadShape, duration_s: float | None = None) -> Iterator[PlannedRequest]:
    """Arrival times and sizes. A non-homogeneous Poisson process by thinning (Lewis and Shedler): candidate
    arrivals at the peak rate, each kept with probability rate(t)/peak."""
    rng = random.Random(shape.seed)
    peak = shape.rate * (shape.burst.factor if shape.burst and shape.burst.factor > 1 else 1.0)
    if peak <= 0:
        return
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if duration_s is not None and t >= duration_s:
            return
        if rng.random() * peak > shape.rate_at(t):
            continue
        yield PlannedRequest(t, shape.prompt.draw(rng), shape.output.draw(rng))


# How much of a failed answer an outcome keeps: enough for a Gateway's or vLLM's error message.
ERROR_CHARS = 200
# vLLM answers 200 with finish_reason "abort" for a request its engine dropped (one that reached it as it began to
# shut down, or one it was serving when its drain ran out): an empty or cut answer. The status says OK; the client
# got nothing it asked for, so the load counts it as failed.
ABORTED = re.compile(rb'"finish_reason"\s*:\s*"abort"')
ABORTED_ERROR = 'finish_reason "abort": the engine dropped the request'
# Bytes of one chunk kept for the next, so the pattern is found across a chunk boundary.
ABORTED_OVERLAP = 64


@dataclass
class Outcome:
    status: int  # HTTP status; 0 when the connection failed
    latency_s: float
    first_token_s: float | None
    error: str = ""  # why it failed: the start of an error answer's body, the connection's error, or an abort

    @property
    def failed(self) -> bool:
        return self.status != 200 or bool(self.error)


@dataclass
class LoadReport:
    sent: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def statuses(self) -> Counter[int]:
        return Counter(outcome.status for outcome in self.outcomes)

    @property
    def failures(self) -> Counter[tuple[int, str]]:
        """Failed answers by status and error: what a test prints beside the statuses, to say which part failed."""
        return Counter((outcome.status, outcome.error) for outcome in self.outcomes if outcome.failed)


def _body(shape: LoadShape, model: str, planned: PlannedRequest) -> dict[str, object]:
    # One word per prompt token: the simulator (and roughly any tokenizer) counts words as tokens.
    prompt = " ".join(["tok"] * planned.prompt_tokens)
    body: dict[str, object] = {"model": model, "max_tokens": planned.max_tokens, "stream": shape.stream}
    if shape.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


async def _send(session: ClientSession, url: str, host: str | None, body: dict[str, object],
                report: LoadReport) -> None:
    started = time.monotonic()
    first: float | None = None
    error = ""
    headers = {"Host": host} if host else {}
    seen = b""  # the end of the answer so far, for ABORTED
    try:
        async with session.post(url, json=body, headers=headers) as response:
            async for chunk in response.content.iter_any():
                if first is None:
                    first = time.monotonic() - started
                if response.status >= 400 and len(error) < ERROR_CHARS:
                    error += chunk.decode("utf-8", errors="replace")
                elif response.status == 200 and not error:
                    seen = seen[-ABORTED_OVERLAP:] + chunk
                    error = ABORTED_ERROR if ABORTED.search(seen) else ""
            status = response.status
    except (ClientError, OSError) as err:
        status, error = 0, f"{type(err).__name__}: {err}"
    report.outcomes.append(Outcome(status, time.monotonic() - started, first, error[:ERROR_CHARS]))


async def run_load(
    base_url: str,
    model: str,
    shape: LoadShape,
    *,
    host: str | None = None,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    max_requests: int | None = None,
) -> LoadReport:
    """Send the schedule's requests at their times until duration_s, max_requests or stop; wait for answers.

    `host` is the Host header: a Gateway hostname, or a Service name such as `llama-stable.team-a.svc`.
    """
    path = "/v1/chat/completions" if shape.chat else "/v1/completions"
    url = base_url.rstrip("/") + path
    report = LoadReport()
    in_flight: set[asyncio.Task[None]] = set()
    started = time.monotonic()
    stop = stop or asyncio.Event()
    async with ClientSession(timeout=ClientTimeout(total=300)) as session:
        for planned in schedule(shape, duration_s):
            if max_requests is not None and report.sent >= max_requests:
                break
            delay = planned.at - (time.monotonic() - started)
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
            task = asyncio.create_task(_send(session, url, host, _body(shape, model, planned), report))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            report.sent += 1
        if in_flight:
            await asyncio.gather(*in_flight)
    return report
