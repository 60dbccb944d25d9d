"""`specdec-operator bench tuner --engine vllm`: the K tuner against the real engine (vLLM's CPU build).

At a fixed offered load (closed loop: `concurrency` clients, each sending the next request when its last one
finished), it measures the engine's goodput (generated tokens/s from vLLM's own `generation_tokens_total`) at each
static K of a sweep, on a fresh engine per K; the production tuner (`TunerState`, fed the engine's /metrics through
the production parser) starts at a poor K and decides, the engine restarted at each K it picks, until it holds. The
tuner's path is run first and each K it visits is measured when its engine starts, so the sweep costs no extra start
for those Ks. It prints the goodput at the K the tuner converged to over the best static K measured in the same run,
and the restarts the tuner took. A benchmark that prints figures.

One window per K says more about the machine than about K: on a 2-core machine one K's goodput moved up to 35%
between runs, and the best static K was 3, 4 and 0 in three idle runs. So the run ends with a confirmation: the
converged K and the best other static Ks run as engines side by side, and rounds of windows are taken in turn
(the order rotating each round), the load on one engine at a time. A slow drift of the machine falls on every K
alike, and the confirmed ratio (medians over the rounds) compares like with like.

The engine is our launcher exec'ing `vllm serve` on 127.0.0.1 (as the fleet driver runs a pod), serving the tiny
checkpoints of `hack/tiny-models` (target plus a drafter of calibrated acceptance) from the engine venv of
`hack/vllm-cpu-env`. One engine at a time (~4 GB).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
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
    confirm_ks: int = 3  # engines side by side in the confirmation: the converged K and the best others (~4 GB each)
    confirm_rounds: int = 4
    confirm_warmup_s: float = 5.0
    confirm_measure_s: float = 20.0
    ready_timeout_s: float = 900.0
    work_dir: Path = field(default_factory=lambda: Path("/tmp/specdec-engine-bench"))


@dataclass(frozen=True)
class Measured:
    k: int
    goodput: float  # generated tokens/s
    start_s: float  # engine start to healthy


@dataclass(frozen=True)
class Confirmed:
    """One K's goodput in each round of the confirmation (tokens/s), windows taken in turn with the other Ks'."""

    k: int
    windows: tuple[float, ...]

    @property
    def goodput(self) -> float:
        return statistics.median(self.windows)


@dataclass
class EngineBenchResult:
    static: list[Measured]
    tuner_path: list[int]  # K after each restart, starting K first
    tuner_restarts: int
    tuner_final: Measured | None
    decisions: list[str]
    confirmed: list[Confirmed] = field(default_factory=list)

    @property
    def best_static(self) -> Measured:
        return max(self.static, key=lambda m: m.goodput)

    @property
    def ratio(self) -> float | None:
        if self.tuner_final is None or self.best_static.goodput <= 0:
            return None
        return self.tuner_final.goodput / self.best_static.goodput

    @property
    def confirmed_ratio(self) -> float | None:
        """The converged K's median over the best confirmed K's median: 1.0 when the tuner's K is the best."""
        final = next((c for c in self.confirmed if self.tuner_final and c.k == self.tuner_final.k), None)
        best = max(self.confirmed, key=lambda c: c.goodput, default=None)
        if final is None or best is None or best.goodput <= 0:
            return None
        return final.goodput / best.goodput

    def to_json(self) -> dict[str, Any]:
        return {"static": [m.__dict__ for m in self.static], "best_static_k": self.best_static.k,
                "tuner_path": self.tuner_path, "tuner_restarts": self.tuner_restarts,
                "tuner_final": self.tuner_final.__dict__ if self.tuner_final else None, "ratio": self.ratio,
                "decisions": self.decisions,
                "confirmed": [{"k": c.k, "windows": list(c.windows), "goodput": c.goodput} for c in self.confirmed],
                "confirmed_ratio": self.confirmed_ratio}


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


def goodput_over(engine: Engine, options: EngineBenchOptions, warmup_s: float, measure_s: float) -> float:
    """Generated tokens/s over `measure_s` under the closed loop, after `warmup_s` of it."""
    load = ClosedLoop(engine.url, options)
    try:
        time.sleep(warmup_s)
        before, t0 = engine.generated(), time.monotonic()
        time.sleep(measure_s)
        after, t1 = engine.generated(), time.monotonic()
    finally:
        load.stop()
    return (after - before) / (t1 - t0)


def measure(engine: Engine, options: EngineBenchOptions, start_s: float) -> Measured:
    return Measured(engine.k, goodput_over(engine, options, options.warmup_s, options.measure_s), start_s)


def confirmation_ks(static: list[Measured], converged: int, count: int) -> list[int]:
    """The converged K and the best other static Ks by their single windows, `count` in all."""
    others = [m.k for m in sorted(static, key=lambda m: m.goodput, reverse=True) if m.k != converged]
    return [converged, *others[:max(count - 1, 0)]]


