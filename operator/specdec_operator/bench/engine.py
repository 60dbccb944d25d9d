"""`specdec-operator bench tuner --engine vllm`: the K tuner against the real engine (vLLM's CPU build).

At a fixed offered load (closed loop: `concurrency` clients, each sending the next request when its last one
finished), it measures the engine's goodput (generated tokens/s from vLLM's own `generation_tokens_total`) at each
static K of a sweep, one engine start per K; then it starts the engine at a poor K and lets the production tuner
(`TunerState`, fed the engine's /metrics through the production parser) decide, restarting the engine at each K it
picks, until it holds; and measures the goodput at the K it converged to. It prints the ratio of that goodput to the
best static K measured in the same run, and the restarts the tuner took. A benchmark that prints figures.

The engine is our launcher exec'ing `vllm serve` on 127.0.0.1 (as the fleet driver runs a pod), serving the tiny
checkpoints of `hack/tiny-models` (target plus a drafter of calibrated acceptance) from the engine venv of
`hack/vllm-cpu-env`. One engine at a time (~4 GB).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.samples import MetricsParseError, ScrapeResult, ScrapeTarget, parse_metrics
from specdec_runtime import engine_env
from specdec_runtime.config import RuntimeConfig, SpeculativeSettings
from specdec_runtime.fleet_engine import ENGINE_ENV

SERVED = "tiny"
POOL = "engine-bench"
TARGET = "tiny-llama/target"


@dataclass(frozen=True)
class EngineBenchOptions:
    static_ks: tuple[int, ...] = (0, 1, 2, 3, 4)
    initial_k: int = 1
    min_k: int = 0
    max_k: int = 4
    drafter: str = "good"  # a tiny drafter: same, good, poor
    concurrency: int = 4
    max_tokens: int = 48
    warmup_s: float = 10.0
    measure_s: float = 45.0
    scrape_interval_s: float = 2.0
    tuner_interval_s: int = 10
    tuner_min_samples: int = 300
    tuner_budget_s: float = 900.0  # wall time for the tuner's phase, restarts included
    ready_timeout_s: float = 900.0
    work_dir: Path = field(default_factory=lambda: Path("/tmp/specdec-engine-bench"))


@dataclass(frozen=True)
class Measured:
    k: int
    goodput: float  # generated tokens/s
    start_s: float  # engine start to healthy


@dataclass
class EngineBenchResult:
    static: list[Measured]
    tuner_path: list[int]  # K after each restart, starting K first
    tuner_restarts: int
    tuner_final: Measured | None
    decisions: list[str]

    @property
    def best_static(self) -> Measured:
        return max(self.static, key=lambda m: m.goodput)

    @property
    def ratio(self) -> float | None:
        if self.tuner_final is None or self.best_static.goodput <= 0:
            return None
        return self.tuner_final.goodput / self.best_static.goodput

    def to_json(self) -> dict[str, Any]:
        return {"static": [m.__dict__ for m in self.static], "best_static_k": self.best_static.k,
                "tuner_path": self.tuner_path, "tuner_restarts": self.tuner_restarts,
                "tuner_final": self.tuner_final.__dict__ if self.tuner_final else None, "ratio": self.ratio,
                "decisions": self.decisions}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Engine:
    """One engine process at a K: our launcher from a runtime.json, exec'ing the CPU build's `vllm serve`."""

    def __init__(self, k: int, options: EngineBenchOptions) -> None:
        tiny, venv = engine_env.tiny_models_dir(), engine_env.vllm_cpu_venv()
        self.k, self.port = k, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        work = options.work_dir / f"k{k}-{self.port}"
        work.mkdir(parents=True, exist_ok=True)
        # The same model paths for every engine of the run: vLLM's torch.compile cache then serves later starts.
        models = options.work_dir / "models" / "tiny-llama"
        models.mkdir(parents=True, exist_ok=True)
        for name, checkpoint in (("target", "target"), (f"drafter-{options.drafter}", f"drafter-{options.drafter}")):
            if not (models / name).exists():
                (models / name).symlink_to(tiny / checkpoint)
        speculative = None if k == 0 else SpeculativeSettings(
            method="draft_model", model=f"tiny-llama/drafter-{options.drafter}", num_speculative_tokens=k)
        config = RuntimeConfig(model=TARGET, served_model_name=SERVED, host="127.0.0.1", port=self.port,
                               max_model_len=2048, speculative=speculative)
        (work / "runtime.json").write_text(config.to_json())
        env = {**os.environ, **ENGINE_ENV, "SPECDEC_MODELS_DIR": str(options.work_dir / "models"),
               "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.log = work / "engine.log"
        self.started = time.monotonic()
        launcher = str(Path(sys.executable).parent / "specdec-runtime")
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [launcher, "launch", "--config", str(work / "runtime.json")],
                stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)

    def wait_healthy(self, timeout_s: float) -> float:
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"engine at K={self.k} exited {self.process.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return time.monotonic() - self.started
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - self.started > timeout_s:
                raise RuntimeError(f"engine at K={self.k} not healthy in {timeout_s:.0f}s (log {self.log})")
            time.sleep(1)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def generated(self) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in self.metrics().splitlines()
                   if line.startswith("vllm:generation_tokens_total"))

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class ClosedLoop:
    """`concurrency` clients on a thread of their own, each sending its next request when the last finished."""

    def __init__(self, url: str, options: EngineBenchOptions) -> None:
        import threading

        self.url, self.options = url, options
        self._stop = threading.Event()
        self.errors = 0
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(options.concurrency)]
        for thread in self._threads:
            thread.start()

    def _client(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            body = json.dumps({"model": SERVED, "prompt": f"the user {index} asks {n} and the model drafts a token",
                               "max_tokens": self.options.max_tokens}).encode()
            request = urllib.request.Request(f"{self.url}/v1/completions", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()
            except (urllib.error.URLError, OSError):
                self.errors += 1
                self._stop.wait(1)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(330)


def measure(engine: Engine, options: EngineBenchOptions, start_s: float) -> Measured:
    load = ClosedLoop(engine.url, options)
    try:
        time.sleep(options.warmup_s)
        before, t0 = engine.generated(), time.monotonic()
        time.sleep(options.measure_s)
        after, t1 = engine.generated(), time.monotonic()
    finally:
        load.stop()
    return Measured(engine.k, (after - before) / (t1 - t0), start_s)


def _context(k: int, rolling: bool, drafter: str) -> PoolContext:
    return PoolContext(name=POOL, gfx_target="gfx942", drafter_method="draft_model",
                       drafter_model=f"tiny-llama/drafter-{drafter}", effective_k=k, replicas=1, rolling=rolling)


def _scrape(engine: Engine, restarts: int, now: float) -> list[ScrapeResult]:
    target = ScrapeTarget(pod="bench/engine-0", uid=f"engine-{restarts}", ip="127.0.0.1", port=engine.port,
                          pool=POOL, revision=f"k{engine.k}", k=engine.k, restart_count=restarts)
    try:
        sample = parse_metrics(engine.metrics())
    except MetricsParseError as err:
        return [ScrapeResult(target, now, "parse_error", error=str(err))]
    except (urllib.error.URLError, OSError) as err:
        return [ScrapeResult(target, now, "refused", error=str(err))]
    return [ScrapeResult(target, now, "ok" if sample.complete else "incomplete", sample)]


def run_tuned(options: EngineBenchOptions, log: Any) -> tuple[list[int], int, Measured | None, list[str]]:
    """The production tuner from a poor K: each change restarts the engine at the new K (a one-replica rolling
    update); stops once the tuner holds after its last change (two evaluations with enough drafts and no change),
    or at the time budget. Returns the K path, restarts, goodput at the final K, and the decisions' reasons."""
    speculation = Speculation(initial_k=options.initial_k, min_k=options.min_k, max_k=options.max_k,
                              autotune=Autotune(interval_seconds=options.tuner_interval_s,
                                                min_samples=options.tuner_min_samples, cooldown_seconds=0))
    state = TunerState()
    k, restarts, path, reasons = options.initial_k, 0, [options.initial_k], []
    deadline = time.monotonic() + options.tuner_budget_s
    engine = Engine(k, options)
    try:
        start_s = engine.wait_healthy(options.ready_timeout_s)
        load = ClosedLoop(engine.url, options)
        holds = 0
        next_evaluation = time.monotonic() + options.tuner_interval_s
        while time.monotonic() < deadline and holds < 2:
            now = time.monotonic()
            state.observe([_context(k, False, options.drafter)], _scrape(engine, restarts, now), now)
            if now < next_evaluation:
                time.sleep(options.scrape_interval_s)
                continue
            next_evaluation = now + options.tuner_interval_s
            report = state.evaluate(now, [_context(k, False, options.drafter)], speculation)
            decision = report.decision
            if decision is None or decision.to_k == decision.from_k:
                # A hold counts once the window had the drafts the policy needs to weigh a change.
                stats = next((s for s in report.stats if s.pool == POOL), None)
                if k == 0 or (stats is not None and stats.drafts >= options.tuner_min_samples):
                    holds += 1
                continue
            holds = 0
            reasons.append(f"{decision.action} K {decision.from_k}->{decision.to_k}: {decision.reason}")
            log(f"tuner: {reasons[-1]}")
            state.commit(decision, now)
            load.stop()
            engine.stop()
            k, restarts = decision.to_k, restarts + 1
            path.append(k)
            engine = Engine(k, options)
            start_s = engine.wait_healthy(options.ready_timeout_s)
            state.observe([_context(k, False, options.drafter)], [], time.monotonic())
            load = ClosedLoop(engine.url, options)
            next_evaluation = time.monotonic() + options.tuner_interval_s
        load.stop()
        final = measure(engine, options, start_s)
    finally:
        engine.stop()
    return path, restarts, final, reasons


