"""Observed models for the pure reconcile: spec, real-looking node facts, live children as the server returns them."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specdec_operator.gpu.inventory import NodeGpus
from specdec_operator.reconcile.observed import EvaluationSettings, ObservedModel
from specdec_operator.reconcile.plan import ReconcilePlan
from specdec_operator.settings import DEFAULT_IMAGE_TARGETS, DEFAULT_IMAGES, OperatorEnvSettings
from tests.unit.api.specfactories import spec_wire
from tests.unit.gpu.gpufactories import demo_fleet

NAMESPACE = "inference"
NAME = "llama8b"
UID = "0b7d1c52-0000-4000-8000-00000000beef"
T0 = "2026-11-29T10:00:00Z"
T1 = "2026-11-29T10:05:00Z"
T2 = "2026-11-29T10:10:00Z"

# The shipped defaults, not OperatorEnvSettings(): that would read SPECDEC_* from the environment.
SETTINGS = EvaluationSettings(
    runtime_images=DEFAULT_IMAGES,
    image_targets=DEFAULT_IMAGE_TARGETS,
    simulator_image=str(OperatorEnvSettings.model_fields["simulator_image"].default),
    kv_headroom_fraction=float(OperatorEnvSettings.model_fields["kv_headroom_fraction"].default),
)
FLEET = demo_fleet()

Child = Mapping[str, Any]


def observed(
    spec: Mapping[str, Any] | None = None,
    nodes: Sequence[NodeGpus] = FLEET,
    status: Mapping[str, Any] | None = None,
    children: Iterable[Child] = (),
    generation: int = 1,
) -> ObservedModel:
    return ObservedModel(
        namespace=NAMESPACE,
        name=NAME,
        uid=UID,
        generation=generation,
        spec=spec if spec is not None else spec_wire(),
        status=status or {},
        children={(c["kind"], c["metadata"]["name"]): c for c in children},
        nodes=nodes,
    )


def live(obj: Child, created: str = T0, ready: bool = True) -> dict[str, Any]:
    """`obj` as the API server returns it: server metadata, defaults we never set, and a status."""
    body = copy.deepcopy(dict(obj))
    meta = body["metadata"]
    meta.update({"uid": f"uid-{meta['name']}", "resourceVersion": "42", "creationTimestamp": created, "generation": 1})
    if body["kind"] == "Deployment":
        spec = body["spec"]
        spec.setdefault("progressDeadlineSeconds", 600)
        for container in spec["template"]["spec"]["containers"]:
            container.update({"imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"})
            container.setdefault("terminationMessagePolicy", "File")  # defaulted only where the object has none
        replicas = spec["replicas"]
        body["status"] = {
            "observedGeneration": 1,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas if ready else 0,
        }
    if body["kind"] == "Service":
        body["spec"]["clusterIP"] = "10.96.0.17"
        body["spec"]["type"] = "ClusterIP"
    return body


def live_children(plan: ReconcilePlan, ready: bool = True) -> list[dict[str, Any]]:
    return [live(obj, ready=ready) for obj in plan.apply]


def condition(plan: ReconcilePlan, kind: str) -> tuple[str, str, str]:
    assert plan.status is not None
    found = next(c for c in plan.status.conditions if c.type == kind)
    return found.status, found.reason, found.message


def status_wire(plan: ReconcilePlan) -> dict[str, Any]:
    assert plan.status is not None
    return plan.status.to_wire()


def kinds_and_names(objects: Iterable[Child]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objects)
