"""`specdec-runtime`: launch (the image entrypoint), render, simulate and fleet-driver."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import sys
from pathlib import Path

from specdec_runtime.launcher import DEFAULT_CONFIG_PATH, LaunchError, build_command, launch, load_runtime_config
from specdec_runtime.simulator.profile import DEFAULT_PROFILE, PACKAGED_PROFILES_DIR

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
    commands.add_parser(
        "simulate", help="run the vLLM simulator: serve MODEL ... --profile FILE", add_help=False
    ).add_argument("args", nargs=argparse.REMAINDER)
    driver = commands.add_parser("fleet-driver", help="run simulators for runtime pods on kwok nodes")
    driver.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    driver.add_argument("--profiles-dir", type=Path, default=PACKAGED_PROFILES_DIR)
    # Simulators are hosted in the driver's process and log to its output; the flag stays for old scripts.
    driver.add_argument("--log-dir", type=Path, default=None, help=argparse.SUPPRESS)
    driver.add_argument(
        "--default-profile", default=DEFAULT_PROFILE, help="for pods with neither annotation nor simulator_profile"
    )
    return parser


def _run_fleet_driver(kubeconfig: str | None, profiles_dir: Path, default_profile: str) -> int:
    # Imported here: the launcher runs in every GPU pod and has no use for the Kubernetes client.
    from specdec_runtime.fleet_driver import run_fleet_driver

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_fleet_driver(kubeconfig, profiles_dir, stop, default_profile=default_profile)

    asyncio.run(run())
    return 0


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    # `simulate` hands every remaining argument to the simulator untouched, including --help.
    if arguments[:1] == ["simulate"]:
        from specdec_runtime.simulator.server import main as simulate

        return simulate(arguments[1:])
    options = _parser().parse_args(arguments)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if options.command == "launch":
            launch(options.config, options.profiles_dir)
        if options.command == "render":
            config = load_runtime_config(options.config)
            sys.stdout.write(shlex.join(build_command(config, profiles_dir=options.profiles_dir)) + "\n")
            return 0
    except LaunchError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 2
    return _run_fleet_driver(options.kubeconfig, options.profiles_dir, options.default_profile)
