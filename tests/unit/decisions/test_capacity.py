"""Free GPUs from pod claims, and the rollout mode they allow."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec_operator.canary.plan import ServingReplicas, in_place_canary_size
from specdec_operator.decisions.capacity import FleetClaims, GpuUsage, PoolRoom, choose_mode, gpu_usage, pool_room
from specdec_operator.decisions.placement import plan_placement
from specdec_operator.gpu.inventory import PodGpus
from tests.unit.api.specfactories import spec
from tests.unit.gpu.gpufactories import MI300X, homogeneous_node

NODES = [homogeneous_node(f"mi300x-{i}", MI300X, 8, partition="spx_nps1") for i in range(2)]
MODEL = "inference/llama8b"


def claim(name: str, gpus: int, node: str | None, model: str | None = None, why: str | None = None) -> PodGpus:
    return PodGpus("inference", name, gpus, node, model, "llama8b-gfx942" if model else None, why)


def test_usage_splits_own_pods_from_everyone_elses_and_ignores_unbound_ones() -> None:
    usage = gpu_usage([
        claim("mine-a", 8, "mi300x-0", MODEL),
        claim("trainer", 4, "mi300x-1"),
        claim("notebook", 2, "mi300x-1"),
        claim("other-model", 8, None, "inference/other", "0/2 nodes are available"),
        claim("mine-pending", 8, None, MODEL, "0/2 nodes are available"),
    ], MODEL)
    assert usage.own == {"mi300x-0": 8}
    assert usage.others == {"mi300x-1": 6}
    assert [p.name for p in usage.unscheduled] == ["mine-pending"]
    assert [usage.available_to_model(n) for n in NODES] == [8, 2]
    assert [usage.free_now(n) for n in NODES] == [0, 2]


def _usage_by_scanning_every_pod(pods: list[PodGpus], model: str) -> GpuUsage:
    """The definition, one pass over the whole fleet per model: what FleetClaims must equal."""
    others: dict[str, int] = {}
    own: dict[str, int] = {}
    for pod in pods:
        if pod.node is not None:
            held = own if pod.model_key == model else others
            held[pod.node] = held.get(pod.node, 0) + pod.gpus
    stuck = sorted((p for p in pods if p.node is None and p.model_key == model and p.unschedulable),
                   key=lambda p: p.name)
    return GpuUsage(others, own, tuple(stuck))


@given(st.lists(st.builds(
    claim, name=st.text("abc", min_size=1, max_size=3), gpus=st.integers(0, 8),
    node=st.sampled_from([None, "mi300x-0", "mi300x-1", "mi300x-2"]),
    model=st.sampled_from([None, MODEL, "inference/other"]), why=st.sampled_from([None, "0/2 nodes are available"]),
), max_size=30))
def test_fleet_claims_built_once_give_every_model_what_a_scan_of_every_pod_gives(pods: list[PodGpus]) -> None:
    claims = FleetClaims.of(pods)
    for model in (MODEL, "inference/other", "inference/absent"):
        shared, scanned = claims.usage(model), _usage_by_scanning_every_pod(pods, model)
        assert shared.own == scanned.own
        assert {n: g for n, g in shared.others.items() if g} == {n: g for n, g in scanned.others.items() if g}
        assert sorted(p.name for p in shared.unscheduled) == sorted(p.name for p in scanned.unscheduled)
        assert [shared.free_now(n) for n in NODES] == [scanned.free_now(n) for n in NODES]


def test_pool_room_counts_whole_replicas_per_node() -> None:
    usage = gpu_usage([claim("trainer-a", 4, "mi300x-0"), claim("trainer-b", 4, "mi300x-1")], MODEL)
    room = pool_room("gfx942", NODES, usage, tp=8)
    # 8 GPUs are free, but 4 on each node: no TP8 replica fits anywhere.
    assert (room.free_gpus, room.free_slots, room.allocatable_gpus) == (8, 0, 16)
    assert pool_room("gfx942", NODES, usage, tp=4).free_slots == 2


ROOMY = PoolRoom("gfx942", 3, 24, 8, 1, 8)
FULL = PoolRoom("gfx942", 2, 16, 0, 0, 8)


@pytest.mark.parametrize(("room", "need", "surge", "unavailable", "canary", "expected"), [
    (ROOMY, 1, 1, 1, False, ("Surge", 1, 0)),
    (ROOMY, 1, 3, 1, False, ("Surge", 1, 0)),  # free slots cap the surge
    (FULL, 1, 1, 1, False, ("InPlace", 0, 1)),
    (FULL, 1, 1, 2, False, ("InPlace", 0, 2)),
    (ROOMY, 1, 0, 1, False, ("InPlace", 0, 1)),  # maxSurge 0 always replaces in place
    (FULL, 1, 1, 0, False, ("Surge", 1, 0)),  # maxUnavailable 0: waits for free GPUs
    (ROOMY, 3, 1, 1, True, ("InPlace", 0, 1)),  # a canary needs all of its extra replicas free
    (PoolRoom("gfx942", 5, 40, 24, 3, 8), 3, 1, 1, True, ("Surge", 1, 0)),
])
def test_choose_mode(
    room: PoolRoom, need: int, surge: int, unavailable: int, canary: bool, expected: tuple[str, int, int]
) -> None:
    mode = choose_mode(room, need, surge, unavailable, canary)
    assert (mode.mode, mode.max_surge, mode.max_unavailable) == expected
    assert f"{room.free_gpus} of {room.allocatable_gpus} gfx942 GPUs on {room.nodes} nodes are free" in mode.reason


@pytest.mark.parametrize(("total", "target", "serving", "budget", "size"), [
    (2, 1, ServingReplicas(2, 0, 0), 1, 1),  # first canary replica replaces one stable replica
    (4, 4, ServingReplicas(4, 0, 0), 1, 1),  # one at a time ...
    (4, 4, ServingReplicas(3, 1, 1), 1, 2),  # ... once the previous one is ready
    (4, 4, ServingReplicas(3, 0, 1), 1, 1),  # the new canary replica is not ready yet: wait
    (4, 4, ServingReplicas(4, 0, 0), 2, 2),  # a larger budget moves two at once
    (2, 0, ServingReplicas(0, 2, 2), 1, 1),  # promotion hands one replica back to the stable set
    (2, 0, ServingReplicas(1, 1, 1), 1, 0),  # and the last once the new stable replica is ready
    (2, 0, ServingReplicas(0, 1, 1), 1, 1),  # the new stable replica is not ready: keep the canary
])
def test_in_place_canary_size(total: int, target: int, serving: ServingReplicas, budget: int, size: int) -> None:
    assert in_place_canary_size(total, target, serving, budget) == size


def test_in_place_canary_size_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_unavailable"):
        in_place_canary_size(2, 3, ServingReplicas(2, 0, 0), 1)


def test_placement_does_not_count_the_models_own_pods_as_competitors() -> None:
    model = spec(model={"tensorParallelSize": 8}, placement={"gfxTargets": ["gfx942"], "replicasPerPool": 2})
    usage = gpu_usage([claim("mine-a", 8, "mi300x-0", MODEL), claim("mine-b", 8, "mi300x-1", MODEL)], MODEL)
    plan = plan_placement(model, NODES, 0.1, usage=usage)
    assert plan.pools[0].replicas == 2 and plan.pools[0].shortfall is None


def test_placement_sizes_by_gpus_other_workloads_leave() -> None:
    model = spec(model={"tensorParallelSize": 8}, placement={"gfxTargets": ["gfx942"], "replicasPerPool": 2})
    usage = gpu_usage([claim("trainer", 1, "mi300x-1")], MODEL)
    plan = plan_placement(model, NODES, 0.1, usage=usage)
    assert plan.pools[0].replicas == 1
    assert plan.pools[0].shortfall == ("gfx942: 1 of 2 replicas fit: 2 at TP 8 need 16 GPUs, but other models and "
                                       "workloads hold 1 of the 16 GPUs on 2 nodes")


def test_placement_without_usage_is_unchanged() -> None:
    model = spec(model={"tensorParallelSize": 8}, placement={"gfxTargets": ["gfx942"], "replicasPerPool": 3})
    plan = plan_placement(model, NODES, 0.1, usage=GpuUsage())
    # Capped by the fleet's size, not by anyone's pods: no shortfall, the existing note says why.
    assert plan.pools[0].replicas == 2 and plan.pools[0].shortfall is None
    assert any("capped to 2" in note for note in plan.pools[0].notes)
