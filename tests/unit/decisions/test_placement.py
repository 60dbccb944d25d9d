"""Placement: which gfx targets get a pool, on which nodes, with how many replicas; and effective K."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.decisions.placement import PlacementPlan, effective_k, plan_placement, tolerates
from specdec_operator.decisions.runtime_env import RuntimePlan
from specdec_operator.gpu.inventory import NodeGpus, Taint
from specdec_operator.render.pool import NodeTargeting, PoolIdentity, PoolTrack, pod_template
from tests.unit.api.specfactories import drafter_wire, spec
from tests.unit.gpu.gpufactories import (
    DCM,
    DEDICATED,
    DRIVER_UPGRADE,
    MI250X,
    MI300X,
    MI325X,
    UNHEALTHY,
    UNLISTED,
    W7900,
    cpu_node,
    demo_fleet,
    homogeneous_node,
    mixed_node,
)

KV_HEADROOM = 0.2


def place(nodes: Sequence[NodeGpus], **overrides: Any) -> PlacementPlan:
    return plan_placement(spec(**overrides), nodes, KV_HEADROOM)


def pools_by_gfx(plan: PlacementPlan) -> dict[str, tuple[str, ...]]:
    return {pool.gfx: pool.nodes for pool in plan.pools}


def skipped_by_gfx(plan: PlacementPlan) -> dict[str, tuple[str, str]]:
    return {s.gfx: (s.reason, s.message) for s in plan.skipped}


FLEET = demo_fleet()
HEALTHY_FLEET = [node for node in FLEET if not node.taints]


@pytest.mark.parametrize(
    ("gfx", "nodes"),
    [
        ("gfx942", ("mi300x-0", "mi300x-1", "mi300x-2", "mi300x-3", "mixed-gfx942")),
        ("gfx90a", ("mi250x-0", "mi250x-1")),
        ("gfx1100", ("w7900-0", "w7900-1")),
    ],
)
def test_pool_lands_on_its_gfx_nodes_only(gfx: str, nodes: tuple[str, ...]) -> None:
    assert pools_by_gfx(place(HEALTHY_FLEET, placement={"gfxTargets": [gfx]})) == {gfx: nodes}


def test_replicas_never_count_a_tainted_nodes_gpus() -> None:
    plan = place(FLEET, model={"tensorParallelSize": 8}, placement={"gfxTargets": ["gfx942"], "replicasPerPool": 6})
    assert "unhealthy-0" not in plan.pools[0].nodes
    assert plan.pools[0].replicas == 5


def test_gfx_mixed_node_is_excluded_and_said_so() -> None:
    plan = place(FLEET, placement={"gfxTargets": ["gfx1100"]})
    assert "mixed-rdna3 mixes gfx targets ['gfx1100', 'gfx1101']" in plan.pools[0].notes


def test_gfx_target_found_only_on_a_gfx_mixed_node_gets_no_pool() -> None:
    plan = place(FLEET, placement={"gfxTargets": ["gfx1101"]})
    reason, message = skipped_by_gfx(plan)["gfx1101"]
    assert (plan.pools, reason) == ((), "NoCompatibleNodes")
    assert "mixed-rdna3 mixes gfx targets" in message


def test_gfx_homogeneous_mixed_node_is_used_with_its_smallest_gpu() -> None:
    plan = place([mixed_node("mixed", [(MI300X, 4), (MI325X, 4)])])
    assert pools_by_gfx(plan) == {"gfx942": ("mixed",)}
    assert plan.pools[0].vram_gib_per_gpu == 192


def test_gfx_target_without_nodes_is_no_compatible_nodes() -> None:
    plan = place(FLEET, placement={"gfxTargets": ["gfx950", "gfx942"]})
    no_nodes = ("NoCompatibleNodes", "gfx950: no eligible nodes (no node has this gfx target)")
    assert skipped_by_gfx(plan)["gfx950"] == no_nodes
    assert list(pools_by_gfx(plan)) == ["gfx942"]


def test_cpu_node_never_hosts_a_pool() -> None:
    plan = place([cpu_node("cpu-0")], placement={"gfxTargets": ["gfx942"]})
    assert plan.pools == () and skipped_by_gfx(plan)["gfx942"][0] == "NoCompatibleNodes"


@pytest.mark.parametrize("taint", [UNHEALTHY, DRIVER_UPGRADE, DCM], ids=["unhealthy", "driver-upgrade", "dcm"])
@pytest.mark.parametrize(
    "tolerations",
    [[], [{"key": "dedicated", "operator": "Exists"}]],
    ids=["none", "another-key"],
)
def test_node_with_an_amd_transient_taint_never_gets_a_new_pool(
    taint: dict[str, str], tolerations: list[dict[str, str]]
) -> None:
    nodes = [homogeneous_node("sick", MI300X, 8, taints=[taint])]
    plan = place(nodes, placement={"gfxTargets": ["gfx942"], "tolerations": tolerations})
    reason, message = skipped_by_gfx(plan)["gfx942"]
    assert (plan.pools, reason) == ((), "NoCompatibleNodes")
    assert f"sick has taint {taint['key']}={taint['value']}:{taint['effect']}" in message


def test_cordoned_node_never_gets_a_new_pool() -> None:
    plan = place([homogeneous_node("drained", MI300X, 8, cordoned=True)])
    assert plan.pools == () and "drained is cordoned" in skipped_by_gfx(plan)["gfx942"][1]


@pytest.mark.parametrize(
    ("tolerations", "placed"),
    [
        ([], False),
        ([{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}], True),
        ([{"key": "dedicated", "value": "inference"}], True),
        ([{"key": "dedicated", "operator": "Exists"}], True),
        ([{"key": "dedicated", "operator": "Equal", "value": "training"}], False),
        ([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], False),
    ],
    ids=["untolerated", "equal", "default-operator-equal", "exists", "wrong-value", "wrong-effect"],
)
def test_user_taints_need_a_matching_toleration(tolerations: list[dict[str, str]], placed: bool) -> None:
    nodes = [homogeneous_node("dedicated", MI300X, 8, taints=[DEDICATED])]
    plan = place(nodes, placement={"gfxTargets": ["gfx942"], "tolerations": tolerations})
    assert bool(plan.pools) == placed


def test_prefer_no_schedule_taint_does_not_block() -> None:
    soft = {"key": "preferred", "value": "no", "effect": "PreferNoSchedule"}
    assert place([homogeneous_node("soft", MI300X, 8, taints=[soft])]).pools


PARTITIONED = [
    homogeneous_node("spx", MI300X, 8, partition="spx_nps1"),
    homogeneous_node("cpx", MI300X, 8, partition="cpx_nps4"),
    homogeneous_node("plain", MI300X, 8),
]


@pytest.mark.parametrize(
    ("partition", "nodes", "vram"),
    [(None, ("cpx", "plain", "spx"), 24), ("cpx_nps4", ("cpx",), 24), ("spx_nps1", ("spx",), 192)],
)
def test_partition_filter(partition: str | None, nodes: tuple[str, ...], vram: float) -> None:
    placement: dict[str, Any] = {"gfxTargets": ["gfx942"]}
    if partition:
        placement["partition"] = partition
    plan = place(PARTITIONED, placement=placement)
    assert pools_by_gfx(plan)["gfx942"] == nodes
    assert plan.pools[0].vram_gib_per_gpu == vram


def test_partition_that_no_node_has() -> None:
    plan = place(PARTITIONED[:1], placement={"gfxTargets": ["gfx942"], "partition": "cpx_nps4"})
    assert "spx partition is spx_nps1, not cpx_nps4" in skipped_by_gfx(plan)["gfx942"][1]


def test_node_selector_narrows_the_nodes() -> None:
    nodes = [
        homogeneous_node("zone-a", MI300X, 8, extra_labels={"topology.kubernetes.io/zone": "a"}),
        homogeneous_node("zone-b", MI300X, 8, extra_labels={"topology.kubernetes.io/zone": "b"}),
        homogeneous_node("no-zone", MI300X, 8),
    ]
    plan = place(nodes, placement={"gfxTargets": ["gfx942"], "nodeSelector": {"topology.kubernetes.io/zone": "a"}})
    assert pools_by_gfx(plan) == {"gfx942": ("zone-a",)}
    assert "zone-b lacks label topology.kubernetes.io/zone=a" in plan.pools[0].notes


def test_tp_larger_than_the_nodes_gpus() -> None:
    plan = place(FLEET, model={"tensorParallelSize": 8}, placement={"gfxTargets": ["gfx1100"]})
    reason, message = skipped_by_gfx(plan)["gfx1100"]
    assert reason == "NoCompatibleNodes"
    assert "w7900-0 has 4 GPUs, fewer than TP 8" in message


def test_target_that_does_not_fit_is_insufficient_memory_with_numbers() -> None:
    plan = place(FLEET, model={"name": "meta-llama/Llama-3.3-70B-Instruct"}, placement={"gfxTargets": ["gfx1100"]})
    reason, message = skipped_by_gfx(plan)["gfx1100"]
    assert reason == "InsufficientMemory"
    assert "target 130.4 GiB (70B params in name x 2 bytes) does not fit on gfx1100" in message
    assert "1 x 48 GiB with 20% KV headroom = 38.4 GiB for weights" in message


def test_70b_fits_on_mi250x_at_tp4_and_mi300x_at_tp2() -> None:
    nodes = [homogeneous_node("mi250x", MI250X, 8), homogeneous_node("mi300x", MI300X, 8)]
    for tp, gfx in ((4, "gfx90a"), (2, "gfx942")):
        plan = place(nodes, model={"name": "meta-llama/Llama-3.3-70B-Instruct", "tensorParallelSize": tp},
                     placement={"gfxTargets": [gfx]})
        assert [p.gfx for p in plan.pools] == [gfx]


def test_draft_model_falls_back_on_w7900_and_stays_on_mi300x() -> None:
    plan = place(
        FLEET,
        drafters=[drafter_wire("draft_model", "Qwen/Qwen2.5-14B-Instruct")],
        placement={"gfxTargets": ["gfx942", "gfx1100"]},
    )
    chosen = {p.gfx: (p.drafter.drafter and p.drafter.drafter.method, p.drafter.fallback) for p in plan.pools}
    assert chosen == {"gfx942": ("draft_model", False), "gfx1100": ("ngram", True)}


def test_unknown_target_size_is_a_problem_not_a_guess() -> None:
    plan = place(FLEET, model={"name": "my-org/house-model"})
    assert (plan.pools, plan.target_weights) == ((), None)
    assert plan.problems == (
        "cannot estimate the weights of 'my-org/house-model' from its name: set spec.model.weightsGib",
    )


GPU_NODES = [
    *(homogeneous_node(f"mi300x-{i}", MI300X, 8) for i in range(2)),
    *(homogeneous_node(f"mi250x-{i}", MI250X, 8) for i in range(2)),
    homogeneous_node("w7900-0", W7900, 4),
]


@pytest.mark.parametrize(
    ("placement", "tp", "replicas", "skipped"),
    [
        ({}, 8, {"gfx942": 1, "gfx90a": 1}, {}),
        ({"replicasPerPool": 2}, 8, {"gfx942": 2, "gfx90a": 2}, {}),
        ({"replicasPerPool": 5}, 8, {"gfx942": 2, "gfx90a": 2}, {}),
        ({"totalReplicas": 3}, 8, {"gfx942": 2, "gfx90a": 1}, {}),
        ({"totalReplicas": 2}, 8, {"gfx942": 2}, {"gfx90a": "NoReplicas"}),
        ({"totalReplicas": 9}, 4, {"gfx942": 4, "gfx90a": 4}, {}),
        ({"totalReplicas": 20}, 1, {"gfx942": 16, "gfx90a": 4}, {}),
    ],
    ids=["default-1", "per-pool-2", "per-pool-capped", "total-3", "total-fills-first", "total-over-capacity",
         "total-tp1"],
)
def test_replicas(placement: dict[str, int], tp: int, replicas: dict[str, int], skipped: dict[str, str]) -> None:
    plan = place(
        GPU_NODES,
        model={"name": "meta-llama/Llama-3.1-8B-Instruct", "tensorParallelSize": tp},
        placement={"gfxTargets": ["gfx942", "gfx90a"], **placement},
    )
    assert {p.gfx: p.replicas for p in plan.pools} == replicas
    assert {s.gfx: s.reason for s in plan.skipped} == skipped


def test_capped_replicas_are_noted() -> None:
    plan = place(GPU_NODES, model={"tensorParallelSize": 8}, placement={"gfxTargets": ["gfx942"], "replicasPerPool": 5})
    assert "replicasPerPool 5 capped to 2: 2 nodes hold 2 replicas at TP 8" in plan.pools[0].notes


@pytest.mark.parametrize(
    ("previous", "initial", "low", "high", "k"),
    [
        (None, 3, 0, 8, 3),
        (5, 3, 0, 8, 5),
        (10, 3, 0, 8, 8),
        (1, 3, 2, 8, 2),
        (0, 3, 0, 8, 0),
        (None, 0, 0, 0, 0),
        (4, 16, 16, 16, 16),
    ],
    ids=["new-pool", "keeps-tuned", "clamped-down", "clamped-up", "off-stays-off", "speculation-off", "pinned"],
)
def test_effective_k(previous: int | None, initial: int, low: int, high: int, k: int) -> None:
    assert effective_k(previous, initial, low, high) == k


def kubernetes_tolerates(taint: Taint, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """The scheduler's rule, for cross-checking placement against the pod it renders."""
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.effect:
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint.key:
                return True
        elif tol.get("key") == taint.key and tol.get("value", "") == taint.value:
            return True
    return False


