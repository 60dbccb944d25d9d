"""A kubelet stand-in for our runtime pods on kwok nodes: one hosted simulator per Running pod.

Level-triggered: every interval the driver takes the pods that should be served (from a watch cache)
and makes the set of hosted simulators match. A pod that disappears loses its simulator; a pod
replaced under the same name has a new UID, so its old simulator stops and a new one starts with the
new pod's config, which resets its counters as a real restart would.

All simulators live in this one process, each on its own pod IP and port (see simulator/hosted.py):
a process per pod cost ~40 MiB each and kept a 2,000-pod fleet off a small machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from pathlib import Path
from typing import Protocol

from specdec_runtime.config import serve_args
from specdec_runtime.fleet_kube import RuntimePod, kube_pod_source
from specdec_runtime.simulator.hosted import HostedSimulator, HostError, ProfileCache
from specdec_runtime.simulator.profile import DEFAULT_PROFILE, ProfileError, resolve_profile

logger = logging.getLogger(__name__)

RESYNC_INTERVAL_S = 1.0


class PodSource(Protocol):
    async def runtime_pods(self) -> list[RuntimePod]: ...


class FleetSupervisor:
    """Owns the hosted simulators, keyed by pod UID."""

    def __init__(self, profiles_dir: Path, default_profile: str = DEFAULT_PROFILE) -> None:
        self.profiles_dir = profiles_dir
        self.default_profile = default_profile
        self._profiles = ProfileCache()
        self._running: dict[str, HostedSimulator] = {}
        self._names: dict[str, str] = {}  # uid -> namespace/name, for log lines
        self._refused: set[str] = set()

    @property
    def simulators(self) -> dict[str, HostedSimulator]:
        return dict(self._running)

    async def reconcile(self, pods: list[RuntimePod]) -> None:
        wanted = {pod.uid: pod for pod in pods}
        # Stop first: a replacement pod may reuse its predecessor's IP and port.
        for uid in [uid for uid in self._running if uid not in wanted]:
            await self._stop(uid, "pod is gone or replaced")
        self._refused &= wanted.keys()
        for uid, pod in wanted.items():
            if uid not in self._running and uid not in self._refused:
                await self._start(pod)

    async def stop_all(self) -> None:
        for uid in list(self._running):
            await self._stop(uid, "fleet driver shutting down")

    def _argv(self, pod: RuntimePod) -> list[str] | None:
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
            profile = resolve_profile(pod.profile or config.simulator_profile or self.default_profile,
                                      self.profiles_dir)
        except ProfileError as err:
            logger.error("not simulating pod %s: simulator_profile: %s", where, err)
            return None
        return [*serve_args(config), "--profile", str(profile)]

    async def _start(self, pod: RuntimePod) -> None:
        where = f"{pod.namespace}/{pod.name}"
        argv = self._argv(pod)
        if argv is None:
            self._refused.add(pod.uid)
            return
        try:
            hosted = await HostedSimulator.start(argv, self._profiles)
        except HostError as err:
            # An address still held (the old pod's socket closing) heals on the next resync.
            logger.error("not simulating pod %s yet: %s", where, err)
            return
        self._running[pod.uid] = hosted
        self._names[pod.uid] = where
        options = hosted.simulator.options
        logger.info("serving %s on %s:%d (K=%d)", where, options.host, options.port, hosted.simulator.replica.k)

    async def _stop(self, uid: str, reason: str) -> None:
        hosted = self._running.pop(uid)
        await hosted.stop()
        logger.info("stopped simulator for %s: %s", self._names.pop(uid, uid), reason)


async def drive(source: PodSource, supervisor: FleetSupervisor, stop: asyncio.Event,
                interval_s: float = RESYNC_INTERVAL_S) -> None:
    """Reconcile until stop is set, then stop every simulator."""
    try:
        while not stop.is_set():
            try:
                pods = await source.runtime_pods()
            except Exception:
                # Keep the simulators we have: an API hiccup is not a reason to kill the fleet.
                logger.exception("listing runtime pods failed; keeping current simulators")
            else:
                await supervisor.reconcile(pods)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
    finally:
        await supervisor.stop_all()


async def run_fleet_driver(
    kubeconfig: str | None,
    profiles_dir: Path,
    stop: asyncio.Event,
    *,
    default_profile: str = DEFAULT_PROFILE,
) -> None:
    """Profile per pod: its annotation, else its config's simulator_profile, else default_profile."""
    async with kube_pod_source(kubeconfig) as source:
        await drive(source, FleetSupervisor(profiles_dir, default_profile=default_profile), stop)
