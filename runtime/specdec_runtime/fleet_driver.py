"""A kubelet stand-in for our runtime pods on kwok nodes: one hosted simulator per pod with an IP.

Level-triggered: every interval the driver takes the pods that should be served (from a watch cache)
and makes the set of hosted simulators match. A pod that disappears loses its simulator; a pod
replaced under the same name has a new UID, so its old simulator stops and a new one starts with the
new pod's config, which resets its counters as a real restart would.

A simulator that "exits" (it refuses its arguments as vLLM would, or the pod asks for a simulated OOM kill) is
restarted with the kubelet's back-off (10 s doubling to 5 min), and each exit is reported on the pod as the
kubelet would: CrashLoopBackOff with lastState.terminated and a restart count (podstates.py).

Readiness is the driver's too: KWOK gives a runtime pod its IP and leaves it Pending and not ready (the
`runtime-pod-start` stage, hack/localcluster/build.py); the driver reports it running and Ready once its simulator
has loaded its model (the profile's restart_s), as the kubelet does when vLLM's readiness probe first passes.
Probes are not run after that: a simulator whose /health turns 503 later stays Ready.

All simulators live in this one process, each on its own pod IP and port (see simulator/hosted.py):
a process per pod cost ~40 MiB each and kept a 2,000-pod fleet off a small machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from pathlib import Path
from typing import Protocol

from specdec_runtime.config import serve_args
from specdec_runtime.fleet_engine import EngineSettings, EngineSupervisor
from specdec_runtime.fleet_kube import RuntimePod, kube_pod_source
from specdec_runtime.podstates import Terminated, backoff_s
from specdec_runtime.simulator.hosted import HostedSimulator, HostError, HostExit, ProfileCache
from specdec_runtime.simulator.profile import DEFAULT_PROFILE, ProfileError, resolve_profile
from specdec_runtime.supervision import PodSupervisor, has_loopback_ip

logger = logging.getLogger(__name__)

RESYNC_INTERVAL_S = 1.0


class PodSource(Protocol):
    async def runtime_pods(self) -> list[RuntimePod]: ...


class Supervisor(Protocol):
    """Makes what runs match the pods: hosted simulators (FleetSupervisor) or real engines (fleet_engine)."""

    async def reconcile(self, pods: list[RuntimePod]) -> None: ...

    async def stop_all(self) -> None: ...


class ContainerReporter(Protocol):
    """Writes what a kubelet would: the pod's status when its container exits, or runs and is ready, and the pod's
    final deletion once its container stopped."""

    async def report_crash(self, pod: RuntimePod, restarts: int, last: Terminated) -> None: ...

    async def report_running(self, pod: RuntimePod, restarts: int, last: Terminated | None) -> None: ...

    async def finish_deletion(self, pod: RuntimePod) -> None: ...


class FleetSupervisor(PodSupervisor):
    """Owns the hosted simulators, keyed by pod UID."""

    def __init__(self, profiles_dir: Path, default_profile: str = DEFAULT_PROFILE,
                 reporter: ContainerReporter | None = None) -> None:
        super().__init__(reporter.finish_deletion if reporter is not None else None)
        self.profiles_dir = profiles_dir
        self.default_profile = default_profile
        self.reporter = reporter
        self._profiles = ProfileCache()
        self._running: dict[str, HostedSimulator] = {}
        self._names: dict[str, str] = {}  # uid -> namespace/name, for log lines
        self._loading: dict[str, RuntimePod] = {}  # started, not reported Ready yet: the model still loads

    @property
    def simulators(self) -> dict[str, HostedSimulator]:
        return dict(self._running)

    def _serving(self) -> Collection[str]:
        return self._running.keys()

    async def _collect_exits(self) -> None:
        """A hosted simulator exits only as it starts (it refuses its arguments, or stands for an OOM kill), which
        `_start` reports at once."""

    async def _exited(self, pod: RuntimePod, last: Terminated) -> None:
        crash = self._crashed(pod, last)
        logger.warning("simulator of %s/%s exited (%s, exit code %d%s); restart %d in %.0fs", pod.namespace,
                       pod.name, last.reason, last.exit_code, f": {last.message}" if last.message else "",
                       crash.restarts, backoff_s(crash.restarts))
        if self.reporter is not None:
            await self.reporter.report_crash(pod, crash.restarts, last)

    async def stop_all(self) -> None:
        await self._terminations.close()
        for uid in list(self._running):
            await self._stop(uid, "fleet driver shutting down")

    def _begin_termination(self, pod: RuntimePod) -> None:
        """The pod is being deleted: its simulator serves through the preStop wait, then drains (termination.py)."""
        hosted = self._running.pop(pod.uid, None)
        self._loading.pop(pod.uid, None)
        where = self._names.pop(pod.uid, f"{pod.namespace}/{pod.name}")
        if hosted is None:
            self._terminations.begin(pod, None)
            return

        async def stop(seconds: float) -> None:
            try:
                await asyncio.wait_for(hosted.stop(), seconds)
            except TimeoutError:
                logger.warning("simulator for %s still served at the end of its grace period", where)

        self._terminations.begin(pod, stop)

    def _argv(self, pod: RuntimePod) -> list[str] | None:
        where = f"{pod.namespace}/{pod.name}"
        if not has_loopback_ip(pod):
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
        if pod.simulate_oom:
            # Told to stand for a load that outgrows its memory limit: the kernel kills it, no stderr line.
            await self._exited(pod, Terminated("OOMKilled", 137))
            return
        try:
            hosted = await HostedSimulator.start(argv, self._profiles)
        except HostExit as exit_:
            await self._exited(pod, Terminated("Error", exit_.exit_code, exit_.last_line))
            return
        except HostError as err:
            # An address still held (the old pod's socket closing) heals on the next resync.
            logger.error("not simulating pod %s yet: %s", where, err)
            return
        self._running[pod.uid] = hosted
        self._names[pod.uid] = where
        self._loading[pod.uid] = pod
        options = hosted.simulator.options
        logger.info("serving %s on %s:%d (K=%d)", where, options.host, options.port, hosted.simulator.replica.k)

    async def _report_ready(self) -> None:
        """Pods whose simulator finished loading its model are reported running and Ready, as the kubelet does
        once vLLM's readiness probe passes: until then no Service or route sends them a request (vLLM answers
        503 while it loads) and no rollout counts them. Checked every resync: Ready lags loading by one."""
        for uid, pod in list(self._loading.items()):
            hosted = self._running.get(uid)
            if hosted is None:
                del self._loading[uid]
                continue
            hosted.simulator.tick()
            if not hosted.simulator.replica.ready:
                continue
            del self._loading[uid]
            if self.reporter is not None:
                await self.reporter.report_running(pod, *self._crash_history(uid))

    async def _stop(self, uid: str, reason: str) -> None:
        hosted = self._running.pop(uid)
        await hosted.stop()
        logger.info("stopped simulator for %s: %s", self._names.pop(uid, uid), reason)


async def drive(source: PodSource, supervisor: Supervisor, stop: asyncio.Event,
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
    engine: EngineSettings | None = None,
    max_pre_stop_s: float | None = None,
) -> None:
    """Profile per pod: its annotation, else its config's simulator_profile, else default_profile. With `engine`,
    each pod runs its own container command (the launcher, then vLLM) instead (fleet_engine.py)."""
    async with kube_pod_source(kubeconfig, max_pre_stop_s) as source:
        supervisor: Supervisor = (
            EngineSupervisor(engine, reporter=source) if engine is not None
            else FleetSupervisor(profiles_dir, default_profile=default_profile, reporter=source)
        )
        # What a caller waits for to know the driver is up (tests start it and wait for this line, not a clock).
        logger.info("watching runtime pods (%s)", "vLLM engines" if engine is not None else "simulators")
        await drive(source, supervisor, stop)