GPU_TAINT = {"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"}
TAINTS = [Taint(**t) for t in (UNHEALTHY, DRIVER_UPGRADE, DCM, DEDICATED, GPU_TAINT)]


@pytest.mark.parametrize(
    "tolerations",
    [
        [],
        [{"key": "dedicated", "operator": "Exists"}],
        [{"key": "dedicated", "value": "inference"}],
        [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
         {"key": "dedicated", "operator": "Exists"}],
    ],
    ids=["none", "dedicated", "dedicated-equal", "gpu-taint-and-dedicated"],
)
def test_placement_and_the_rendered_pod_agree_on_every_taint(tolerations: list[dict[str, str]]) -> None:
    model = spec(placement={"gfxTargets": ["gfx942"], "tolerations": tolerations})
    rendered = render_tolerations(model)
    for taint in TAINTS:
        assert tolerates(taint, model.placement.tolerations) == kubernetes_tolerates(taint, rendered), taint


def test_gpu_nodes_tainted_with_the_gpu_resource_get_pools_without_a_user_toleration() -> None:
    """The taint that keeps non-GPU workloads off GPU nodes; runtime pods tolerate it by default."""
    nodes = [homogeneous_node("reserved", MI300X, 8, taints=[GPU_TAINT])]
    assert [pool.nodes for pool in place(nodes).pools] == [("reserved",)]
    assert kubernetes_tolerates(Taint(**GPU_TAINT), render_tolerations(spec()))
    no_execute = Taint(key="amd.com/gpu", value="present", effect="NoExecute")
    assert not tolerates(no_execute, []), "only the NoSchedule taint is tolerated by default"


