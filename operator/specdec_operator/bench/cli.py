"""`specdec-operator bench tuner`: the K tuner in closed loop against virtual-time simulator replicas.

For each profile it runs the real tuner (scraping Prometheus text at the production interval) and the
same fleet held at every static K in [min-k, max-k], and prints the tokens of each, so the tuner is
judged against the best K chosen with hindsight and against the common hand-picked K=5.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from specdec_operator.api.vocabulary import GFX_TARGETS, SPECULATIVE_METHODS
from specdec_operator.bench.closedloop import BenchOptions, TunerRun, run_static, run_tuner
from specdec_operator.bench.report import ProfileResult, aggregate_results, format_table
from specdec_runtime.simulator import profile as profile_format
from specdec_runtime.simulator.profile import Profile, ProfileError, load_profile

# Located through a module file: the package directory itself may be a namespace path in editable installs.
PROFILES_DIR = Path(profile_format.__file__).resolve().parents[1] / "profiles"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec-operator bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    tuner = sub.add_parser("tuner", help="closed-loop K tuner against static K, on simulator profiles")
    tuner.add_argument(
        "--profile",
        action="append",
        metavar="FILE[:DRAFTER[:GFX]]",
        help="simulator profile (repeatable); optionally the drafter method and gfx target of the pool. "
        "Default: every bench-*.yaml shipped in specdec_runtime/profiles",
    )
    tuner.add_argument("--min-k", type=int, help="lowest K (default 0)")
    tuner.add_argument("--max-k", type=int, help="highest K (default 10; 4 with --engine vllm)")
    tuner.add_argument("--initial-k", type=int, help="K the tuned pool starts at (default 5; 1 with --engine vllm)")
    tuner.add_argument("--drafter", default="eagle3", choices=SPECULATIVE_METHODS, help="default drafter method")
    tuner.add_argument("--gfx", default="gfx942", choices=GFX_TARGETS, help="default gfx target of the pool")
    tuner.add_argument("--duration", type=float, help="seconds to replay (default: one pass of the load)")
    tuner.add_argument("--seed", type=int, default=1)
    tuner.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    tuner.add_argument("--json", action="store_true", help="print JSON instead of the table")
    tuner.add_argument("--check", action="store_true", help="exit 1 when a benchmark target is missed")
    tuner.add_argument("--engine", choices=("simulator", "vllm"), default="simulator",
                       help="vllm: the real engine (vLLM's CPU build, tiny models; bench/engine.py)")
    canary = sub.add_parser(
        "canary", help="simulated canaries replayed through `canary replay`: false rollbacks, detection, calibration")
    canary.add_argument("--trials", type=int, default=100, help="canaries per (steps, class)")
    canary.add_argument("--interval", type=float, default=10.0, help="seconds between scrapes and verdicts")
    canary.add_argument("--pool", type=int, action="append", help="pool sizes drawn from (repeatable; default "
                        "1 2 3 4 6 8 12 16)")
    canary.add_argument("--rate", type=float, action="append", help="requests/s per pod drawn from (repeatable; "
                        "default 1 2 3 4)")
    canary.add_argument("--steps", action="append", choices=["default", "example"],
                        help="step sets (repeatable; default both)")
    canary.add_argument("--class", dest="classes", action="append", metavar="NAME",
                        help="only these classes (repeatable; default all)")
    canary.add_argument("--seed", type=int, default=1)
    canary.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    canary.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    hostile = sub.add_parser("hostile", help="one hostile model's pods beside healthy models, real scrape path")
    from specdec_operator.bench.hostile import add_arguments

    add_arguments(hostile)
    return parser


def _parse_profile_arg(text: str, drafter: str, gfx: str) -> tuple[Path, str, str]:
    path, _, rest = text.partition(":")
    method, _, target = rest.partition(":")
    method, target = method or drafter, target or gfx
    if method not in SPECULATIVE_METHODS:
        raise ProfileError(f"{text}: unknown drafter method {method!r}")
    if target not in GFX_TARGETS:
        raise ProfileError(f"{text}: unknown gfx target {target!r}")
    return Path(path), method, target


# The committed bench profiles and the pool each is meant for (their header comments say the same).
_COMMITTED_SETUPS = {"bench-ngram.yaml": ("ngram", "gfx942"), "bench-load-shift.yaml": ("eagle3", "gfx90a")}


def _default_profiles() -> list[str]:
    found = []
    for path in sorted(PROFILES_DIR.glob("bench-*.yaml")):
        method, gfx = _COMMITTED_SETUPS.get(path.name, ("", ""))
        found.append(f"{path}:{method}:{gfx}" if method else str(path))
    return found


def canary_main(args: argparse.Namespace) -> int:
    from specdec_operator.bench import canary

    pools = args.pool or list(canary.POOL_SIZES)
    rates = args.rate or list(canary.RATES)
    if args.trials < 1 or args.interval <= 0 or any(size < 1 or size > 64 for size in pools) or any(
            rate <= 0 for rate in rates):
        sys.stderr.write("error: need --trials >= 1, --interval > 0, 1 <= --pool <= 64 and --rate > 0\n")
        return 2
    known = {scenario.name: scenario for scenario in canary.SCENARIOS}
    unknown = [name for name in args.classes or () if name not in known]
    if unknown:
        sys.stderr.write(f"error: unknown --class {', '.join(unknown)}; known: {', '.join(known)}\n")
        return 2
    scenarios = [known[name] for name in args.classes] if args.classes else list(canary.SCENARIOS)
    started = time.perf_counter()
    result = canary.run_bench(args.trials, args.seed, args.interval, steps=args.steps or ("default", "example"),
                              scenarios=scenarios, pools=pools, rates=rates)
    summary = result.summary()
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        sys.stdout.write(canary.format_tables(result, args.interval, pools, rates))
        sys.stdout.write(f"replayed in {time.perf_counter() - started:.1f} s wall\n")
    return 1 if args.check and not summary["targets_met"] else 0


# --min-k, --max-k, --initial-k left out: the simulator sweeps 0..10 from K=5; the real engine starts one engine per
# static K (minutes each), so its own defaults (EngineBenchOptions: 0..4 from K=1) apply there.
_SIMULATOR_KS = {"min_k": 0, "max_k": 10, "initial_k": 5}
_ENGINE_KS = {"min_k": 0, "max_k": 4, "initial_k": 1}


def _default_ks(args: argparse.Namespace) -> None:
    defaults = _ENGINE_KS if args.engine == "vllm" else _SIMULATOR_KS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def bench_main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.benchmark == "canary":
        return canary_main(args)
    if args.benchmark == "hostile":
        from specdec_operator.bench import hostile as hostile_bench

        return hostile_bench.main(args)
    _default_ks(args)
    if not args.min_k <= args.initial_k <= args.max_k or args.max_k > 16 or args.min_k < 0:
        sys.stderr.write("error: need 0 <= --min-k <= --initial-k <= --max-k <= 16\n")
        return 2
    if args.engine == "vllm":
        from specdec_operator.bench.engine import engine_main

        return engine_main(args)
    base = BenchOptions(
        min_k=args.min_k,
        max_k=args.max_k,
        initial_k=args.initial_k,
        seed=args.seed,
        drafter=args.drafter,
        gfx_target=args.gfx,
        duration_s=args.duration,
    )
    try:
        setups = [_parse_profile_arg(text, args.drafter, args.gfx) for text in args.profile or _default_profiles()]
        loaded = [(path, load_profile(path), replace(base, drafter=m, gfx_target=g)) for path, m, g in setups]
    except ProfileError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    started = time.perf_counter()
    results = _run_all(loaded, args.jobs)
    summary = aggregate_results(results)
    if args.json:
        sys.stdout.write(json.dumps({"profiles": [r.to_json() for r in results], "summary": summary}, indent=2))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_table(results, summary))
        sys.stdout.write(f"replayed in {time.perf_counter() - started:.1f} s wall with {args.jobs} worker(s)\n")
    return 1 if args.check and not summary["targets_met"] else 0


def _run_all(loaded: list[tuple[Path, Profile, BenchOptions]], jobs: int) -> list[ProfileResult]:
    with _executor(jobs) as pool:
        tuned: list[Future[TunerRun]] = [pool.submit(run_tuner, profile, options) for _, profile, options in loaded]
        static: list[dict[int, Future[int]]] = [
            {k: pool.submit(run_static, profile, k, options) for k in range(options.min_k, options.max_k + 1)}
            for _, profile, options in loaded
        ]
        return [
            ProfileResult.build(path.name, options, profile, run.result(), {k: f.result() for k, f in by_k.items()})
            for (path, profile, options), run, by_k in zip(loaded, tuned, static, strict=True)
        ]


class _InlineExecutor(Executor):
    """Runs each job at submit time: for --jobs 1, tests and profilers, with no worker processes."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        future: Future[object] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def _executor(jobs: int) -> Executor:
    return ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else _InlineExecutor()
