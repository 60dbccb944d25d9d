"""plan.evaluate end to end on ObservedModels built from real-looking node facts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from specdec_operator.reconcile.plan import KEPT_OLD_CONFIG_MAPS, ReconcilePlan, evaluate
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.gpu.gpufactories import MI300X, UNHEALTHY, homogeneous_node
from tests.unit.reconcile.reconcilefactories import (
    SETTINGS,
    T0,
    T1,
    T2,
    condition,
    kinds_and_names,
    live,
    live_children,
    observed,
    status_wire,
)

EAGLE3 = drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
THREE_POOLS = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942", "gfx90a", "gfx1100"]})


def reasons(plan: ReconcilePlan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in plan.events]


def settle(spec: dict[str, object]) -> tuple[ReconcilePlan, ReconcilePlan]:
    """First reconcile creates everything; the second sees it all live and ready."""
    first = evaluate(observed(spec), SETTINGS, T0)
    second = evaluate(observed(spec, status=status_wire(first), children=live_children(first)), SETTINGS, T1)
    return first, second


def test_first_reconcile_creates_a_pool_per_gfx_target_and_one_service() -> None:
    plan = evaluate(observed(THREE_POOLS), SETTINGS, T0)
    pools = ["llama8b-gfx942", "llama8b-gfx90a", "llama8b-gfx1100"]
    assert [p.name for p in plan.pools] == pools
    kinds = [(kind, name) for kind, name in kinds_and_names(plan.apply) if kind != "ConfigMap"]
    assert kinds == sorted(
        [("Service", "llama8b")] + [(kind, pool) for pool in pools for kind in ("Deployment", "PodDisruptionBudget")]
    )
    assert sum(kind == "ConfigMap" for kind, _ in kinds_and_names(plan.apply)) == 3
    assert plan.delete == [] and plan.invalid_spec is None
    assert condition(plan, "Ready")[:2] == ("False", "RolloutInProgress")
    assert condition(plan, "Progressing")[:2] == ("True", "NewRevision")
    assert condition(plan, "Degraded")[:2] == ("False", "AsExpected")
    assert reasons(plan) == [("Normal", "PoolPlaced"), ("Normal", "DrafterSelected")] * 3


def test_pool_status_and_summary() -> None:
    plan = evaluate(observed(THREE_POOLS), SETTINGS, T0)
    status = status_wire(plan)
    gfx942 = status["pools"][0]
    assert (gfx942["gfxTarget"], gfx942["effectiveK"], gfx942["replicas"], gfx942["readyReplicas"]) == (
        "gfx942", 3, 1, 0
    )
    assert gfx942["drafter"]["method"] == "eagle3" and gfx942["drafter"]["fallback"] is False
    assert gfx942["image"].endswith("-cdna") and status["pools"][2]["image"].endswith("-rdna3")
    assert status["summary"] == {
        "drafter": "eagle3",
        "effectiveK": "gfx942=3,gfx90a=3,gfx1100=3",
        "acceptance": "",
        "pools": 3,
        "canary": "",
    }
    assert status["observedGeneration"] == 1


def test_placement_lands_on_the_right_nodes() -> None:
    plan = evaluate(observed(THREE_POOLS), SETTINGS, T0)
    nodes = {p.plan.gfx: p.plan.nodes for p in plan.pools}
    assert nodes["gfx90a"] == ("mi250x-0", "mi250x-1")
    assert nodes["gfx1100"] == ("w7900-0", "w7900-1")
    assert {"mi300x-0", "mixed-gfx942"} <= set(nodes["gfx942"])
    assert not {"cpu-0", "mixed-rdna3"} & {n for pool in nodes.values() for n in pool}


def test_once_live_and_ready_the_model_is_ready_without_writes_and_stays_quiet() -> None:
    first, second = settle(THREE_POOLS)
    assert (second.apply, second.delete, second.events) == ([], [], [])
    assert condition(second, "Ready")[:2] == ("True", "PoolsReady")
    assert condition(second, "Progressing")[:2] == ("False", "RolloutComplete")
    third = evaluate(
        observed(THREE_POOLS, status=status_wire(second), children=live_children(first)), SETTINGS, T2
    )
    assert (third.apply, third.delete, third.events) == ([], [], [])
    assert status_wire(third) == status_wire(second)  # nothing to write: the status did not change


def test_last_transition_time_is_kept_while_a_condition_holds() -> None:
    _, second = settle(THREE_POOLS)
    assert second.status is not None
    times = {c.type: c.last_transition_time for c in second.status.conditions}
    assert times == {"Ready": T1, "Progressing": T1, "Degraded": T0, "Reduced": T0, "WeightsCached": T0}


def test_a_manual_edit_of_an_owned_deployment_is_reapplied() -> None:
    first = evaluate(observed(THREE_POOLS), SETTINGS, T0)
    children = live_children(first)
    edited = next(c for c in children if c["kind"] == "Deployment")
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:latest"
    plan = evaluate(observed(THREE_POOLS, status=status_wire(first), children=children), SETTINGS, T1)
    assert kinds_and_names(plan.apply) == [("Deployment", edited["metadata"]["name"])]


def test_invalid_spec_sets_invalid_spec_posts_a_warning_and_writes_nothing() -> None:
    bad = spec_wire(speculation={"minK": 5, "maxK": 2, "initialK": 3})
    plan = evaluate(observed(bad), SETTINGS, T0)
    message = "spec.speculation.minK must be <= spec.speculation.maxK"
    assert (plan.apply, plan.delete, plan.invalid_spec) == ([], [], message)
    assert condition(plan, "Ready") == ("False", "InvalidSpec", message)
    assert condition(plan, "Degraded") == ("True", "InvalidSpec", message)
    assert [(e.type, e.reason, e.message) for e in plan.events] == [("Warning", "InvalidSpec", message)]


def test_invalid_spec_keeps_the_previous_pools_and_children() -> None:
    first, second = settle(THREE_POOLS)
    bad = spec_wire(drafters=[drafter_wire("eagle3")])
    plan = evaluate(observed(bad, status=status_wire(second), children=live_children(first)), SETTINGS, T2)
    assert plan.delete == [] and plan.apply == []
    assert len(status_wire(plan)["pools"]) == 3
    assert condition(plan, "Ready")[1] == "InvalidSpec"


def test_conflicting_visible_devices_are_an_invalid_spec() -> None:
    env = [{"name": "HIP_VISIBLE_DEVICES", "value": "0"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "1"}]
    plan = evaluate(observed(spec_wire(runtime={"env": env})), SETTINGS, T0)
    assert plan.invalid_spec is not None and plan.invalid_spec.startswith("spec.runtime.env:")
    assert plan.apply == []


def test_gfx_target_without_nodes_is_not_ready_no_compatible_nodes_and_warns_once() -> None:
    nowhere = spec_wire(placement={"gfxTargets": ["gfx950"]})
    first = evaluate(observed(nowhere), SETTINGS, T0)
    assert (first.apply, first.delete) == ([], [])
    status, reason, message = condition(first, "Ready")
    assert (status, reason) == ("False", "NoCompatibleNodes")
    assert "gfx950: no eligible nodes" in message
    assert reasons(first) == [("Warning", "NoCompatibleNodes")]
    again = evaluate(observed(nowhere, status=status_wire(first)), SETTINGS, T1)
    assert again.events == [] and status_wire(again) == status_wire(first)


def test_target_too_big_everywhere_is_insufficient_memory_with_numbers() -> None:
    huge = spec_wire(model={"name": "meta-llama/Llama-3.1-405B-Instruct"}, placement={"gfxTargets": ["gfx1100"]})
    plan = evaluate(observed(huge), SETTINGS, T0)
    status, reason, message = condition(plan, "Ready")
    assert (status, reason) == ("False", "InsufficientMemory")
    assert "754.4 GiB" in message and "38.4 GiB for weights" in message


def test_drafter_fallback_is_reduced_not_degraded_with_numbers_and_a_warning_event() -> None:
    """A fallback drafter serves: Reduced says so with the numbers, Degraded stays False (issue 22)."""
    model = spec_wire(
        drafters=[drafter_wire("draft_model", "Qwen/Qwen2.5-14B-Instruct")],
        placement={"gfxTargets": ["gfx942", "gfx1100"]},
    )
    plan = evaluate(observed(model), SETTINGS, T0)
    drafters = {p["gfxTarget"]: (p["drafter"]["method"], p["drafter"]["fallback"]) for p in status_wire(plan)["pools"]}
    assert drafters == {"gfx942": ("draft_model", False), "gfx1100": ("ngram", True)}
    status, reason, message = condition(plan, "Reduced")
    assert (status, reason) == ("True", "DrafterFallback")
    assert "llama8b-gfx1100" in message and "= 41.0 GiB > 38.4 GiB" in message
    assert condition(plan, "Degraded")[:2] == ("False", "AsExpected")
    assert ("Warning", "DrafterFallback") in reasons(plan)


def test_a_spec_change_rolls_and_reverting_returns_the_old_revision() -> None:
    first, second = settle(THREE_POOLS)
    revisions = {p.name: p.revision for p in first.pools}
    changed_spec = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942", "gfx90a", "gfx1100"]},
                             model={"maxModelLen": 8192})
    changed = evaluate(
        observed(changed_spec, status=status_wire(second), children=live_children(first), generation=2), SETTINGS, T2
    )
    assert all(p.revision != revisions[p.name] for p in changed.pools)
    assert {kind for kind, _ in kinds_and_names(changed.apply)} == {"ConfigMap", "Deployment"}
    assert reasons(changed).count(("Normal", "RevisionChanged")) == 3
    assert condition(changed, "Progressing")[:2] == ("True", "NewRevision")
    reverted = evaluate(observed(THREE_POOLS, status=status_wire(changed), generation=3), SETTINGS, T2)
    assert {p.name: p.revision for p in reverted.pools} == revisions


@pytest.mark.parametrize(
    ("previous_k", "speculation", "k"),
    [(5, {"maxK": 8}, 5), (7, {"maxK": 4}, 4), (0, {"minK": 2}, 2)],
    ids=["tuned-k-kept", "clamped-to-new-max", "clamped-to-new-min"],
)
def test_effective_k_survives_reconciles_within_the_bounds(
    previous_k: int, speculation: dict[str, int], k: int
) -> None:
    first, _ = settle(THREE_POOLS)
    previous = status_wire(first)
    for pool in previous["pools"]:
        pool["effectiveK"] = previous_k
    model = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942", "gfx90a", "gfx1100"]},
                      speculation={"initialK": speculation.get("minK", 3), **speculation})
    plan = evaluate(observed(model, status=previous), SETTINGS, T1)
    assert {p.k for p in plan.pools} == {k}


def test_a_k_decision_recorded_in_status_is_what_gets_rendered() -> None:
    first, second = settle(THREE_POOLS)
    recorded = status_wire(second)
    next(p for p in recorded["pools"] if p["name"] == "llama8b-gfx90a")["effectiveK"] = 6
    plan = evaluate(observed(THREE_POOLS, status=recorded, children=live_children(first)), SETTINGS, T2)
    assert {p.name: p.k for p in plan.pools} == {"llama8b-gfx942": 3, "llama8b-gfx90a": 6, "llama8b-gfx1100": 3}
    [deployment] = [o for o in plan.apply if o["kind"] == "Deployment"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert deployment["metadata"]["name"] == "llama8b-gfx90a" and annotations[contract.ANNOTATION_K] == "6"


def test_stale_children_are_deleted_but_the_two_newest_old_config_maps_are_kept() -> None:
    first, second = settle(THREE_POOLS)
    children = live_children(first)
    gfx942_cm = next(c for c in first.apply if c["kind"] == "ConfigMap" and "gfx942" in c["metadata"]["name"])
    old_config_maps = []
    for index, created in enumerate(["2026-11-01T00:00:00Z", "2026-11-03T00:00:00Z", "2026-11-02T00:00:00Z",
                                     "2026-11-04T00:00:00Z"]):
        old = live(gfx942_cm, created=created)
        old["metadata"]["name"] = f"llama8b-gfx942-old{index}"
        old_config_maps.append(old)
    only_942 = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942"]})
    plan = evaluate(observed(only_942, status=status_wire(second), children=children + old_config_maps), SETTINGS, T2)
    deleted = sorted(plan.delete)
    removed_pools = [
        (kind, name) for kind, name in kinds_and_names(children)
        if "gfx90a" in name or "gfx1100" in name
    ]
    # old3 and old1 are the two newest of the pool's four old ConfigMaps (old2 was created before old1).
    oldest_two = [("ConfigMap", "llama8b-gfx942-old0"), ("ConfigMap", "llama8b-gfx942-old2")]
    assert KEPT_OLD_CONFIG_MAPS == 2
    assert deleted == sorted([*removed_pools, *oldest_two])
    assert plan.apply == []
    assert sorted(e.reason for e in plan.events) == ["PoolRemoved", "PoolRemoved"]


def test_the_service_goes_when_no_pool_is_left() -> None:
    first, second = settle(THREE_POOLS)
    nowhere = spec_wire(placement={"gfxTargets": ["gfx950"]})
    plan = evaluate(observed(nowhere, status=status_wire(second), children=live_children(first)), SETTINGS, T2)
    assert ("Service", "llama8b") in plan.delete
    assert {kind for kind, _ in plan.delete} == {"Service", "Deployment", "PodDisruptionBudget", "ConfigMap"}


def test_empty_node_inventory_holds_existing_pools() -> None:
    first, second = settle(THREE_POOLS)
    plan = evaluate(observed(THREE_POOLS, nodes=[], status=status_wire(second), children=live_children(first)),
                    SETTINGS, T2)
    assert (plan.apply, plan.delete) == ([], [])
    assert condition(plan, "Ready")[:2] == ("Unknown", "NodeInventoryEmpty")
    assert len(status_wire(plan)["pools"]) == 3


def test_an_unreadable_status_field_holds_everything_and_names_the_field() -> None:
    first, second = settle(THREE_POOLS)
    stored = status_wire(second)
    stored["speculation"]["lastDecision"] = {"time": "yesterday", "pool": "llama8b-gfx942", "fromK": 3, "toK": 4,
                                             "action": "Change", "reason": "edited by hand"}
    for pool in stored["pools"]:
        pool["effectiveK"] = 4  # would roll every pool if the status were acted on
    plan = evaluate(observed(THREE_POOLS, status=stored, children=live_children(first)), SETTINGS, T2)
    assert (plan.apply, plan.delete, plan.pools) == ([], [], [])
    assert plan.status_unreadable == ("status.speculation.lastDecision.time: 'yesterday' is not an RFC 3339 time",)
    status, reason, message = condition(plan, "Degraded")
    assert (status, reason) == ("True", "StatusUnreadable") and "status.speculation.lastDecision.time" in message
    assert reasons(plan) == [("Warning", "StatusUnreadable")]
    kept = status_wire(plan)
    # Everything that parsed is kept as stored, K included; only the unreadable field is left out of the model.
    assert [p["effectiveK"] for p in kept["pools"]] == [4, 4, 4]
    assert kept["pools"] == stored["pools"] and kept["summary"] == stored["summary"]


def test_one_bad_top_level_field_keeps_the_others() -> None:
    from specdec_operator.reconcile.plan import read_status

    _, second = settle(THREE_POOLS)
    stored = {**status_wire(second), "canary": {"pool": "x", "phase": "Sideways"}}
    read = read_status(stored)
    assert len(read.status.pools) == 3 and read.status.canary is None
    assert {problem.split(":")[0] for problem in read.problems} == {
        "status.canary.stableRevision", "status.canary.canaryRevision", "status.canary.phase",
        "status.canary.stepStartedAt"}


def test_pods_of_every_pool_select_the_service_and_use_the_pool_configmap() -> None:
    plan = evaluate(observed(THREE_POOLS), SETTINGS, T0)
    service = next(o for o in plan.apply if o["kind"] == "Service")
    config_maps = {o["metadata"]["name"] for o in plan.apply if o["kind"] == "ConfigMap"}
    for pool in plan.pools:
        template = pool.deployment["spec"]["template"]
        assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME)
        assert volume["configMap"]["name"] in config_maps


def test_a_fleet_of_only_unhealthy_nodes_gets_no_pool() -> None:
    nodes = [homogeneous_node("mi300x-0", MI300X, 8, taints=[UNHEALTHY])]
    plan = evaluate(observed(spec_wire(), nodes=nodes), SETTINGS, T0)
    assert plan.pools == [] and condition(plan, "Ready")[1] == "NoCompatibleNodes"


def steady_writes_when_the_server_rewrites(
    spec: dict[str, object], rewrite: Callable[[dict[str, Any]], None]
) -> list[tuple[str, str]]:
    first = evaluate(observed(spec), SETTINGS, T0)
    children = live_children(first)
    for child in children:
        if child["kind"] == "Deployment":
            rewrite(child["spec"]["template"]["spec"]["containers"][0])
    again = evaluate(observed(spec, status=status_wire(first), children=children), SETTINGS, T1)
    return kinds_and_names(again.apply)


def canonical_cpu(container: dict[str, Any]) -> None:
    container["resources"]["requests"]["cpu"] = "500m"  # the API server stores quantities canonically


def omitted_empty_value(container: dict[str, Any]) -> None:
    for env in container["env"]:
        if env.get("value") == "":
            del env["value"]  # core/v1 EnvVar.value is omitempty


@pytest.mark.parametrize(
    ("runtime", "rewrite"),
    [
        ({"resources": {"requests": {"cpu": "0.5"}}}, canonical_cpu),
        ({"env": [{"name": "VLLM_LOGGING_PREFIX"}]}, omitted_empty_value),
    ],
    ids=["cpu-0.5-read-back-as-500m", "empty-env-value-omitted"],
)
def test_server_normalisation_is_not_drift(runtime: dict[str, Any], rewrite: Callable[[dict[str, Any]], None]) -> None:
    assert steady_writes_when_the_server_rewrites(spec_wire(runtime=runtime), rewrite) == []


@pytest.mark.parametrize("placement", [{"replicasPerPool": 0}, {"totalReplicas": 0}], ids=["per-pool", "total"])
def test_zero_replicas_is_not_reported_as_missing_nodes(placement: dict[str, int]) -> None:
    plan = evaluate(observed(spec_wire(placement={"gfxTargets": ["gfx942"], **placement})), SETTINGS, T0)
    assert condition(plan, "Ready")[1] != "NoCompatibleNodes"  # four MI300X nodes are compatible


def test_a_carried_over_k_vllm_would_refuse_for_an_mtp_drafter_moves_to_the_nearest_legal_k() -> None:
    """eagle3 ran K=5; the drafter became mtp with 2 layers, where vLLM refuses K=5 (not a multiple of 2)."""
    first, _ = settle(THREE_POOLS)
    previous = status_wire(first)
    for pool in previous["pools"]:
        pool["effectiveK"] = 5
    model = spec_wire(drafters=[drafter_wire("mtp", mtpLayers=2)], placement={"gfxTargets": ["gfx942"]},
                      speculation={"initialK": 2, "maxK": 8})
    plan = evaluate(observed(model, status=previous), SETTINGS, T1)
    assert [(p.plan.drafter.drafter.method if p.plan.drafter.drafter else None, p.k) for p in plan.pools] == [
        ("mtp", 4)
    ]


def test_pods_whose_metrics_are_left_out_are_named_in_degraded_and_nothing_else_changes() -> None:
    import dataclasses

    first, second = settle(THREE_POOLS)
    settled = observed(THREE_POOLS, status=status_wire(second), children=live_children(first))
    hostile = dataclasses.replace(settled, excluded_pod_metrics=(("ns/llama8b-gfx942-x", "accepted > drafted"),))
    plan = evaluate(hostile, SETTINGS, T2)
    status, reason, message = condition(plan, "Degraded")
    assert (status, reason) == ("True", "PodMetricsExcluded")
    assert "ns/llama8b-gfx942-x: accepted > drafted" in message
    assert condition(plan, "Ready")[0] == "True"
    assert (plan.apply, plan.delete) == ([], [])
