"""A kubelet stand-in for our runtime pods on kwok nodes: one simulator process per Running pod.

Level-triggered: every interval the driver lists the pods that should have a process and makes the
set of processes match. A pod that disappears loses its process; a pod replaced under the same name
has a new UID, so its old process stops and a new one starts with the new pod's config, which resets
its counters as a real restart would. Each process runs in its own process group so that stopping
it (or the driver) leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shlex
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from specdec_runtime.fleet_kube import RuntimePod, kube_pod_source
from specdec_runtime.launcher import LaunchError, build_command
from specdec_runtime.simulator.profile import DEFAULT_PROFILE

logger = logging.getLogger(__name__)

RESYNC_INTERVAL_S = 1.0
STOP_GRACE_S = 5.0


class PodSource(Protocol):
    async def runtime_pods(self) -> list[RuntimePod]: ...


Spawn = Callable[[list[str], IO[bytes]], Awaitable[asyncio.subprocess.Process]]


async def spawn_in_own_group(command: list[str], log: IO[bytes]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )


@dataclass
class _Running:
    pod: RuntimePod
    process: asyncio.subprocess.Process
    log: IO[bytes]


class FleetSupervisor:
    """Owns the simulator processes, keyed by pod UID."""

    def __init__(
        self,
        profiles_dir: Path,
        log_dir: Path,
        spawn: Spawn = spawn_in_own_group,
        default_profile: str = DEFAULT_PROFILE,
    ) -> None:
        self.profiles_dir = profiles_dir
        self.log_dir = log_dir
        self.default_profile = default_profile
        self._spawn = spawn
        self._running: dict[str, _Running] = {}
        self._refused: set[str] = set()

    @property
    def processes(self) -> dict[str, asyncio.subprocess.Process]:
        return {uid: running.process for uid, running in self._running.items()}

    async def reconcile(self, pods: list[RuntimePod]) -> None:
        wanted = {pod.uid: pod for pod in pods}
        for uid in [uid for uid in self._running if uid not in wanted]:
            await self._stop(uid, "pod is gone or replaced")
        for uid, pod in wanted.items():
            running = self._running.get(uid)
            if running is not None and running.process.returncode is not None:
                logger.warning(
                    "simulator for %s/%s exited with %s; restarting",
                    pod.namespace, pod.name, running.process.returncode,
                )
                await self._stop(uid, "process exited")
            if uid not in self._running and uid not in self._refused:
                await self._start(pod)

    async def stop_all(self) -> None:
        for uid in list(self._running):
            await self._stop(uid, "fleet driver shutting down")

    def _command(self, pod: RuntimePod) -> list[str] | None:
        where = f"{pod.namespace}/{pod.name}"
        try:
            loopback = ipaddress.ip_address(pod.pod_ip).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            logger.error("REFUSING pod %s: podIP %s is not loopback (127.0.0.0/8); give kwok a loopback CIDR",
                         where, pod.pod_ip)
            return None
        # The pod's own args, bound to its IP, with the simulator in place of vLLM.
        config = pod.config.model_copy(update={"host": pod.pod_ip, "engine": "simulator"})
        try:
            profile = pod.profile or config.simulator_profile or self.default_profile
            return build_command(config, profiles_dir=self.profiles_dir, profile=profile)
        except LaunchError as err:
            logger.error("not simulating pod %s: %s", where, err)
            return None

    async def _start(self, pod: RuntimePod) -> None:
        command = self._command(pod)
        if command is None:
            self._refused.add(pod.uid)
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{pod.namespace}_{pod.name}_{pod.uid[:8]}.log").open("ab")
        process = await self._spawn(command, log)
        self._running[pod.uid] = _Running(pod, process, log)
        logger.info("started simulator pid %d for %s/%s: %s", process.pid, pod.namespace, pod.name,
                    shlex.join(command))

    async def _stop(self, uid: str, reason: str) -> None:
        running = self._running.pop(uid)
        process, pod = running.process, running.pod
        if process.returncode is None:
            # Signal the group while its leader is unreaped, so its id cannot belong to anyone else.
            _signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE_S)
            except TimeoutError:
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        running.log.close()
        logger.info("stopped simulator pid %d for %s/%s: %s", process.pid, pod.namespace, pod.name, reason)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


async def drive(source: PodSource, supervisor: FleetSupervisor, stop: asyncio.Event,
                interval_s: float = RESYNC_INTERVAL_S) -> None:
    """Reconcile until stop is set, then stop every process."""
    try:
        while not stop.is_set():
            try:
                pods = await source.runtime_pods()
            except Exception:
                # Keep the processes we have: an API hiccup is not a reason to kill the fleet.
                logger.exception("listing runtime pods failed; keeping current processes")
            else:
                await supervisor.reconcile(pods)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
    finally:
        await supervisor.stop_all()


async def run_fleet_driver(
    kubeconfig: str | None,
    profiles_dir: Path,
    log_dir: Path,
    stop: asyncio.Event,
    *,
    default_profile: str = DEFAULT_PROFILE,
) -> None:
    """Profile per pod: its annotation, else its config's simulator_profile, else default_profile."""
    async with kube_pod_source(kubeconfig) as source:
        await drive(source, FleetSupervisor(profiles_dir, log_dir, default_profile=default_profile), stop)
