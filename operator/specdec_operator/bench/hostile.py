"""`specdec-operator bench hostile`: one hostile model's pods beside healthy models, through the real scrape path.

Every pod is served on loopback (127.0.0.1, one port each) by an aiohttp server in a child process, so the
event loop measured is the operator side's alone (scrapes, parsing, windows, evaluations). The healthy
models' pods serve a vLLM-like /metrics whose counters grow with time; the hostile model's pods serve, one
behaviour each: counters near float max that restart every scrape, a TPOT bucket layout that changes at every
scrape, a body just under the scrape size cap (2 MiB) and one over it, and a slowloris that dribbles bytes
until the scrape timeout. The operator's real scrape scheduler (handlers/services/scrapes.py) scrapes every pod once a
round; each model's TunerState takes its round and evaluates, as the model loops do.

Rounds alternate between without and with the hostile model (so load drifting on the machine weighs on both
alike). Printed, without and with: the healthy models' round latency (from the round's start until
the model's own results are handed over), the healthy pods' scrape duration, the per-model evaluation time
(observe + evaluate), the event loop's lag, and the whole round's duration, which by design ends with the
slowest pod (the slowloris: the timeout). Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from aiohttp import web

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.handlers.services.scrapes import ScrapeScheduler
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.samples import ScrapeTarget
from specdec_operator.tuner.scraper import DEFAULT_MAX_BODY_BYTES, scrape_session

SPEC = Speculation(initial_k=3, min_k=0, max_k=8,
                   autotune=Autotune(interval_seconds=15, cooldown_seconds=60, min_samples=1000))
_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
_LABELS = 'engine="0",model_name="m"'


def vllm_body(t: float, *, scale: float = 1.0, created: float = 100.0, bound_factor: float = 1.0) -> str:
    """A K=3 vLLM /metrics after `t` seconds at 100 drafts/s (times `scale`)."""
    drafts = 100.0 * t * scale
    accepted = (0.8 * drafts, 0.6 * drafts, 0.45 * drafts)
    lines = [f"vllm:num_requests_running{{{_LABELS}}} 8.0"]
    for name, value in (("vllm:spec_decode_num_drafts", drafts), ("vllm:spec_decode_num_draft_tokens", 3 * drafts),
                        ("vllm:spec_decode_num_accepted_tokens", sum(accepted)),
                        ("vllm:generation_tokens", drafts + sum(accepted))):
        lines += [f"{name}_total{{{_LABELS}}} {value}", f"{name}_created{{{_LABELS}}} {created}"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{_LABELS},position="{i}"}} {value}'
              for i, value in enumerate(accepted)]
    for name, count, step_s in (("vllm:inter_token_latency_seconds", drafts, 0.03),
                                ("vllm:request_time_per_output_token_seconds", t, 0.015)):
        lines += [f'{name}_bucket{{{_LABELS},le="{bound * bound_factor}"}} {count if step_s <= bound else 0.0}'
                  for bound in _BUCKETS]
        lines += [f'{name}_bucket{{{_LABELS},le="+Inf"}} {count}', f"{name}_count{{{_LABELS}}} {count}",
                  f"{name}_sum{{{_LABELS}}} {count * step_s}"]
    return "\n".join(lines) + "\n"


def _padded(body: str, size: int) -> str:
    line = "# " + "x" * 1021 + "\n"
    return line * max(0, (size - len(body)) // len(line)) + body


@dataclass
class _Pod:
    answer: Callable[[web.Request, int, float], object]  # (request, scrape number, seconds since start)
    served: int = 0


@dataclass
class _Fleet:
    pods: dict[int, _Pod] = field(default_factory=dict)  # by port
    started: float = field(default_factory=time.monotonic)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        pod = self.pods[port]
        pod.served += 1
        answer = pod.answer(request, pod.served, time.monotonic() - self.started)
        if asyncio.iscoroutine(answer):
            answer = await answer
        assert isinstance(answer, web.StreamResponse)
        return answer


def _healthy(_: web.Request, __: int, t: float) -> web.Response:
    return _text(vllm_body(t))


async def _serve(behaviours: list[str], connection: Connection) -> None:
    """The child process: one loopback port per pod, answering as its behaviour says, until told to stop."""
    answers = {"healthy": _healthy, **_hostile_answers()}
    fleet = _Fleet()
    app = web.Application()
    app.router.add_get("/metrics", fleet.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    ports = []
    for behaviour in behaviours:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        fleet.pods[port] = _Pod(answers[behaviour])
        ports.append(port)
    connection.send(ports)
    await asyncio.get_running_loop().run_in_executor(None, connection.recv)
    await runner.cleanup()


def _serve_process(behaviours: list[str], connection: Connection) -> None:
    asyncio.run(_serve(behaviours, connection))


def _text(body: str) -> web.Response:
    return web.Response(text=body)


async def _slowloris(request: web.Request, *_: object) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    try:
        for _byte in range(10_000):
            await response.write(b"#")
            await asyncio.sleep(0.1)
    except (ConnectionError, RuntimeError):
        pass
    return response


def _hostile_answers() -> dict[str, Callable[[web.Request, int, float], object]]:
    return {
        "huge-counters": lambda _, n, t: _text(vllm_body(t, scale=1e305 if n % 2 else 1.0, created=100.0 + n)),
        "changing-layout": lambda _, n, t: _text(vllm_body(t, bound_factor=1 + n * 1e-6)),
        "large-body": lambda _, n, t: _text(_padded(vllm_body(t), DEFAULT_MAX_BODY_BYTES - 4096)),
        "over-cap-body": lambda _, n, t: _text(_padded(vllm_body(t), DEFAULT_MAX_BODY_BYTES + 65536)),
        "slowloris": _slowloris,
    }


@dataclass
class PhaseFigures:
    model_round_s: list[float] = field(default_factory=list)
    pod_scrape_s: list[float] = field(default_factory=list)
    evaluation_s: list[float] = field(default_factory=list)
    loop_lag_s: list[float] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)


async def _loop_lag(figures: Callable[[], PhaseFigures], stop: asyncio.Event, tick_s: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + tick_s
        await asyncio.sleep(tick_s)
        figures().loop_lag_s.append(max(0.0, loop.time() - due))


async def run(models: int, pods_per_model: int, rounds: int, interval_s: float,
              timeout_s: float) -> tuple[PhaseFigures, PhaseFigures]:
    """(without, with) the hostile model. Rounds alternate between the two, so a machine whose load drifts
    (other processes) weighs on both alike; the hostile pods are served throughout and scraped in every
    other round."""
    pods = [(f"model-{m}", f"model-{m}-{p}", "healthy") for m in range(models) for p in range(pods_per_model)]
    pods += [("hostile", f"hostile-{behaviour}", behaviour) for behaviour in _hostile_answers()]
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve_process, args=([behaviour for _, _, behaviour in pods], theirs), daemon=True)
    server.start()
    ports: list[int] = await asyncio.get_running_loop().run_in_executor(None, ours.recv)
    wanted: dict[tuple[str, str], list[ScrapeTarget]] = {}
    for (model, name, _), port in zip(pods, ports, strict=True):
        target = ScrapeTarget(pod=f"bench/{name}", uid=name, ip="127.0.0.1", port=port, pool="p", revision="r", k=3)
        wanted.setdefault(("bench", model), []).append(target)
    hostile_key = ("bench", "hostile")
    calm, attacked = PhaseFigures(), PhaseFigures()
    current = calm
    stop = asyncio.Event()
    lag = asyncio.create_task(_loop_lag(lambda: current, stop))
    pools = [PoolContext(name="p", gfx_target="gfx942", drafter_method="eagle3", effective_k=3,
                         replicas=pods_per_model)]
    states = {key: TunerState() for key in wanted}
    try:
        async with scrape_session(pool_size=32) as session:
            scheduler = ScrapeScheduler(session, interval_s=interval_s, timeout_s=timeout_s, concurrency=32,
                                        allow_non_loopback=False)
            for key, targets in wanted.items():
                if key != hostile_key:
                    scheduler.want(key, targets)
            loop = asyncio.get_running_loop()
            for number in range(2 * rounds):
                current = attacked if number % 2 else calm
                if number % 2:
                    scheduler.want(hostile_key, wanted[hostile_key])
                else:
                    scheduler.forget(hostile_key)
                started = loop.time()
                await scheduler.run_round()
                current.round_s.append(loop.time() - started)
                for key, state in states.items():
                    for results in scheduler.take(key):
                        before = time.perf_counter()
                        state.observe(pools, results, time.monotonic(), max_k=SPEC.max_k)
                        state.evaluate(time.monotonic(), pools, SPEC)
                        if key != hostile_key:
                            current.evaluation_s.append(time.perf_counter() - before)
                            current.pod_scrape_s += [result.duration_s for result in results]
                    if key != hostile_key and key in scheduler.delivered_at:
                        current.model_round_s.append(scheduler.delivered_at[key] - started)
                await asyncio.sleep(max(0.0, started + interval_s - loop.time()))
    finally:
        stop.set()
        await lag
        ours.send("stop")
        await asyncio.get_running_loop().run_in_executor(None, server.join, 10)
    return calm, attacked


def _p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def format_table(calm: PhaseFigures, attacked: PhaseFigures) -> str:
    rows = [
        ("healthy model's round (s)", calm.model_round_s, attacked.model_round_s),
        ("healthy pod scrape (ms)", [v * 1000 for v in calm.pod_scrape_s], [v * 1000 for v in attacked.pod_scrape_s]),
        ("per-model evaluation (ms)", [v * 1000 for v in calm.evaluation_s],
         [v * 1000 for v in attacked.evaluation_s]),
        ("event loop lag (ms)", [v * 1000 for v in calm.loop_lag_s], [v * 1000 for v in attacked.loop_lag_s]),
        ("whole round (s)", calm.round_s, attacked.round_s),
    ]
    out = [f"{'figure':<28}{'p50 without':>13}{'p50 with':>11}{'p99 without':>13}{'p99 with':>11}{'p99 change':>12}"]
    for name, without, with_ in rows:
        p99_without, p99_with = _p(without, 0.99), _p(with_, 0.99)
        change = (p99_with / p99_without - 1) if p99_without > 0 else float("nan")
        out.append(f"{name:<28}{_p(without, 0.5):>13.3f}{_p(with_, 0.5):>11.3f}{p99_without:>13.3f}"
                   f"{p99_with:>11.3f}{change:>+12.1%}")
    return "\n".join(out) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", type=int, default=50, help="healthy models (default 50)")
    parser.add_argument("--pods", type=int, default=2, help="pods per healthy model (default 2)")
    parser.add_argument("--rounds", type=int, default=8, help="scrape rounds per phase (default 8)")
    parser.add_argument("--interval", type=float, default=3.0, help="scrape interval, seconds (default 3)")
    parser.add_argument("--timeout", type=float, default=1.5, help="scrape timeout, seconds (default 1.5)")


def main(args: argparse.Namespace) -> int:
    calm, attacked = asyncio.run(run(args.models, args.pods, args.rounds, args.interval, args.timeout))
    sys.stdout.write(f"{args.models} healthy models x {args.pods} pods, {args.rounds} rounds of {args.interval:g}s "
                     f"each without and with (alternating; timeout {args.timeout:g}s) one hostile model of 5 pods "
                     f"({', '.join(_hostile_answers())})\n")
    sys.stdout.write(format_table(calm, attacked))
    return 0
