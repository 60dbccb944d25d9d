"""Placement over an adapted discovery: product aliases in gfxTargets, partition resources, the device table
setting, and what status shows of them."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.vocabulary import GFX_PRODUCTS, GFX_TARGETS, GfxProduct, GfxTargetOrProduct, gfx_of
from specdec_operator.decisions.placement import plan_placement
from specdec_operator.decisions.runtime_env import RuntimePlan
from specdec_operator.gpu.devices import BUILTIN_DEVICES, GpuDevice
from specdec_operator.gpu.inventory import node_gpus
from specdec_operator.render.pool import NodeTargeting, PoolIdentity, PoolTrack, pod_template
from tests.unit.api.specfactories import spec, spec_wire
from tests.unit.gpu.gpufactories import MI250X, MI300X, W7900, Card, base_labels, homogeneous_labels, homogeneous_node
from tests.unit.render.test_affinity import affinity_matches

FLEET = [
    *(homogeneous_node(f"mi300x-{i}", MI300X, 8) for i in range(2)),
    homogeneous_node("mi250x-0", MI250X, 8),
    homogeneous_node("w7900-0", W7900, 4),
]


@pytest.mark.parametrize(("alias", "gfx"), sorted(GFX_PRODUCTS.items()))
def test_every_product_alias_names_a_supported_target_that_the_device_table_agrees_with(alias: str, gfx: str) -> None:
    assert gfx in GFX_TARGETS
    products = {p.lower().replace(" ", "").replace("radeonpro", "").replace("radeonaipro", "")
                for p in BUILTIN_DEVICES.products_for_gfx(gfx)}
    assert alias in products, (alias, products)


@pytest.mark.parametrize(("targets", "pools"), [
    (["mi300x"], ["gfx942"]),
    (["mi250x", "w7900"], ["gfx90a", "gfx1100"]),
    (["w7900", "gfx942"], ["gfx1100", "gfx942"]),
])
def test_product_aliases_place_pools_on_their_gfx_target(targets: list[str], pools: list[str]) -> None:
    plan = plan_placement(spec(placement={"gfxTargets": targets, "replicasPerPool": 1}), FLEET, 0.2)
    assert [pool.gfx for pool in plan.pools] == pools
    for pool, target in zip(plan.pools, targets, strict=True):
        assert pool.requested_as == (target,)
    assert plan.pools[0].products


def test_status_shows_the_products_found_on_the_pool_nodes() -> None:
    plan = plan_placement(spec(placement={"gfxTargets": ["mi300x"]}), FLEET, 0.2)
    assert plan.pools[0].products == ("MI300X",)


@pytest.mark.parametrize("targets", [["mi300x", "gfx942"], ["mi300x", "mi325x"], ["w7900", "w7800"]])
def test_two_entries_naming_one_target_are_refused(targets: list[str]) -> None:
    with pytest.raises(ValidationError, match="must not repeat a target"):
        spec(placement={"gfxTargets": targets})


def test_an_unknown_product_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="gfxTargets"):
        SpeculativeModelSpec.model_validate(spec_wire(placement={"gfxTargets": ["mi999x"]}))


def test_the_admitted_names_are_the_gfx_targets_and_the_product_aliases() -> None:
    assert set(get_args(GfxTargetOrProduct)) == {*GFX_TARGETS, *GFX_PRODUCTS}
    assert set(get_args(GfxProduct)) == set(GFX_PRODUCTS)


def test_gfx_of_leaves_gfx_names_alone() -> None:
    assert gfx_of("gfx942") == "gfx942" and gfx_of("mi355x") == "gfx950"


def _template(plan_index: int, model: SpeculativeModelSpec, nodes: list, **kwargs: object) -> dict:  # type: ignore[type-arg]
    plan = plan_placement(model, nodes, 0.2, **kwargs)  # type: ignore[arg-type]
    pool = plan.pools[plan_index]
    runtime = RuntimePlan(image="img", env={}, attention_backend="TRITON_ATTN")
    targeting = NodeTargeting(pool.excluded_nodes, pool.gpu_resource,
                              kwargs.get("devices", BUILTIN_DEVICES))  # type: ignore[arg-type]
    return pod_template(PoolIdentity("ns", "m", "uid", "m-gfx942", pool.gfx), model, runtime,
                        PoolTrack("stable", 3, "cm"), targeting=targeting)


def test_a_partitioned_node_of_the_mixed_strategy_gets_pods_requesting_its_partition_resource() -> None:
    nodes = [node_gpus(f"cpx-{i}", {**base_labels(f"cpx-{i}"), **homogeneous_labels(MI300X, 8)},
                       {"amd.com/cpx_nps4": "64"}) for i in range(2)]
    model = spec(placement={"gfxTargets": ["mi300x"], "partition": "cpx_nps4"})
    plan = plan_placement(model, nodes, 0.2)
    assert plan.pools[0].gpu_resource == "amd.com/cpx_nps4" and plan.pools[0].slots == 128
    template = _template(0, model, nodes)
    resources = template["spec"]["containers"][0]["resources"]
    assert resources["limits"]["amd.com/cpx_nps4"] == "1" and "amd.com/gpu" not in resources["limits"]
    # The resource pins the partition: a node without a partition label still matches.
    assert affinity_matches(template["spec"]["affinity"], nodes[0].labels, nodes[0].name)


def test_a_pool_whose_nodes_offer_different_resources_uses_one_and_says_which_nodes_it_leaves() -> None:
    nodes = [node_gpus("single", {**base_labels("single"), **homogeneous_labels(MI300X, 8)}, {"amd.com/gpu": "8"}),
             node_gpus("cpx", {**base_labels("cpx"), **homogeneous_labels(MI300X, 8)}, {"amd.com/cpx_nps4": "64"})]
    plan = plan_placement(spec(placement={"gfxTargets": ["gfx942"]}), nodes, 0.2)
    assert plan.pools[0].gpu_resource == "amd.com/cpx_nps4" and plan.pools[0].nodes == ("cpx",)
    assert "single offers amd.com/gpu, the pool requests amd.com/cpx_nps4" in plan.pools[0].notes


def test_a_device_from_the_setting_places_a_pool_and_renders_an_affinity_that_admits_its_nodes() -> None:
    custom = Card("7fff", "Custom_Accelerator", "96G", "AI", 100, 400)
    table = BUILTIN_DEVICES.merged([GpuDevice("7fff", "Custom", "gfx942", 96)])
    nodes = [node_gpus("c", {**base_labels("c"), **homogeneous_labels(custom, 4)}, {"amd.com/gpu": "4"},
                       devices=table)]
    model = spec(placement={"gfxTargets": ["gfx942"]})
    assert not plan_placement(model, [node_gpus("c", nodes[0].labels, {"amd.com/gpu": "4"})], 0.2).pools
    plan = plan_placement(model, nodes, 0.2, devices=table)
    assert plan.pools[0].products == ("Custom",)
    template = _template(0, model, nodes, devices=table)
    assert affinity_matches(template["spec"]["affinity"], nodes[0].labels, "c")