def confirm(ks: list[int], options: EngineBenchOptions, log: Any) -> list[Confirmed]:
    """Engines at `ks` side by side; `confirm_rounds` rounds of one window each, the order rotating by round."""
    engines = [Engine(k, options) for k in ks]
    try:
        for engine in engines:
            engine.wait_healthy(options.ready_timeout_s)
        windows: dict[int, list[float]] = {k: [] for k in ks}
        for round_index in range(options.confirm_rounds):
            shift = round_index % len(engines)
            for engine in engines[shift:] + engines[:shift]:
                windows[engine.k].append(
                    goodput_over(engine, options, options.confirm_warmup_s, options.confirm_measure_s))
            log("confirmation round " + str(round_index + 1) + ": " +
                ", ".join(f"K={k} {values[-1]:.1f}" for k, values in windows.items()))
        return [Confirmed(k, tuple(windows[k])) for k in ks]
    finally:
        for engine in engines:
            engine.stop()


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


class TunerDriver:
    """The production tuner (`TunerState`), fed the live engine's /metrics through the production parser."""

    def __init__(self, options: EngineBenchOptions) -> None:
        self.options = options
        self.speculation = Speculation(
            initial_k=options.initial_k, min_k=options.min_k, max_k=options.max_k,
            autotune=Autotune(interval_seconds=options.tuner_interval_s, min_samples=options.tuner_min_samples,
                              cooldown_seconds=0))
        self.state = TunerState()
        self.restarts = 0
        self.reasons: list[str] = []
        self.deadline = time.monotonic() + options.tuner_budget_s

    def follow(self, engine: Engine, log: Any) -> int | None:
        """Under the closed-loop load, until the tuner changes K (returns the new K) or holds twice on a window with
        the drafts it needs (or the time budget ends): returns None, converged."""
        options, k = self.options, engine.k
        context = PoolContext(name=POOL, gfx_target="gfx942", drafter_method="draft_model",
                              drafter_model=f"tiny-llama/drafter-{options.drafter}", effective_k=k)
        load = ClosedLoop(engine.url, options)
        try:
            holds = 0
            next_evaluation = time.monotonic() + options.tuner_interval_s
            while time.monotonic() < self.deadline:
                now = time.monotonic()
                self.state.observe([context], _scrape(engine, self.restarts, now), now)
                if now < next_evaluation:
                    time.sleep(options.scrape_interval_s)
                    continue
                next_evaluation = now + options.tuner_interval_s
                report = self.state.evaluate(now, [context], self.speculation)
                decision = report.decision
                if decision is not None and decision.to_k != decision.from_k:
                    self.reasons.append(f"{decision.action} K {decision.from_k}->{decision.to_k}: {decision.reason}")
                    log(f"tuner: {self.reasons[-1]}")
                    self.state.commit(decision, now)
                    self.restarts += 1
                    return decision.to_k
                # A hold counts once the window had the drafts the policy needs to weigh a change.
                stats = next((s for s in report.stats if s.pool == POOL), None)
                if k == 0 or (stats is not None and stats.drafts >= options.tuner_min_samples):
                    holds += 1
                    if holds >= 2:
                        return None
            return None
        finally:
            load.stop()


def run_engine_bench(options: EngineBenchOptions, log: Any = print) -> EngineBenchResult:
    """The tuner's path first (from the poor initial K, an engine start per K it picks), then the static Ks it did
    not visit. Each K's goodput is measured once, on a fresh engine at that K before the tuner watches it, under the
    same load: the static sweep and the tuner's converged K are measured alike, in the same run."""
    problems = engine_env.missing()
    if problems:
        raise RuntimeError("; ".join(problems))
    measured: dict[int, Measured] = {}

    def at(k: int, tuner: TunerDriver | None) -> int | None:
        engine = Engine(k, options)
        try:
            start_s = engine.wait_healthy(options.ready_timeout_s)
            if k not in measured:
                measured[k] = measure(engine, options, start_s)
                log(f"K={k}: {measured[k].goodput:.1f} tokens/s (engine healthy after {start_s:.0f} s)")
            return tuner.follow(engine, log) if tuner is not None else None
        finally:
            engine.stop()

    tuner = TunerDriver(options)
    path = [options.initial_k]
    next_k = at(options.initial_k, tuner)
    while next_k is not None:
        path.append(next_k)
        next_k = at(next_k, tuner)
    for k in options.static_ks:
        if k not in measured:
            at(k, None)
    static = [measured[k] for k in sorted(measured)]
    ks = confirmation_ks(static, path[-1], options.confirm_ks)
    confirmed = confirm(ks, options, log) if len(ks) > 1 and options.confirm_rounds > 0 else []
    return EngineBenchResult(static, path, tuner.restarts, measured[path[-1]], tuner.reasons, confirmed)


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
        lines.append(f"ratio to the best static K: {result.ratio:.3f} (one window each)")
    if result.confirmed:
        lines.append(f"confirmation: {len(result.confirmed)} engines side by side, {options.confirm_rounds} rounds of "
                     f"{options.confirm_measure_s:.0f} s windows in turn (median, min-max)")
        lines += [f"{c.k:>3} {c.goodput:>14.1f}   {min(c.windows):.1f}-{max(c.windows):.1f}" for c in result.confirmed]
        if result.confirmed_ratio is not None:
            lines.append(f"confirmed ratio to the best static K: {result.confirmed_ratio:.3f}")
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