def run_engine_bench(options: EngineBenchOptions, log: Any = print) -> EngineBenchResult:
    problems = engine_env.missing()
    if problems:
        raise RuntimeError("; ".join(problems))
    static = []
    for k in options.static_ks:
        engine = Engine(k, options)
        try:
            start_s = engine.wait_healthy(options.ready_timeout_s)
            static.append(measure(engine, options, start_s))
        finally:
            engine.stop()
        log(f"static K={k}: {static[-1].goodput:.1f} tokens/s (engine healthy after {static[-1].start_s:.0f} s)")
    path, restarts, final, reasons = run_tuned(options, log)
    return EngineBenchResult(static, path, restarts, final, reasons)


def format_result(result: EngineBenchResult, options: EngineBenchOptions) -> str:
    lines = [f"bench tuner --engine vllm: vLLM CPU {engine_env.VLLM_CPU_VERSION}, tiny target + drafter-"
             f"{options.drafter} (draft_model), closed loop {options.concurrency} clients x {options.max_tokens} "
             f"tokens, {options.measure_s:.0f} s per measurement",
             f"{'K':>3} {'goodput tok/s':>14} {'engine start s':>15}"]
    lines += [f"{m.k:>3} {m.goodput:>14.1f} {m.start_s:>15.0f}" for m in result.static]
    best = result.best_static
    final = result.tuner_final
    lines.append(f"best static K={best.k}: {best.goodput:.1f} tokens/s")
    if final is not None:
        lines.append(f"tuner from K={options.initial_k}: path {' -> '.join(map(str, result.tuner_path))}, "
                     f"{result.tuner_restarts} restart(s), converged K={final.k}: {final.goodput:.1f} tokens/s")
        lines.append(f"ratio to the best static K: {result.ratio:.3f}")
    return "\n".join(lines) + "\n"


def engine_main(args: Any) -> int:
    """`bench tuner --engine vllm` with the tuner's --min-k/--max-k/--initial-k/--json."""
    if args.max_k - args.min_k > 6:
        sys.stderr.write("error: --engine vllm starts one engine per static K (minutes each): "
                          "use a range of at most 7 Ks, e.g. --min-k 0 --max-k 4\n")
        return 2
    options = EngineBenchOptions(static_ks=tuple(range(args.min_k, args.max_k + 1)), initial_k=args.initial_k,
                                 min_k=args.min_k, max_k=args.max_k)

    def log(line: str) -> None:
        sys.stderr.write(line + "\n")

    result = run_engine_bench(options, log)
    if args.json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(format_result(result, options))
    return 0
