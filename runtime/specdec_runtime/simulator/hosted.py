"""Many simulated vLLM servers in one process: one aiohttp listener per pod IP and port.

A simulator process costs ~40 MiB; a hosted one costs an engine, a registry and a listening socket,
so a 2,000-pod fleet fits in one process of a few hundred MiB. Each hosted simulator is isolated as a
process would be: its own options (K, model name, port), its own profile (with its faults), its own
random stream, and counters that start at zero when it starts.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

from aiohttp import web

from specdec_runtime.simulator.profile import Profile, load_profile
from specdec_runtime.simulator.server import CANCEL_S, HTTP_KEEP_ALIVE_S, Simulator, build_app
from specdec_runtime.simulator.vllm_cli import EXIT_STARTUP_REFUSED, ServeOptions, StartupRefusal, check_serve_args

logger = logging.getLogger(__name__)


class HostError(Exception):
    """This pod's simulator cannot start: bad arguments, a bad profile, or its address is taken."""


class HostExit(HostError):
    """The simulator "process" exited at start-up, as vLLM does when it refuses its configuration: the exit
    code and the last line it wrote to stderr, which a kubelet reports as the termination message."""

    def __init__(self, exit_code: int, last_line: str) -> None:
        super().__init__(f"exited with code {exit_code}: {last_line}")
        self.exit_code = exit_code
        self.last_line = last_line


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class ProfileCache:
    """Profiles by path, re-read when the file changes; many pods share one parsed profile (read-only)."""

    def __init__(self) -> None:
        self._profiles: dict[Path, tuple[float, Profile]] = {}

    def get(self, path: Path) -> Profile:
        mtime = path.stat().st_mtime
        cached = self._profiles.get(path)
        if cached is None or cached[0] != mtime:
            cached = self._profiles[path] = (mtime, load_profile(path))
        return cached[1]


def parse_options(argv: list[str]) -> ServeOptions:
    """`serve MODEL ... --profile FILE` as the simulator's own command line takes it.

    A refusal (argparse's, or vLLM's own start-up checks) is the process exiting: HostExit carries the exit code
    and the last stderr line, as a kubelet's lastState.terminated would. An exception is an uncaught error:
    exit code 1 and the traceback's last line (`Type: message`)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return check_serve_args(argv)
    except StartupRefusal as refusal:
        # What the simulator's process prints last before it exits, as vLLM's would.
        raise HostExit(EXIT_STARTUP_REFUSED, refusal.line()) from None
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        raise HostExit(code, _last_line(stderr.getvalue()) or f"exit status {code}") from None
    except Exception as err:  # any other start-up failure is the process dying with its last line
        raise HostExit(1, f"{type(err).__name__}: {err}") from None


class HostedSimulator:
    """One simulator serving on its own host:port inside the driver's event loop."""

    def __init__(self, simulator: Simulator) -> None:
        self.simulator = simulator
        self._runner = web.AppRunner(build_app(simulator, background_tick=False), access_log=None,
                                     handle_signals=False, keepalive_timeout=HTTP_KEEP_ALIVE_S,
                                     shutdown_timeout=CANCEL_S)

    @classmethod
    async def start(cls, argv: list[str], profiles: ProfileCache) -> HostedSimulator:
        options = parse_options(argv)
        try:
            profile = profiles.get(options.profile)
        except (OSError, ValueError) as err:
            raise HostError(str(err)) from err
        hosted = cls(Simulator(options, profile))
        await hosted._runner.setup()
        site = web.TCPSite(hosted._runner, options.host, options.port, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            await hosted._runner.cleanup()
            raise HostError(f"cannot listen on {options.host}:{options.port}: {err.strerror or err}") from err
        return hosted

    async def stop(self) -> None:
        """The process's SIGTERM: vLLM's drain (new completions answered 500, those in flight given up to
        --shutdown-timeout seconds), then the listener closed and what is left cut."""
        try:
            await self.simulator.drain()
        finally:
            await self._runner.cleanup()
