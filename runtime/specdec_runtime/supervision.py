"""What both fleet drivers do as a kubelet does, whatever serves a pod (a hosted simulator or a real engine).

Every resync the driver hands over the pods that exist; the supervisor makes what runs match them: a pod being
deleted begins its termination (termination.py), a pod that is gone loses what served it, and a pod without a
workload gets one, unless its start was refused or its crash back-off has not run out. What starting, stopping and
readiness mean is the subclass's (fleet_driver.FleetSupervisor, fleet_engine.EngineSupervisor).
"""

from __future__ import annotations

import ipaddress
import time
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass

from specdec_runtime.fleet_kube import RuntimePod
from specdec_runtime.podstates import Terminated, backoff_s
from specdec_runtime.termination import Finish, Terminations


@dataclass
class CrashLoop:
    """A pod whose workload exited: how often, how last, and when the back-off lets it start again."""

    restarts: int
    last: Terminated
    retry_at: float  # monotonic


def has_loopback_ip(pod: RuntimePod) -> bool:
    """Only a loopback pod IP may be served here: the drivers bind it, and tests dial nothing else."""
    try:
        return ipaddress.ip_address(pod.pod_ip).is_loopback
    except ValueError:
        return False


class PodSupervisor(ABC):
    """Keeps one workload per pod UID, with the kubelet's crash back-off and termination sequence."""

    def __init__(self, finish: Finish | None) -> None:
        self._crashes: dict[str, CrashLoop] = {}
        self._refused: set[str] = set()  # starts refused for good (a non-loopback IP, an unknown profile)
        self._terminations = Terminations(finish)

    async def reconcile(self, pods: list[RuntimePod]) -> None:
        wanted = {pod.uid: pod for pod in pods if pod.terminating is None}
        for pod in pods:
            if pod.terminating is not None and pod.uid not in self._terminations:
                self._crashes.pop(pod.uid, None)
                self._begin_termination(pod)
        self._terminations.forget({pod.uid for pod in pods})
        # Stop first: a pod deleted without a grace period, whose address a new pod may already have.
        for uid in [uid for uid in self._serving() if uid not in wanted]:
            await self._stop(uid, "pod is gone")
        self._refused &= wanted.keys()
        for uid in [uid for uid in self._crashes if uid not in wanted]:
            del self._crashes[uid]
        await self._collect_exits()
        now = time.monotonic()
        for uid, pod in sorted(wanted.items(), key=lambda item: (item[1].namespace, item[1].name)):
            crash = self._crashes.get(uid)
            if uid in self._serving() or uid in self._refused or (crash is not None and now < crash.retry_at):
                continue  # serving, refused, or backing off as the kubelet does between restarts
            if self._may_start(pod):
                await self._start(pod)
        await self._report_ready()

    def _crashed(self, pod: RuntimePod, last: Terminated) -> CrashLoop:
        """Counts an exit of the pod's workload and sets when it may start again; the count, like the kubelet's
        restart count, only grows while the pod exists."""
        crash = self._crashes.get(pod.uid)
        restarts = (crash.restarts if crash is not None else 0) + 1
        self._crashes[pod.uid] = CrashLoop(restarts, last, time.monotonic() + backoff_s(restarts))
        return self._crashes[pod.uid]

    def _crash_history(self, uid: str) -> tuple[int, Terminated | None]:
        """The restart count and last termination to report with a pod that runs (again)."""
        crash = self._crashes.get(uid)
        return (crash.restarts, crash.last) if crash is not None else (0, None)

    def _may_start(self, pod: RuntimePod) -> bool:
        """False holds a start until a later resync (the node has no room yet)."""
        return True

    @abstractmethod
    async def _collect_exits(self) -> None:
        """Notices workloads that exited on their own, before anything starts."""

    @abstractmethod
    def _serving(self) -> Collection[str]:
        """UIDs of the pods with a workload running."""

    @abstractmethod
    async def _start(self, pod: RuntimePod) -> None: ...

    @abstractmethod
    async def _stop(self, uid: str, reason: str) -> None: ...

    @abstractmethod
    def _begin_termination(self, pod: RuntimePod) -> None:
        """The pod is being deleted: hand its workload to the termination sequence (termination.py)."""

    @abstractmethod
    async def _report_ready(self) -> None:
        """Reports pods whose workload became ready, as the kubelet does when the readiness probe first passes."""
