"""`specdec-runtime`: launch (the image entrypoint), render, simulate, fleet-driver, gateway and loadgen."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from specdec_runtime.launcher import (
    DEFAULT_CONFIG_PATH,
    MODELS_DIR_ENV,
    LaunchError,
    build_command,
    launch,
    load_runtime_config,
    models_dir_from_env,
)
from specdec_runtime.routing import STANDIN_GATEWAY_CLASS
from specdec_runtime.simulator.profile import DEFAULT_PROFILE, PACKAGED_PROFILES_DIR

if TYPE_CHECKING:
    from specdec_runtime.fleet_engine import EngineSettings

PROG = "specdec-runtime"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("launch", "exec the engine for the rendered runtime config (the image entrypoint)"),
        ("render", "print the command `launch` would exec"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="rendered runtime.json")
        sub.add_argument("--profiles-dir", type=Path, default=PACKAGED_PROFILES_DIR)
        sub.add_argument("--models-dir", type=Path, default=None,
                         help=f"serve models found here by name (DIR/<model>) locally; default ${MODELS_DIR_ENV}")
    commands.add_parser(
        "simulate", help="run the vLLM simulator: serve MODEL ... --profile FILE", add_help=False
    ).add_argument("args", nargs=argparse.REMAINDER)
    commands.add_parser(
        "tiny-model", help="write a tiny random-weight Llama and drafters of chosen acceptance (tiny_model.py)",
        add_help=False,
    ).add_argument("args", nargs=argparse.REMAINDER)
    driver = commands.add_parser("fleet-driver", help="run simulators for runtime pods on kwok nodes")
    driver.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    driver.add_argument("--profiles-dir", type=Path, default=PACKAGED_PROFILES_DIR)
    # Simulators are hosted in the driver's process and log to its output; the flag stays for old scripts.
    driver.add_argument("--log-dir", type=Path, default=None, help=argparse.SUPPRESS)
    driver.add_argument(
        "--default-profile", default=DEFAULT_PROFILE, help="for pods with neither annotation nor simulator_profile"
    )
    driver.add_argument("--max-pre-stop-seconds", type=float, default=None, metavar="S",
                        help="wait at most S seconds of a deleted pod's preStop sleep before its SIGTERM (default: all "
                        "of it; a test cluster's Gateway stand-in drops a deleted pod as soon as its watch says so)")
    driver.add_argument("--engine", choices=("simulator", "vllm"), default="simulator",
                        help="simulator: a hosted simulator per pod; vllm: run each pod's own command (the launcher, "
                        "then vLLM's CPU build from hack/vllm-cpu-env) on its loopback IP")
    driver.add_argument("--vllm-venv", type=Path, default=None,
                        help="--engine vllm: the venv whose bin/vllm runs (default: hack/vllm-cpu-env's)")
    driver.add_argument("--tiny-models", type=Path, default=None,
                        help="--engine vllm: hack/tiny-models' output; its target and drafter-<default-drafter> serve "
                        "every model the map lacks (default: the cached one)")
    driver.add_argument("--model-map", action="append", default=[], metavar="NAME=PATH",
                        help="--engine vllm: serve spec model NAME from PATH (a directory, or a tiny drafter's name: "
                        "same, good, poor, or target); repeatable")
    driver.add_argument("--default-drafter", default="good", help="--engine vllm: tiny drafter for unmapped drafters")
    driver.add_argument("--max-engines", type=int, default=2,
                        help="--engine vllm: engines at once (about 4 GB each); later pods wait")
    driver.add_argument("--work-dir", type=Path, default=None,
                        help="--engine vllm: per-pod config, model links and engine log (default: a temp dir)")
    gateway = commands.add_parser(
        "gateway", help="local cluster only: a loopback Gateway/kube-proxy stand-in in front of the fake pods")
    gateway.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    gateway.add_argument("--listen", default="127.0.0.1:8080", help="loopback HOST:PORT to serve on")
    gateway.add_argument("--gateway-name", default="inference-gateway",
                         help="serve the HTTPRoutes whose parentRefs name this Gateway")
    gateway.add_argument("--gateway-class", default=STANDIN_GATEWAY_CLASS,
                         help="serve only the Gateways whose spec.gatewayClassName is this")
    load = commands.add_parser("loadgen", help="open-loop OpenAI-style load against a Gateway or Service")
    load.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    load.add_argument("--host", help="Host header: a Gateway hostname or <service>.<namespace>.svc")
    load.add_argument("--model", required=True, help="served model name")
    load.add_argument("--rate", type=float, required=True, help="requests per second (Poisson arrivals)")
    load.add_argument("--duration", type=float, required=True, help="seconds")
    load.add_argument("--prompt-median", type=int, default=128)
    load.add_argument("--output-median", type=int, default=64)
    load.add_argument("--length-sigma", type=float, default=0.5, help="spread of the log-normal lengths")
    load.add_argument("--burst", help="EVERY_S:DURATION_S:FACTOR, e.g. 30:5:4")
    load.add_argument("--chat", action="store_true", help="/v1/chat/completions instead of /v1/completions")
    load.add_argument("--seed", type=int, default=0)
    return parser


def _run_gateway(kubeconfig: str | None, listen: str, gateway: str, gateway_class: str) -> int:
    from specdec_runtime.gateway_standin import run_gateway_standin

    host, _, port = listen.rpartition(":")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_gateway_standin(kubeconfig, host, int(port), gateway, stop, gateway_class=gateway_class)

    asyncio.run(run())
    return 0


def _run_loadgen(options: argparse.Namespace) -> int:
    from specdec_runtime.loadgen import Burst, Lengths, LoadShape, run_load

    burst = None
    if options.burst:
        every, duration, factor = (float(part) for part in options.burst.split(":"))
        burst = Burst(every, duration, factor)
    shape = LoadShape(rate=options.rate, prompt=Lengths(options.prompt_median, options.length_sigma),
                      output=Lengths(options.output_median, options.length_sigma, high=4096), burst=burst,
                      chat=options.chat, seed=options.seed)
    report = asyncio.run(run_load(options.url, options.model, shape, host=options.host, duration_s=options.duration))
    latencies = sorted(outcome.latency_s for outcome in report.outcomes)
    median = latencies[len(latencies) // 2] if latencies else float("nan")
    statuses = ", ".join(f"{status}: {count}" for status, count in sorted(report.statuses.items()))
    aborted = sum(1 for outcome in report.outcomes if outcome.status == 200 and outcome.failed)
    sys.stdout.write(f"sent {report.sent} requests; statuses {statuses} ({aborted} of the 200s aborted); "
                     f"median latency {median:.3f}s\n")
    return 0 if len(report.outcomes) == report.sent and not report.failures else 1


def _engine_settings(options: argparse.Namespace) -> EngineSettings:
    import tempfile

    from specdec_runtime import engine_env
    from specdec_runtime.fleet_engine import EngineSettings, ModelMap

    venv = options.vllm_venv or engine_env.vllm_cpu_venv()
    tiny = options.tiny_models or engine_env.tiny_models_dir()
    if not (venv / "bin" / "vllm").exists():
        raise LaunchError(f"--engine vllm: no {venv}/bin/vllm: run hack/vllm-cpu-env (or pass --vllm-venv)")
    entries = {}
    for item in options.model_map:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise LaunchError(f"--model-map {item!r}: expected NAME=PATH")
        entries[name] = Path(path)
    if not (tiny / "manifest.json").exists():
        raise LaunchError(f"--engine vllm: no tiny models at {tiny} (they serve every model the map lacks): "
                          "run hack/tiny-models, or pass --tiny-models DIR")
    model_map = ModelMap.from_tiny_models(tiny, entries, drafter=options.default_drafter)
    if not (tiny / f"drafter-{options.default_drafter}").is_dir():
        raise LaunchError(f"--default-drafter {options.default_drafter}: no {tiny}/drafter-{options.default_drafter}")
    work = options.work_dir or Path(tempfile.mkdtemp(prefix="specdec-fleet-engines-"))
    work.mkdir(parents=True, exist_ok=True)
    return EngineSettings(work_dir=work, model_map=model_map, vllm_bin=venv / "bin",
                          max_engines=max(1, options.max_engines))


def _run_fleet_driver(kubeconfig: str | None, profiles_dir: Path, default_profile: str,
                      engine: EngineSettings | None = None, max_pre_stop_s: float | None = None) -> int:
    # Imported here: the launcher runs in every GPU pod and has no use for the Kubernetes client.
    from specdec_runtime.fleet_driver import run_fleet_driver

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_fleet_driver(kubeconfig, profiles_dir, stop, default_profile=default_profile, engine=engine,
                               max_pre_stop_s=max_pre_stop_s)

    asyncio.run(run())
    return 0


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    # `simulate` hands every remaining argument to the simulator untouched, including --help.
    if arguments[:1] == ["simulate"]:
        from specdec_runtime.simulator.server import main as simulate

        return simulate(arguments[1:])
    if arguments[:1] == ["tiny-model"]:
        from specdec_runtime.tiny_model import main as tiny_model

        return tiny_model(arguments[1:])
    options = _parser().parse_args(arguments)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if options.command == "launch":
            launch(options.config, options.profiles_dir, options.models_dir)
        if options.command == "render":
            config = load_runtime_config(options.config)
            command = build_command(config, profiles_dir=options.profiles_dir,
                                    models_dir=options.models_dir or models_dir_from_env())
            sys.stdout.write(shlex.join(command) + "\n")
            return 0
    except LaunchError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 2
    if options.command == "gateway":
        return _run_gateway(options.kubeconfig, options.listen, options.gateway_name, options.gateway_class)
    if options.command == "loadgen":
        return _run_loadgen(options)
    engine = None
    if options.engine == "vllm":
        try:
            engine = _engine_settings(options)
        except LaunchError as err:
            sys.stderr.write(f"{PROG}: error: {err}\n")
            return 2
    return _run_fleet_driver(options.kubeconfig, options.profiles_dir, options.default_profile, engine,
                             options.max_pre_stop_seconds)
