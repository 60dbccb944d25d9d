"""Issue 22 item 1: a pool whose nodes stop matching keeps its objects, replicas and K for a grace period.

Every route by which a pool's nodes drop out of the inventory is a row of the table; each must hold the pool
(no delete, same replicas and K, a condition naming the missing nodes) until the grace measured from the
first-missing stamp in status has run out, and only then remove it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from specdec_operator.decisions.capacity import FleetClaims
from specdec_operator.gpu.inventory import NodeGpus, PodGpus
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.gpu.gpufactories import demo_fleet
from tests.unit.reconcile.reconcilefactories import SETTINGS, condition, live_children, observed, status_wire

EAGLE3 = drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
# Two pools; gfx942 has five matching nodes in the demo fleet (mi300x-0..3 and mixed-gfx942), one replica each.
SPEC = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942", "gfx90a"], "replicasPerPool": 5},
                 model={"name": "meta-llama/Llama-3.1-8B-Instruct", "tensorParallelSize": 8})
GFX942 = ("mi300x-0", "mi300x-1", "mi300x-2", "mi300x-3", "mixed-gfx942")
GRACE_S = 300.0
SETTINGS_WITH_GRACE = dataclasses.replace(SETTINGS, node_missing_grace_s=GRACE_S)
T0, T1 = "2026-11-29T10:00:00Z", "2026-11-29T10:01:00Z"
T_OUTAGE = "2026-11-29T10:02:00Z"
T_STILL = "2026-11-29T10:06:59Z"  # 299 s after the outage began
T_EXPIRED = "2026-11-29T10:07:00Z"  # 300 s after


def _edit(names: Sequence[str], change: Callable[[NodeGpus], NodeGpus | None]) -> list[NodeGpus]:
    edited = []
    for node in demo_fleet():
        if node.name in names:
            replaced = change(node)
            if replaced is not None:
                edited.append(replaced)
        else:
            edited.append(node)
    return edited


def _no_device_labels(node: NodeGpus) -> NodeGpus:
    labels = {k: v for k, v in node.labels.items() if "device-id" not in k}
    return dataclasses.replace(node, groups=(), labels=labels)


ROUTES: dict[str, list[NodeGpus]] = {
    "nodes-deleted": _edit(GFX942, lambda n: None),
    "allocatable-gpus-zero": _edit(GFX942, lambda n: dataclasses.replace(n, allocatable_gpus=0)),
    "device-id-labels-removed": _edit(GFX942, _no_device_labels),
    "partial-cordon": _edit(GFX942[:3], lambda n: dataclasses.replace(n, cordoned=True)),
    "partial-inventory": _edit(GFX942[:3], lambda n: None),
    "partial-allocatable-zero": _edit(GFX942[2:], lambda n: dataclasses.replace(n, allocatable_gpus=0)),
}
MISSING = {"partial-inventory": GFX942[:3], "partial-cordon": GFX942[:3], "partial-allocatable-zero": GFX942[2:]}


def settled() -> tuple[ReconcilePlan, dict[str, Any]]:
    first = evaluate(observed(SPEC), SETTINGS_WITH_GRACE, T0)
    second = evaluate(observed(SPEC, status=status_wire(first), children=live_children(first)), SETTINGS_WITH_GRACE,
                      T1)
    return first, status_wire(second)


def pool(status: dict[str, Any], gfx: str) -> dict[str, Any]:
    return next(p for p in status["pools"] if p["gfxTarget"] == gfx)


def test_settled_pool_has_five_replicas_on_the_gfx942_nodes() -> None:
    _, status = settled()
    assert pool(status, "gfx942")["replicas"] == 5
    assert pool(status, "gfx942")["nodeNames"] == sorted(GFX942)


@pytest.mark.parametrize("route", list(ROUTES))
def test_missing_nodes_hold_the_pool_for_the_grace_period(route: str) -> None:
    first, status = settled()
    children = live_children(first)
    k_before = pool(status, "gfx942")["effectiveK"]
    outage = evaluate(observed(SPEC, nodes=ROUTES[route], status=status, children=children), SETTINGS_WITH_GRACE,
                      T_OUTAGE)
    assert outage.delete == []
    assert [o for o in outage.apply if o["kind"] == "Deployment"] == []  # replicas and template untouched
    held = pool(status_wire(outage), "gfx942")
    assert (held["replicas"], held["effectiveK"]) == (5, k_before)
    assert held["missing"]["since"] == T_OUTAGE
    missing = MISSING.get(route, GFX942)
    assert held["missing"]["nodes"] == sorted(missing)
    state, reason, message = condition(outage, "Degraded")
    assert (state, reason) == ("True", "NodesMissing")
    assert all(name in message for name in missing)
    assert ("Warning", "NodesMissing") in [(e.type, e.reason) for e in outage.events]

    # Still missing one second before the grace runs out: held, stamp unchanged (it survives restarts: status).
    later = evaluate(observed(SPEC, nodes=ROUTES[route], status=status_wire(outage), children=children),
                     SETTINGS_WITH_GRACE, T_STILL)
    assert later.delete == [] and [o for o in later.apply if o["kind"] == "Deployment"] == []
    assert pool(status_wire(later), "gfx942")["missing"]["since"] == T_OUTAGE
    assert condition(later, "Degraded")[1] == "NodesMissing"

    # The nodes come back within the grace: the pool was never touched, and the record is cleared.
    back = evaluate(observed(SPEC, status=status_wire(later), children=children), SETTINGS_WITH_GRACE, T_STILL)
    assert back.delete == [] and back.apply == []
    restored = pool(status_wire(back), "gfx942")
    assert "missing" not in restored and (restored["replicas"], restored["effectiveK"]) == (5, k_before)
    assert condition(back, "Degraded")[:2] == ("False", "AsExpected")


@pytest.mark.parametrize("route", ["nodes-deleted", "allocatable-gpus-zero", "device-id-labels-removed"])
def test_only_after_the_grace_is_the_pool_removed(route: str) -> None:
    first, status = settled()
    children = live_children(first)
    # Without the tainted gfx942 node too, which an existing pool would otherwise shrink onto.
    nodes = [n for n in ROUTES[route] if n.name != "unhealthy-0"]
    outage = evaluate(observed(SPEC, nodes=nodes, status=status, children=children), SETTINGS_WITH_GRACE, T_OUTAGE)
    assert outage.delete == []
    expired = evaluate(observed(SPEC, nodes=nodes, status=status_wire(outage), children=children),
                       SETTINGS_WITH_GRACE, T_EXPIRED)
    assert ("Deployment", "llama8b-gfx942") in expired.delete
    assert [p["gfxTarget"] for p in status_wire(expired)["pools"]] == ["gfx90a"]
    assert ("Normal", "PoolRemoved") in [(e.type, e.reason) for e in expired.events]


def test_a_partial_outage_scales_down_only_after_the_grace() -> None:
    first, status = settled()
    children = live_children(first)
    nodes = ROUTES["partial-inventory"]
    outage = evaluate(observed(SPEC, nodes=nodes, status=status, children=children), SETTINGS_WITH_GRACE, T_OUTAGE)
    expired = evaluate(observed(SPEC, nodes=nodes, status=status_wire(outage), children=children),
                       SETTINGS_WITH_GRACE, T_EXPIRED)
    assert pool(status_wire(expired), "gfx942")["replicas"] == 2
    assert "missing" not in pool(status_wire(expired), "gfx942")


def test_every_gpu_node_gone_while_cpu_nodes_remain_holds_too() -> None:
    """The empty-inventory guard saw no node at all; a real cluster keeps its CPU nodes."""
    first, status = settled()
    cpu_only = [n for n in demo_fleet() if not n.groups and not n.unknown_device_ids]
    assert cpu_only
    plan = evaluate(observed(SPEC, nodes=cpu_only, status=status, children=live_children(first)),
                    SETTINGS_WITH_GRACE, T_OUTAGE)
    assert plan.delete == []
    assert len(status_wire(plan)["pools"]) == 2
    assert condition(plan, "Degraded")[1] == "NodesMissing"


def test_a_spec_that_drops_the_target_removes_the_pool_at_once() -> None:
    """Grace covers nodes that stop matching, not a decision in Git."""
    first, status = settled()
    only_90a = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx90a"], "replicasPerPool": 5},
                         model={"name": "meta-llama/Llama-3.1-8B-Instruct", "tensorParallelSize": 8})
    plan = evaluate(observed(only_90a, status=status, children=live_children(first)), SETTINGS_WITH_GRACE, T_OUTAGE)
    assert ("Deployment", "llama8b-gfx942") in plan.delete


def test_a_status_without_node_names_still_holds() -> None:
    """A status written before nodeNames existed: the pool is held, the condition names the gfx target."""
    first, status = settled()
    for entry in status["pools"]:
        entry.pop("nodeNames")
    plan = evaluate(observed(SPEC, nodes=ROUTES["nodes-deleted"], status=status, children=live_children(first)),
                    SETTINGS_WITH_GRACE, T_OUTAGE)
    assert plan.delete == []
    assert "gfx942" in condition(plan, "Degraded")[2]


def test_gpus_taken_by_other_workloads_are_not_missing_nodes() -> None:
    """Capacity other models hold shrinks a pool through InsufficientGpus at once: its nodes are all there."""
    first, status = settled()
    others = FleetClaims.of(PodGpus("other", f"o{i}", 8, name, "other/model") for i, name in enumerate(GFX942[:3]))
    taken = dataclasses.replace(observed(SPEC, status=status, children=live_children(first)), gpu_claims=others)
    plan = evaluate(taken, SETTINGS_WITH_GRACE, T_OUTAGE)
    assert "missing" not in pool(status_wire(plan), "gfx942")
    assert pool(status_wire(plan), "gfx942")["replicas"] == 2
    assert condition(plan, "Degraded")[1] == "InsufficientGpus"


def test_a_pool_whose_gpus_other_workloads_took_entirely_is_not_held() -> None:
    first, status = settled()
    others = FleetClaims.of(PodGpus("other", f"o{i}", 8, name, "other/model") for i, name in enumerate(GFX942))
    taken = dataclasses.replace(observed(SPEC, status=status, children=live_children(first)), gpu_claims=others)
    plan = evaluate(taken, SETTINGS_WITH_GRACE, T_OUTAGE)
    assert "gfx942" not in [p["gfxTarget"] for p in status_wire(plan)["pools"] if p.get("missing")]
    assert condition(plan, "Degraded")[1] == "InsufficientGpus"


def test_nodes_that_go_missing_one_after_another_are_all_named_and_the_clock_keeps_the_first() -> None:
    """An outage that reaches the pool's nodes one by one (a device plugin restarting node after node, a node
    group replaced in turns): the record grows to name every missing node; its stamp stays the first one's."""
    first, status = settled()
    children = live_children(first)
    one = evaluate(observed(SPEC, nodes=_edit(GFX942[:1], lambda n: None), status=status, children=children),
                   SETTINGS_WITH_GRACE, T_OUTAGE)
    assert pool(status_wire(one), "gfx942")["missing"] == {"since": T_OUTAGE, "nodes": list(GFX942[:1])}
    two = evaluate(observed(SPEC, nodes=_edit(GFX942[:2], lambda n: None), status=status_wire(one), children=children),
                   SETTINGS_WITH_GRACE, T_STILL)
    assert pool(status_wire(two), "gfx942")["missing"] == {"since": T_OUTAGE, "nodes": sorted(GFX942[:2])}
    assert all(name in condition(two, "Degraded")[2] for name in GFX942[:2])
    assert two.delete == [] and [o for o in two.apply if o["kind"] == "Deployment"] == []
    # One of them returns while the other is still missing: the record names only the one still missing.
    back = evaluate(observed(SPEC, nodes=_edit(GFX942[1:2], lambda n: None), status=status_wire(two),
                             children=children), SETTINGS_WITH_GRACE, T_STILL)
    assert pool(status_wire(back), "gfx942")["missing"] == {"since": T_OUTAGE, "nodes": [GFX942[1]]}
