"""A change freeze (spec.rollout.freeze, or the fleet-wide SPECDEC_FREEZE_ROLLOUTS) holds every rollout and K
change with a condition that says what waits, and what waited rolls out once it is off (issue 32, item 3)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

from specdec_operator.reconcile.freeze import FLEET_SOURCE, SPEC_SOURCE
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.canary.canaryfactories import FAIL
from tests.unit.reconcile.reconcilefactories import (
    SETTINGS,
    T0,
    T1,
    T2,
    condition,
    live,
    live_children,
    observed,
    status_wire,
)
from tests.unit.reconcile.test_canary_drain import route
from tests.unit.reconcile.test_tuning_policy import SPEC as TUNED_SPEC
from tests.unit.reconcile.test_tuning_policy import fed_tuner, settled, with_tuning

EAGLE3 = drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
FLEET_FROZEN = dataclasses.replace(SETTINGS, freeze_rollouts=True)


def spec(freeze: bool = False, max_model_len: int | None = None, **rollout: Any) -> dict[str, Any]:
    model = {"maxModelLen": max_model_len} if max_model_len else {}
    return spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942", "gfx90a"]}, model=model,
                     rollout={**rollout, "freeze": freeze})


def deployments(plan: ReconcilePlan) -> list[str]:
    return [o["metadata"]["name"] for o in plan.apply if o["kind"] == "Deployment"]


def settled_children(wire: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    first = evaluate(observed(wire), SETTINGS, T0)
    second = evaluate(observed(wire, status=status_wire(first), children=live_children(first)), SETTINGS, T1)
    return live_children(first), status_wire(second)


def test_a_spec_change_waits_under_the_models_freeze_with_a_condition_and_rolls_out_once_it_is_off() -> None:
    children, status = settled_children(spec())
    frozen = evaluate(observed(spec(freeze=True, max_model_len=8192), status=status, children=children,
                               generation=2), SETTINGS, T2)
    assert deployments(frozen) == [] and frozen.delete == []
    progressing = condition(frozen, "Progressing")
    assert progressing[:2] == ("False", "RolloutsFrozen"), progressing
    assert SPEC_SOURCE in progressing[2] and "llama8b-gfx942 keeps revision" in progressing[2], progressing
    # The pools serve what they ran before: still Ready, nothing pending, no event says they roll, and status
    # shows the revision each keeps.
    assert condition(frozen, "Ready")[:2] == ("True", "PoolsReady")
    assert frozen.events == []
    assert frozen.status is not None
    assert [p.revision for p in frozen.status.pools] == [p["revision"] for p in status["pools"]]
    thawed = evaluate(observed(spec(max_model_len=8192), status=status_wire(frozen), children=children,
                               generation=3), SETTINGS, T2)
    assert sorted(deployments(thawed)) == ["llama8b-gfx90a", "llama8b-gfx942"]
    assert condition(thawed, "Progressing")[:2] == ("True", "NewRevision")
    assert [e.reason for e in thawed.events].count("RevisionChanged") == 2


def test_the_fleet_wide_setting_freezes_every_model_and_status_names_it() -> None:
    children, status = settled_children(spec())
    frozen = evaluate(observed(spec(max_model_len=8192), status=status, children=children, generation=2),
                      FLEET_FROZEN, T2)
    assert deployments(frozen) == []
    progressing = condition(frozen, "Progressing")
    assert progressing[:2] == ("False", "RolloutsFrozen") and FLEET_SOURCE in progressing[2], progressing


def test_a_frozen_model_with_nothing_to_roll_out_says_it_is_frozen_and_writes_nothing_else() -> None:
    children, status = settled_children(spec())
    frozen = evaluate(observed(spec(freeze=True), status=status, children=children), SETTINGS, T2)
    assert frozen.apply == [] and frozen.delete == []
    assert condition(frozen, "Progressing")[2].endswith("nothing waits")


def test_scaling_is_not_held_by_a_freeze() -> None:
    children, status = settled_children(spec())
    scaled = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942", "gfx90a"], "replicasPerPool": 2},
                       rollout={"freeze": True})
    plan = evaluate(observed(scaled, status=status, children=children), SETTINGS, T2)
    assert sorted(deployments(plan)) == ["llama8b-gfx90a", "llama8b-gfx942"]
    assert all(o["spec"]["replicas"] == 2 for o in plan.apply if o["kind"] == "Deployment")


def canary_wire(freeze: bool = False, max_model_len: int | None = None) -> dict[str, Any]:
    return spec(freeze, max_model_len, strategy="Canary", canary={"traffic": {"httpRouteRef": {"name": "llama8b"}}})


def test_no_canary_starts_under_a_freeze() -> None:
    children, status = settled_children(canary_wire())
    frozen = evaluate(replace(observed(canary_wire(True, 8192), status=status, children=children, generation=2),
                              route=route(100, None), route_read=True), SETTINGS, T2)
    assert deployments(frozen) == [] and frozen.status is not None and frozen.status.canary is None
    assert condition(frozen, "Progressing")[:2] == ("False", "RolloutsFrozen")


def canary_running() -> tuple[ReconcilePlan, list[dict[str, Any]]]:
    """A spec change's canary started (first step), its Deployments live and ready."""
    children, status = settled_children(canary_wire())
    started = evaluate(replace(observed(canary_wire(max_model_len=8192), status=status, children=children,
                                        generation=2), route=route(100, None), route_read=True), SETTINGS, T2)
    assert started.status is not None and started.status.canary is not None
    fresh = [live(o) for o in started.apply if o["kind"] == "Deployment"]
    assert any(d["metadata"]["labels"][contract.LABEL_TRACK] == "canary" for d in fresh)
    names = {(d["kind"], d["metadata"]["name"]) for d in fresh}
    return started, [c for c in children if (c["kind"], c["metadata"]["name"]) not in names] + fresh


