"""Start, watch and stop the control-plane processes, each with its own log file and PID file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from localcluster.errors import ClusterError

_LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class Component:
    name: str
    command: list[str]
    ports: tuple[int, ...] = ()


def command_file(pid_dir: Path, name: str) -> Path:
    """Where `start` records how a component was started, so a restart uses exactly the same flags."""
    return pid_dir / f"{name}.command.json"


def load_component(pid_dir: Path, name: str) -> Component:
    path = command_file(pid_dir, name)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        raise ClusterError(
            f"no record of how {name} was started ({path}): is the cluster up? (`hack/cluster up`)"
        ) from None
    return Component(name, [str(arg) for arg in record["command"]], tuple(int(port) for port in record["ports"]))


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def check_port_free(port: int, owner: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Like the servers themselves: connections lingering in TIME_WAIT do not make a port busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise ClusterError(
                f"port {port} on 127.0.0.1 (needed by {owner}) is already in use: run `hack/cluster down`, or "
                f"find the holder with `ss -ltnp 'sport = :{port}'`, or pick other ports with SPECDEC_CLUSTER_PORT_BASE"
            ) from None


def start(component: Component, log_dir: Path, pid_dir: Path) -> subprocess.Popen[bytes]:
    for port in component.ports:
        check_port_free(port, component.name)
    log_path = log_dir / f"{component.name}.log"
    with log_path.open("ab") as sink:
        # A new session gives each component its own process group, so `down` can kill children too.
        process = subprocess.Popen(
            component.command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    (pid_dir / f"{component.name}.pid").write_text(str(process.pid))
    command_file(pid_dir, component.name).write_text(
        json.dumps({"command": component.command, "ports": list(component.ports)})
    )
    return process


def ensure_running(component: Component, process: subprocess.Popen[bytes], log_dir: Path) -> None:
    code = process.poll()
    if code is not None:
        raise ClusterError(
            f"{component.name} exited at start (exit code {code}); last lines of {log_dir / component.name}.log:\n"
            f"{log_tail(log_dir / f'{component.name}.log')}"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_pid_file(pid_file: Path, grace_s: float = 10.0, sig: signal.Signals = signal.SIGTERM) -> bool:
    """Stop the process group named by a PID file (`sig`, then SIGKILL after `grace_s`); True if something
    was running. Returns only once the group leader is gone, so its ports are free again."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    pid_file.unlink(missing_ok=True)
    if not _alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    if _wait_gone(pid, grace_s):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    _wait_gone(pid, 5.0)
    return True


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        # Reaps our own child (a zombie still counts as alive); others are reaped by their parent or init.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def running_components(pid_dir: Path) -> dict[str, int]:
    result: dict[str, int] = {}
    for pid_file in sorted(pid_dir.glob("*.pid")) if pid_dir.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().strip())
            if _alive(pid):
                result[pid_file.stem] = pid
    return result
