"""Scaling a model (spec.placement.totalReplicas, the scale subresource's field) resizes pools and rolls nothing."""

from __future__ import annotations

from typing import Any

from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.reconcile.reconcilefactories import SETTINGS, T0, T1, T2, live_children, observed, status_wire

EAGLE3 = drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")


def scalable(total: int, **bounds: int) -> dict[str, Any]:
    placement = {"gfxTargets": ["gfx942", "gfx90a"], "totalReplicas": total, **bounds}
    return spec_wire(drafters=[EAGLE3], placement=placement)


def deployments(plan: ReconcilePlan) -> dict[str, tuple[int, str]]:
    """Deployment name -> (replicas, pod template revision), as the plan wants them."""
    return {pool.name: (pool.plan.replicas, pool.revision) for pool in plan.pools}


def applied_replicas(plan: ReconcilePlan) -> dict[str, int]:
    """Deployment name -> replicas, for the Deployments this pass writes."""
    return {obj["metadata"]["name"]: obj["spec"]["replicas"] for obj in plan.apply if obj["kind"] == "Deployment"}


def settled(spec: dict[str, Any], generation: int = 1) -> ReconcilePlan:
    first = evaluate(observed(spec, generation=generation), SETTINGS, T0)
    return evaluate(observed(spec, status=status_wire(first), children=live_children(first), generation=generation),
                    SETTINGS, T1)


def test_status_reports_the_placed_count_and_the_pod_selector() -> None:
    status = status_wire(settled(scalable(3)))
    assert status["replicas"] == 3
    assert status["selector"] == "app.kubernetes.io/managed-by=specdec-operator,specdec.io/model=llama8b"


def test_a_scale_change_resizes_pools_without_a_new_revision_or_a_canary() -> None:
    before = settled(scalable(2))
    assert {name: replicas for name, (replicas, _) in deployments(before).items()} == {"llama8b-gfx942": 2}
    spec = scalable(6, maxReplicasPerPool=4)
    after = evaluate(observed(spec, status=status_wire(before), children=live_children(before), generation=2),
                     SETTINGS, T2)
    resized = deployments(after)
    assert {name: replicas for name, (replicas, _) in resized.items()} == {"llama8b-gfx942": 4, "llama8b-gfx90a": 2}
    # The pool that existed keeps its pod template: its pods keep running, only their count changes.
    assert resized["llama8b-gfx942"][1] == deployments(before)["llama8b-gfx942"][1]
    assert applied_replicas(after) == {"llama8b-gfx942": 4, "llama8b-gfx90a": 2}
    revisions = {obj["metadata"]["name"]: obj["spec"]["template"]["metadata"]["labels"][contract.LABEL_REVISION]
                 for obj in after.apply if obj["kind"] == "Deployment"}
    assert revisions["llama8b-gfx942"] == resized["llama8b-gfx942"][1]
    assert after.delete == [] and after.route_weight is None
    status = status_wire(after)
    assert status.get("canary") is None and status["replicas"] == 6
    assert [p["effectiveK"] for p in status["pools"]] == [p["effectiveK"] for p in status_wire(before)["pools"]] + [3]


def test_scaling_to_zero_keeps_the_model_and_says_why() -> None:
    plan = settled(scalable(0))
    assert deployments(plan) == {}
    assert status_wire(plan)["replicas"] == 0



def test_status_url_is_the_in_cluster_url_of_the_model_service() -> None:
    first = evaluate(observed(scalable(1)), SETTINGS, T0)
    service = next(obj for obj in first.apply if obj["kind"] == "Service")
    url = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{service['spec']['ports'][0]['port']}"
    assert url == "http://llama8b.inference.svc:8000"
    assert status_wire(settled(scalable(1)))["url"] == url
