"""The HTTP simulator: vLLM 0.33's endpoints over the same engine, stepped on the wall clock.

The profile's load schedule is the engine's virtual traffic (a profile may have none: concurrency 0).
Requests sent to /v1/completions and /v1/chat/completions join the same engine batch (see live.py): they
wait for a slot, take one engine step per chunk (accepted prefix + 1 tokens), make every step of the batch
longer as vLLM's would, and move the engine's counters when they finish, as well as http_requests_total,
as vLLM's instrumentator does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter

from specdec_runtime.simulator.completions import CompletionRequest, RequestError
from specdec_runtime.simulator.live import LiveBatch, generate
from specdec_runtime.simulator.profile import Profile, ProfileError, load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from specdec_runtime.simulator.vllm_cli import PROG, ServeOptions, parse_serve_args

logger = logging.getLogger(__name__)

VLLM_VERSION = "0.33.0"
TICK_S = 0.5
# vLLM's API server closes an idle HTTP connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s in 0.33), so a scraper
# every 15 s opens a new one each time; the simulator does the same, not aiohttp's 75 s.
HTTP_KEEP_ALIVE_S = 5.0
# vLLM's instrumentator leaves these out of http_requests_total.
UNCOUNTED_HANDLERS = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info", "/faults"})

INJECTED_ERROR = "injected fault (simulator profile faults.error_rate)"
# What vLLM's API server answers (HTTP 500) to a completion that reaches it after SIGTERM, while it drains: it keeps
# listening until its engine has stopped (measured on the CPU build, docs/vllm-contract.md).
SHUTTING_DOWN = "cannot schedule new futures after shutdown"
# aiohttp's shutdown_timeout once the drain is over: what is still running is cancelled (aiohttp reads 0 as no
# limit at all).
CANCEL_S = 0.001

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Simulator:
    """One simulated vLLM process: the replica on the wall clock plus the profile's faults."""

    def __init__(self, options: ServeOptions, profile: Profile, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        """`clock` and `sleep` are the wall clock and asyncio's sleep; tests pass a virtual pair (steps then
        take no time and their lengths are exact)."""
        self.options = options
        self.profile = profile
        self.clock = clock
        self.sleep = sleep
        seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**32)
        self.rng = random.Random(seed + 1)
        # The profile's error rate, which POST /faults may change while the simulator serves (an e2e test makes
        # a canary start failing exactly when its 100% step starts).
        self.error_rate = profile.faults.error_rate
        self.replica = VirtualReplica(
            profile, options.speculation(), model_name=options.served_model_name, seed=seed, start_time=clock()
        )
        self.http_requests = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ("method", "status", "handler"),
            registry=self.replica.registry,
        )
        self.live = LiveBatch(self.replica, self.tick)
        # SIGTERM: `drain` sets `draining`; completions in flight are counted so the drain knows when it is done.
        self.draining = asyncio.Event()
        self.serving = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def began(self) -> None:
        self.serving += 1
        self._idle.clear()

    def ended(self) -> None:
        self.serving -= 1
        if self.serving == 0:
            self._idle.set()

    async def drain(self) -> None:
        """vLLM's SIGTERM with --shutdown-timeout: keep listening, answer new completions 500, and let the ones in
        flight finish for up to that many seconds (0: none). The caller then closes the server, cutting the rest."""
        self.draining.set()
        timeout_s = self.options.shutdown_timeout
        if timeout_s > 0 and self.serving:
            logger.info("draining %d requests for up to %ds", self.serving, timeout_s)
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except TimeoutError:
                logger.warning("%d requests still running at the end of the drain: cut", self.serving)

    def tick(self) -> None:
        self.replica.advance_to(max(self.clock(), self.replica.now))

    @property
    def healthy(self) -> bool:
        if not self.replica.ready:
            return False
        unhealthy_after = self.profile.faults.unhealthy_after_s
        return unhealthy_after is None or self.replica.now < self.replica.ready_at + unhealthy_after

    def inject_error(self) -> bool:
        return self.rng.random() < self.error_rate


SIMULATOR = web.AppKey("simulator", Simulator)


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


@web.middleware
async def _serve_only_when_loaded(request: web.Request, handler: Handler) -> web.StreamResponse:
    simulator = request.app[SIMULATOR]
    simulator.tick()
    if not simulator.replica.ready:
        # vLLM answers no HTTP until its model is loaded; a 503 keeps probes and tests simple.
        return web.Response(status=503, text="model loading")
    response = await handler(request)
    route = request.match_info.route.resource
    path = route.canonical if route is not None else request.path
    if path not in UNCOUNTED_HANDLERS:
        status_group = f"{response.status // 100}xx"
        simulator.http_requests.labels(request.method, status_group, path).inc()
    return response


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[SIMULATOR].healthy else 503)


