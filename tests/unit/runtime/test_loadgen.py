"""The open-loop load generator's schedule (seeded, Poisson at the set rate, bursts, bounded lengths) and what it
counts as failed."""

from __future__ import annotations

import asyncio
import itertools

from aiohttp import web

from specdec_runtime.loadgen import ABORTED_ERROR, Burst, Lengths, LoadShape, run_load, schedule


def test_schedule_is_reproducible_from_its_seed_and_follows_the_rate() -> None:
    shape = LoadShape(rate=20.0, seed=7)
    first, again = list(schedule(shape, 100.0)), list(schedule(shape, 100.0))
    assert first == again
    assert list(schedule(LoadShape(rate=20.0, seed=8), 100.0)) != first
    # 2,000 expected arrivals: a Poisson count lies within 4 standard deviations (~180) of its mean.
    assert abs(len(first) - 2000) < 180
    assert all(a.at < b.at for a, b in itertools.pairwise(first))


def test_bursts_multiply_the_rate_while_they_last() -> None:
    shape = LoadShape(rate=10.0, burst=Burst(every_s=10.0, duration_s=2.0, factor=5.0), seed=3)
    arrivals = list(schedule(shape, 1000.0))
    in_burst = sum(1 for a in arrivals if a.at % 10.0 < 2.0)
    # 200 s of bursts at 50/s and 800 s at 10/s: 10,000 and 8,000 expected.
    assert abs(in_burst - 10_000) < 450
    assert abs((len(arrivals) - in_burst) - 8_000) < 400


def test_lengths_are_log_normal_around_their_median_within_bounds() -> None:
    shape = LoadShape(rate=50.0, prompt=Lengths(median=100, sigma=0.6, low=10, high=300), seed=1)
    prompts = sorted(a.prompt_tokens for a in schedule(shape, 100.0))
    assert 90 <= prompts[len(prompts) // 2] <= 110
    assert prompts[0] >= 10 and prompts[-1] <= 300


async def answering(chunks_by_request: list[list[bytes]]) -> tuple[web.AppRunner, str]:
    """A server answering 200 with each request's chunks in turn, flushed one by one (a split SSE stream)."""
    answers = iter(chunks_by_request)

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        for chunk in next(answers):
            await response.write(chunk)
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_a_200_whose_finish_reason_is_abort_counts_as_failed_even_split_across_chunks() -> None:
    """vLLM answers 200 with finish_reason "abort" for a request its engine dropped at shutdown (seen from the
    CPU build, docs/vllm-contract.md): the client got nothing, so the load reports it beside the errors."""
    finished = b'{"choices": [{"text": "a b c", "finish_reason": "length"}]}'
    aborted = b'{"choices": [{"text": "", "finish_reason": "abort"}]}'
    split = [b'data: {"choices": [{"text": "", "finish_r', b'eason":  "ab', b'ort"}]}\n\n', b"data: [DONE]\n\n"]
    runner, url = await answering([[finished], [aborted], split, [b'{"text": "abort"}']])
    try:
        shape = LoadShape(rate=1000.0, seed=1)
        report = await run_load(url, "m", shape, max_requests=4)
    finally:
        await runner.cleanup()
    assert report.statuses == {200: 4}
    assert report.failures == {(200, ABORTED_ERROR): 2}