def render_tolerations(model: SpeculativeModelSpec) -> list[dict[str, Any]]:
    ctx = PoolIdentity("ns", "m", "uid", "m-gfx942", "gfx942")
    template = pod_template(ctx, model, RuntimePlan("img", {}, "ROCM_AITER_FA"), PoolTrack("stable", 3, "cm"))
    return list(template["spec"].get("tolerations", []))


@pytest.mark.parametrize(
    ("existing", "kept"), [((), False), (("gfx942",), True), (("gfx90a",), False)], ids=["new", "existing", "other"]
)
def test_an_existing_pool_survives_a_transient_taint_a_new_one_is_not_created(
    existing: tuple[str, ...], kept: bool
) -> None:
    nodes = [homogeneous_node("upgrading", MI300X, 8, taints=[DRIVER_UPGRADE])]
    plan = plan_placement(spec(), nodes, KV_HEADROOM, existing_pools=existing)
    assert bool(plan.pools) == kept
    if kept:
        assert "upgrading has taint amd-gpu-driver-upgrade=true:NoSchedule" in plan.pools[0].notes


def test_an_existing_pool_with_every_node_tainted_keeps_the_slots_of_its_label_matching_nodes() -> None:
    nodes = [homogeneous_node(f"upgrading-{i}", MI300X, 8, taints=[DRIVER_UPGRADE]) for i in range(2)]
    plan = plan_placement(spec(model={"tensorParallelSize": 4}, placement={"replicasPerPool": 9}), nodes,
                          KV_HEADROOM, existing_pools=("gfx942",))
    pool = plan.pools[0]
    assert (pool.nodes, pool.slots, pool.replicas) == (("upgrading-0", "upgrading-1"), 4, 4)