async def faults(request: web.Request) -> web.Response:
    """POST {"error_rate": r}: fail that share of the requests from now on (faults.error_rate at runtime)."""
    try:
        body = await request.json()
        rate = float(body["error_rate"])
    except (ValueError, KeyError, TypeError):
        return _error(400, "body must be {\"error_rate\": a number from 0 to 1}", "BadRequestError")
    if not 0.0 <= rate <= 1.0:
        return _error(400, f"error_rate must be from 0 to 1, got {rate}", "BadRequestError")
    request.app[SIMULATOR].error_rate = rate
    return web.json_response({"error_rate": rate})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VLLM_VERSION})


async def models(request: web.Request) -> web.Response:
    options = request.app[SIMULATOR].options
    card = {
        "id": options.served_model_name,
        "object": "model",
        "created": int(request.app[SIMULATOR].replica.ready_at),
        "owned_by": "vllm",
        "root": options.model,
        "parent": None,
        "max_model_len": options.max_model_len,
    }
    return web.json_response({"object": "list", "data": [card]})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SIMULATOR].replica.metrics_text()
    return web.Response(body=body.encode(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _completion_handler(chat: bool) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        simulator = request.app[SIMULATOR]
        try:
            completion = CompletionRequest.parse(await request.json(), chat=chat, options=simulator.options)
        except (ValueError, RequestError) as err:
            return _error(400, str(err), "BadRequestError")
        if completion.model != simulator.options.served_model_name:
            return _error(404, f"The model `{completion.model}` does not exist.", "NotFoundError")
        if simulator.draining.is_set():
            return _error(500, SHUTTING_DOWN, "InternalServerError")
        simulator.began()
        try:
            return await _complete(request, simulator, completion)
        finally:
            simulator.ended()

    return handle


async def _complete(request: web.Request, simulator: Simulator, completion: CompletionRequest) -> web.StreamResponse:
    """One completion on the engine: vLLM's answer, whole or streamed."""
    # A failing request runs like the others and ends with finished_reason="error" (vLLM's request-level
    # failure), which the client sees as a 500.
    errored = simulator.inject_error()
    steps = generate(simulator.live, simulator.rng, prompt_tokens=completion.prompt_tokens,
                     max_tokens=completion.max_tokens, errored=errored, clock=simulator.clock,
                     sleep=simulator.sleep)
    if not completion.stream:
        async for _ in steps:
            pass
        if errored:
            return _error(500, INJECTED_ERROR, "InternalServerError")
        return web.json_response(completion.response(simulator.clock()))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        async for tokens in steps:
            if not errored:
                await response.write(completion.sse_chunk(tokens, simulator.clock()))
    finally:
        await steps.aclose()
    if errored:
        error = {"error": {"message": INJECTED_ERROR, "type": "InternalServerError", "code": 500}}
        await response.write(f"data: {json.dumps(error)}\n\n".encode() + b"data: [DONE]\n\n")
    else:
        await response.write(completion.sse_end(simulator.clock()))
    await response.write_eof()
    return response


async def _ticker(app: web.Application) -> AsyncIterator[None]:
    """Steps the engine on the wall clock between requests, so gauges and latencies stay current."""
    simulator = app[SIMULATOR]

    async def tick_forever() -> None:
        while True:
            simulator.tick()
            await asyncio.sleep(TICK_S)

    task = asyncio.create_task(tick_forever())
    yield
    task.cancel()


def build_app(simulator: Simulator, *, background_tick: bool = True) -> web.Application:
    """The simulator's routes. Without background_tick the engine steps only when a request arrives.

    Every request catches the engine up to the wall clock first, so what a client sees is the same
    either way; the fleet driver hosts thousands of simulators in one process and skips the ticker
    so that idle pods cost no CPU between scrapes.
    """
    app = web.Application(middlewares=[_serve_only_when_loaded])
    app[SIMULATOR] = simulator
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_post("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_post("/faults", faults)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", _completion_handler(chat=False))
    app.router.add_post("/v1/chat/completions", _completion_handler(chat=True))
    if background_tick:
        app.cleanup_ctx.append(_ticker)
    return app


def main(argv: list[str]) -> int:
    """Run the simulator until SIGTERM/SIGINT. A bad profile or speculative config exits 2 with one line."""
    options = parse_serve_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        profile = load_profile(options.profile)
    except ProfileError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 2
    if options.ignored_args:
        logger.info("ignoring vLLM arguments the simulator does not model: %s", " ".join(options.ignored_args))
    simulator = Simulator(options, profile)
    logger.info(
        "serving %s (K=%d) on %s:%d; loaded at %.0f",
        options.served_model_name, simulator.replica.k, options.host, options.port, simulator.replica.ready_at,
    )
    asyncio.run(_serve_until_sigterm(simulator))
    return 0


async def _serve_until_sigterm(simulator: Simulator) -> None:
    """Serve; at SIGTERM (or SIGINT) drain as vLLM does (`Simulator.drain`), then close, cutting what is left."""
    runner = web.AppRunner(build_app(simulator), access_log=None, keepalive_timeout=HTTP_KEEP_ALIVE_S,
                           shutdown_timeout=CANCEL_S, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, simulator.options.host, simulator.options.port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    try:
        await stop.wait()
        await simulator.drain()
    finally:
        await runner.cleanup()
