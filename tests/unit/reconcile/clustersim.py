"""A tiny cluster for the pure reconcile: Deployment controller, scheduler and kubelet, on fixed GPU nodes.

Just enough of Kubernetes to hold rollouts to their promises: a Deployment rolls by its strategy
(maxSurge, maxUnavailable), the scheduler binds a pod only where its GPUs are free, and a bound pod
becomes ready one tick later. Pods without room stay Pending, as on a real full pool.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec_operator.gpu.inventory import NodeGpus, PodGpus
from specdec_operator.reconcile.plan import ReconcilePlan
from specdec_runtime import contract
from tests.unit.reconcile.reconcilefactories import NAME, NAMESPACE, live

_ids = itertools.count()


@dataclass
class Pod:
    name: str
    revision: str
    track: str
    pool: str
    gpus: int
    node: str | None = None
    ready: bool = False
    pending_since: str | None = None


@dataclass
class SimCluster:
    nodes: Sequence[NodeGpus]
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)  # our live Deployments by name
    others: dict[str, Any] = field(default_factory=dict)  # other live children (ConfigMaps, Services, PDBs)
    pods: dict[str, list[Pod]] = field(default_factory=dict)  # by Deployment name
    foreign: list[PodGpus] = field(default_factory=list)  # other workloads' bound pods
    now: str = "2026-11-29T10:00:00Z"

    def free(self, node: str) -> int:
        allocatable = next(n.allocatable_gpus for n in self.nodes if n.name == node)
        held = sum(p.gpus for pods in self.pods.values() for p in pods if p.node == node)
        held += sum(p.gpus for p in self.foreign if p.node == node)
        return allocatable - held

    def write(self, plan: ReconcilePlan) -> None:
        for obj in plan.apply:
            if obj["kind"] == "Deployment":
                self.deployments[obj["metadata"]["name"]] = copy.deepcopy(obj)
            else:
                self.others[f"{obj['kind']}/{obj['metadata']['name']}"] = obj
        for kind, name in plan.delete:
            if kind == "Deployment":
                self.deployments.pop(name, None)
                self.pods.pop(name, None)

    def tick(self) -> None:
        """Kubelet first (pods bound last tick get ready), then the Deployment controller, then the scheduler."""
        for pods in self.pods.values():
            for pod in pods:
                if pod.node is not None:
                    pod.ready = True
        for name, body in self.deployments.items():
            self._roll(name, body)
        for pods in self.pods.values():
            for pod in pods:
                if pod.node is None:
                    fits = next((n.name for n in self.nodes if self.free(n.name) >= pod.gpus), None)
                    pod.node = fits
                    if fits is None and pod.pending_since is None:
                        pod.pending_since = self.now

    def _roll(self, name: str, body: Mapping[str, Any]) -> None:
        spec = body["spec"]
        replicas = int(spec["replicas"])
        revision = spec["template"]["metadata"]["labels"][contract.LABEL_REVISION]
        track = spec["template"]["metadata"]["labels"][contract.LABEL_TRACK]
        pool = spec["template"]["metadata"]["labels"][contract.LABEL_POOL]
        gpus = int(spec["template"]["spec"]["containers"][0]["resources"]["requests"]["amd.com/gpu"])
        surge = spec["strategy"]["rollingUpdate"]["maxSurge"]
        unavailable = spec["strategy"]["rollingUpdate"]["maxUnavailable"]
        pods = self.pods.setdefault(name, [])
        new = [p for p in pods if p.revision == revision]
        old = [p for p in pods if p.revision != revision]
        # Scale: a Deployment removes unready pods first.
        while len(new) > replicas:
            victim = min(new, key=lambda p: p.ready)
            new.remove(victim)
        # Remove old pods while availability allows (unready ones always may go).
        min_available = replicas - unavailable
        for pod in sorted(old, key=lambda p: p.ready):
            ready_now = sum(p.ready for p in new + old)
            if not pod.ready or ready_now - 1 >= min_available or len(new) + len(old) > replicas + surge:
                old.remove(pod)
        while len(new) < replicas and len(new) + len(old) < replicas + surge:
            new.append(Pod(f"{name}-{next(_ids)}", revision, track, pool, gpus))
        self.pods[name] = new + old

    def observed_children(self) -> list[dict[str, Any]]:
        children = [live(obj) for obj in self.others.values()]
        for name, body in self.deployments.items():
            current = live(body)
            pods = self.pods.get(name, [])
            revision = body["spec"]["template"]["metadata"]["labels"][contract.LABEL_REVISION]
            current["status"] = {
                "observedGeneration": 1,
                "replicas": len(pods),
                "updatedReplicas": sum(p.revision == revision for p in pods),
                "readyReplicas": sum(p.ready for p in pods),
            }
            children.append(current)
        return children

    def gpu_pods(self) -> list[PodGpus]:
        ours = [
            PodGpus(NAMESPACE, p.name, p.gpus, p.node, f"{NAMESPACE}/{NAME}", p.pool,
                    None if p.node else "0/2 nodes are available: 2 Insufficient amd.com/gpu",
                    None if p.node else p.pending_since)
            for pods in self.pods.values() for p in pods
        ]
        return [*ours, *self.foreign]

    def serving(self, track: str | None = None) -> int:
        return sum(p.ready for pods in self.pods.values() for p in pods if track in (None, p.track))

    def pending(self) -> int:
        return sum(p.node is None for pods in self.pods.values() for p in pods)