def test_a_partly_tainted_fleet_counts_only_its_schedulable_nodes_for_an_existing_pool_too() -> None:
    nodes = [homogeneous_node("healthy", MI300X, 8), homogeneous_node("sick", MI300X, 8, taints=[UNHEALTHY])]
    plan = plan_placement(spec(model={"tensorParallelSize": 8}, placement={"replicasPerPool": 2}), nodes,
                          KV_HEADROOM, existing_pools=("gfx942",))
    assert (plan.pools[0].nodes, plan.pools[0].replicas) == (("healthy",), 1)


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({"replicasPerPool": 0}, "gfx942: replicasPerPool is 0"),
        ({"totalReplicas": 0}, "gfx942: totalReplicas is 0"),
    ],
)
def test_zero_replicas_is_no_replicas_and_says_why(placement: dict[str, int], message: str) -> None:
    plan = place(FLEET, placement={"gfxTargets": ["gfx942"], **placement})
    assert plan.pools == ()
    assert skipped_by_gfx(plan) == {"gfx942": ("NoReplicas", message)}


def test_total_replicas_used_up_by_earlier_pools_says_so() -> None:
    placement = {"gfxTargets": ["gfx942", "gfx90a"], "totalReplicas": 2}
    plan = place(GPU_NODES, model={"tensorParallelSize": 8}, placement=placement)
    message = "gfx90a: all 2 of totalReplicas are placed on earlier pools"
    assert skipped_by_gfx(plan)["gfx90a"] == ("NoReplicas", message)


def test_a_mixed_node_with_an_unlisted_device_is_excluded_by_name_from_the_pool_it_could_reach() -> None:
    odd = mixed_node("odd", [(MI300X, 4), (UNLISTED, 4)])
    plan = place([*HEALTHY_FLEET, odd], placement={"gfxTargets": ["gfx942", "gfx90a"]})
    excluded = {pool.gfx: pool.excluded_nodes for pool in plan.pools}
    assert excluded == {"gfx942": ("odd",), "gfx90a": ()}
    assert "odd" not in plan.pools[0].nodes
    ctx = PoolIdentity("ns", "m", "uid", "m-gfx942", "gfx942")
    template = pod_template(ctx, spec(), RuntimePlan("img", {}, "ROCM_AITER_FA"), PoolTrack("stable", 3, "cm"),
                            targeting=NodeTargeting(excluded_nodes=plan.pools[0].excluded_nodes))
    terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert all(term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["odd"]}]
               for term in terms)