def test_a_canary_in_flight_holds_at_its_step_under_a_freeze_as_a_pause_does_and_resumes_after() -> None:
    started, running = canary_running()
    assert started.status is not None and started.status.canary is not None
    before = started.status.canary
    frozen = evaluate(replace(observed(canary_wire(True, 8192), status=status_wire(started), children=running,
                                       generation=3), route=route(100, 0), route_read=True), SETTINGS, T2)
    assert deployments(frozen) == [] and frozen.delete == []
    assert frozen.status is not None and frozen.status.canary is not None
    held = frozen.status.canary
    assert (held.phase, held.step, held.weight, held.canary_revision) == ("Paused", before.step, before.weight,
                                                                         before.canary_revision)
    assert [e.message for e in frozen.events if e.reason == "CanaryPaused"] == [
        f"paused by {SPEC_SOURCE} at step 1/3 (10%)"]
    progressing = condition(frozen, "Progressing")
    assert progressing[:2] == ("False", "RolloutsFrozen") and "its canary" in progressing[2], progressing
    thawed = evaluate(replace(observed(canary_wire(max_model_len=8192), status=status_wire(frozen),
                                       children=running, generation=4), route=route(100, 0), route_read=True),
                      SETTINGS, T2)
    assert thawed.status is not None and thawed.status.canary is not None
    assert thawed.status.canary.phase == "Progressing"
    assert [e.reason for e in thawed.events if e.reason.startswith("Canary")] == ["CanaryResumed"]


def test_a_failing_canary_still_rolls_back_under_a_freeze() -> None:
    started, running = canary_running()
    assert started.status is not None and started.status.canary is not None
    revision = started.status.canary.canary_revision
    frozen = evaluate(replace(observed(canary_wire(True, 8192), status=status_wire(started), children=running,
                                       generation=3), route=route(90, 10), route_read=True), SETTINGS, T2,
                      verdicts={revision: FAIL})
    assert frozen.status is not None and frozen.status.canary is not None
    assert frozen.status.canary.phase == "RolledBack" and frozen.route_weight == 0


def test_a_spec_change_during_a_frozen_canary_leaves_both_deployments_and_the_route_as_they_are() -> None:
    started, running = canary_running()
    assert started.status is not None
    changed = canary_wire(True, 4096)
    frozen = evaluate(replace(observed(changed, status=status_wire(started), children=running, generation=3),
                              route=route(90, 10), route_read=True), SETTINGS, T2)
    assert deployments(frozen) == [] and frozen.delete == []
    assert frozen.route_weight is None and frozen.route_step is None
    assert frozen.status is not None and frozen.status.canary == started.status.canary
    assert "though the spec asks for revision" in condition(frozen, "Progressing")[2]


def test_a_k_change_waits_under_a_freeze_and_is_proposed_once_it_is_off() -> None:
    model = settled()
    pool = model.children_of_kind("Deployment")[0]["metadata"]["labels"]["specdec.io/pool"]
    frozen_spec = spec_wire(**{**TUNED_SPEC, "rollout": {"freeze": True}})
    tuner = fed_tuner(pool)
    frozen = evaluate(with_tuning(replace(model, spec=frozen_spec), tuner, 125.0, 120.0), SETTINGS, T1)
    assert frozen.tuning.proposal is None and frozen.tuning.k_waiting is not None
    # Between evaluations the change still waits, and Progressing says the same (no status write for nothing).
    between = evaluate(with_tuning(replace(model, spec=frozen_spec), tuner, 126.0, 140.0), SETTINGS, T1)
    assert between.tuning.k_waiting == frozen.tuning.k_waiting
    assert condition(between, "Progressing") == condition(frozen, "Progressing")
    assert frozen.status is not None and frozen.status.speculation.last_decision is None
    progressing = condition(frozen, "Progressing")
    assert progressing[:2] == ("False", "RolloutsFrozen") and "K change of pool" in progressing[2], progressing
    assert not [e for e in frozen.events if e.reason in ("KChanged", "KExplore", "KProposed")]
    thawed = evaluate(with_tuning(model, fed_tuner(pool), 125.0, 120.0), SETTINGS, T1)
    assert thawed.tuning.proposal is not None and thawed.tuning.proposal.from_k == 5
