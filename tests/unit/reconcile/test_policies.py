"""evaluate's policies one at a time: each is a pure function of the parsed pass inputs and of what the policies
before it decided, so each can be checked on its own (plan.evaluate is the list of them, test_plan.py end to end)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from unittest import mock

import pytest

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import SpeculativeModelStatus
from specdec_operator.reconcile.observed import ObservedModel
from specdec_operator.reconcile.plan import (
    ParsedModel,
    PassInputs,
    ReconcilePlan,
    condition_facts,
    desired_objects,
    evaluate,
    gate_inputs,
    hold_without_nodes,
    judge_route,
    parse_model,
    place_pools,
    plan_events,
    pool_statuses,
    roll_out,
    stale_objects,
)
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.reconcile.reconcilefactories import (
    SETTINGS,
    T0,
    T1,
    kinds_and_names,
    live,
    live_children,
    observed,
    status_wire,
)
from tests.unit.reconcile.test_route_status import canary_spec

EAGLE3 = drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
TWO_POOLS = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942", "gfx90a"]})
POOLS = ["llama8b-gfx942", "llama8b-gfx90a"]


def inputs_of(model: ObservedModel, now: str = T0, **extra: Any) -> PassInputs:
    gate = gate_inputs(parse_model(model))
    assert not isinstance(gate, ReconcilePlan), gate
    spec, previous = gate
    return PassInputs(model, SETTINGS, now, spec, previous, **extra)


def settled() -> ObservedModel:
    """The two pools after their first pass, all of it live and ready."""
    first = evaluate(observed(TWO_POOLS), SETTINGS, T0)
    return observed(TWO_POOLS, status=status_wire(first), children=live_children(first))


# parse_model and gate_inputs: parse once, and stop early with the reason when the inputs cannot be used.

def test_parse_model_parses_the_spec_and_the_status_once_each() -> None:
    parsed = parse_model(settled())
    assert parsed.spec is not None and parsed.spec_error is None
    assert [p.name for p in parsed.status.status.pools] == POOLS and parsed.status.problems == ()


def test_parse_model_names_the_invalid_spec_field() -> None:
    parsed = parse_model(observed(spec_wire(speculation={"minK": 6, "maxK": 2})))
    assert parsed.spec is None
    assert parsed.spec_error is not None and parsed.spec_error.startswith("spec.")


def test_evaluate_given_a_parsed_model_parses_nothing_again() -> None:
    model = settled()
    parsed = parse_model(model)
    with mock.patch.object(SpeculativeModelSpec, "model_validate", side_effect=AssertionError("spec parsed again")), \
            mock.patch.object(SpeculativeModelStatus, "model_validate",
                              side_effect=AssertionError("status parsed again")):
        once = evaluate(parsed, SETTINGS, T1)
    assert once == evaluate(model, SETTINGS, T1)


def test_gate_holds_while_the_cache_has_not_listed_the_owned_objects() -> None:
    gate = gate_inputs(parse_model(replace(observed(TWO_POOLS), children_known=False)))
    assert isinstance(gate, ReconcilePlan) and gate.held is not None and gate.status is None


def test_gate_reports_an_unreadable_status_and_holds_everything() -> None:
    gate = gate_inputs(parse_model(observed(TWO_POOLS, status={"pools": "not a list"})))
    assert isinstance(gate, ReconcilePlan)
    assert gate.status_unreadable and gate.status_unreadable[0].startswith("status.pools")
    assert gate.apply == [] and gate.delete == []


def test_gate_reports_an_invalid_spec() -> None:
    gate = gate_inputs(parse_model(observed(spec_wire(speculation={"minK": 6, "maxK": 2}))))
    assert isinstance(gate, ReconcilePlan) and gate.invalid_spec is not None
    assert [e.reason for e in gate.events] == ["InvalidSpec"]


def test_gate_passes_the_parsed_spec_and_status() -> None:
    gate = gate_inputs(parse_model(settled()))
    assert not isinstance(gate, ReconcilePlan)
    spec, previous = gate
    assert spec.placement.gfx_targets == ["gfx942", "gfx90a"] and [p.name for p in previous.pools] == POOLS


# hold_without_nodes

def test_an_empty_inventory_holds_the_pools_a_status_records() -> None:
    held = hold_without_nodes(inputs_of(replace(settled(), nodes=()), T1))
    assert held is not None and held.decided is not None and held.apply == [] and held.delete == []
    assert held.decided.pools is not None and [p.name for p in held.decided.pools] == POOLS
    built = evaluate(replace(settled(), nodes=()), SETTINGS, T1)
    assert built.status is not None and [p.name for p in built.status.pools] == POOLS


def test_an_empty_inventory_without_pools_is_not_held() -> None:
    assert hold_without_nodes(inputs_of(replace(observed(TWO_POOLS), nodes=()))) is None
    assert hold_without_nodes(inputs_of(settled(), T1)) is None


# place_pools

def test_place_pools_places_one_pool_per_target() -> None:
    placed = place_pools(inputs_of(observed(TWO_POOLS)))
    assert [p.gfx for p in placed.placement.pools] == ["gfx942", "gfx90a"]
    assert placed.held_whole == [] and placed.absence.expired == ()


def test_place_pools_holds_a_pool_whose_nodes_all_went_missing_whole() -> None:
    model = settled()
    without_gfx90a = [n for n in model.nodes if not n.name.startswith("mi250x")]
    placed = place_pools(inputs_of(replace(model, nodes=without_gfx90a), T1))
    assert [p.name for p in placed.held_whole] == ["llama8b-gfx90a"]
    assert placed.held_whole[0].missing is not None


# roll_out

def test_roll_out_renders_each_pool_at_the_recorded_k_and_decides_its_mode() -> None:
    inputs = inputs_of(settled(), T1)
    rolled = roll_out(inputs, place_pools(inputs))
    recorded = {p.name: p.effective_k for p in inputs.previous.pools}
    assert {p.name: p.k for p in rolled.pools} == recorded
    assert set(rolled.modes) == set(POOLS)
    assert {d["metadata"]["name"] for d in rolled.rollout.deployments} == set(POOLS)
    assert rolled.speculation is None and rolled.action_events == []


def test_roll_out_reports_an_unreadable_canary_action() -> None:
    model = replace(settled(), annotations={"specdec.io/canary-action": "launch"})
    inputs = inputs_of(model, T1)
    rolled = roll_out(inputs, place_pools(inputs))
    assert [e.reason for e in rolled.action_events] == ["InvalidCanaryAction"]


# desired_objects and stale_objects

def test_desired_objects_on_a_first_pass_are_all_applied() -> None:
    inputs = inputs_of(observed(TWO_POOLS))
    placed = place_pools(inputs)
    rolled = roll_out(inputs, placed)
    owned = desired_objects(inputs, placed, rolled)
    applied = kinds_and_names(owned.to_apply)
    assert ("Service", "llama8b") in applied
    assert {name for kind, name in applied if kind == "Deployment"} == set(POOLS)
    assert {(o["kind"], o["metadata"]["name"]) for o in owned.to_apply} == owned.wanted
    assert owned.stable_revisions == {p.name: p.revision for p in rolled.pools}


def test_desired_objects_that_run_as_desired_are_not_applied_again() -> None:
    inputs = inputs_of(settled(), T1)
    placed = place_pools(inputs)
    assert desired_objects(inputs, placed, roll_out(inputs, placed)).to_apply == []


def test_stale_objects_are_owned_objects_no_pool_wants() -> None:
    model = settled()
    orphan = next(c for c in model.children.values() if c["kind"] == "Deployment")
    orphan = live({**orphan, "metadata": {**orphan["metadata"], "name": "llama8b-gfx1100",
                                          "labels": {**orphan["metadata"]["labels"],
                                                     contract.LABEL_POOL: "llama8b-gfx1100"}}})
    model = replace(model, children={**model.children, ("Deployment", "llama8b-gfx1100"): orphan})
    inputs = inputs_of(model, T1)
    placed = place_pools(inputs)
    rolled = roll_out(inputs, placed)
    assert stale_objects(inputs, placed, rolled, desired_objects(inputs, placed, rolled)) == [
        ("Deployment", "llama8b-gfx1100")]


# judge_route

def test_no_route_is_nothing_to_judge() -> None:
    assert judge_route(inputs_of(observed(TWO_POOLS))).finding is None


def test_a_route_that_could_not_be_read_holds_the_owned_objects() -> None:
    model = replace(observed(canary_spec()), route_error="forbidden")
    judged = judge_route(inputs_of(model))
    assert judged.unreadable and judged.finding is not None and judged.finding.reason == "HTTPRouteUnreadable"
    assert "forbidden" in judged.finding.message


def test_a_route_read_as_absent_is_reported_not_found() -> None:
    judged = judge_route(inputs_of(replace(observed(canary_spec()), route=None, route_read=True)))
    assert not judged.unreadable and judged.finding is not None
    assert judged.finding.reason == "HTTPRouteNotFound"


# pool_statuses, condition_facts, plan_events

@pytest.mark.parametrize("refused", [(), ("Deployment llama8b-gfx942: forbidden",)])
def test_condition_facts_say_what_the_first_pass_waits_for(refused: tuple[str, ...]) -> None:
    inputs = inputs_of(observed(TWO_POOLS), refusals=refused)
    placed = place_pools(inputs)
    rolled = roll_out(inputs, placed)
    owned = desired_objects(inputs, placed, rolled)
    pools = pool_statuses(inputs, placed, rolled)
    assert [p.name for p in pools] == POOLS and all(p.rollout is not None for p in pools)
    facts = condition_facts(inputs, placed, rolled, owned, judge_route(inputs), pools)
    assert facts.pending is not None and all(name in facts.pending for name in POOLS)
    assert facts.no_pools is None and facts.capacity == () and facts.refusals == refused


def test_pool_statuses_keep_a_pool_held_whole_after_the_placed_ones() -> None:
    model = settled()
    inputs = inputs_of(replace(model, nodes=[n for n in model.nodes if not n.name.startswith("mi250x")]), T1)
    placed = place_pools(inputs)
    statuses = pool_statuses(inputs, placed, roll_out(inputs, placed))
    assert [p.name for p in statuses] == ["llama8b-gfx942", "llama8b-gfx90a"]
    assert statuses[-1].missing is not None


def test_plan_events_announce_new_pools_once() -> None:
    inputs = inputs_of(observed(TWO_POOLS))
    placed = place_pools(inputs)
    rolled = roll_out(inputs, placed)
    first = evaluate(observed(TWO_POOLS), SETTINGS, T0)
    assert first.status is not None and first.conditions is not None
    events = plan_events(inputs, placed, rolled, first.status.pools, first.conditions)
    assert [e.reason for e in events] == ["PoolPlaced", "DrafterSelected"] * 2
    again = inputs_of(settled(), T1)
    placed_again = place_pools(again)
    second = evaluate(settled(), SETTINGS, T1)
    assert second.status is not None and second.conditions is not None
    assert plan_events(again, placed_again, roll_out(again, placed_again), second.status.pools,
                       second.conditions) == []


def test_a_parsed_model_is_what_evaluate_reads() -> None:
    parsed = parse_model(observed(TWO_POOLS))
    assert isinstance(parsed, ParsedModel)
    assert evaluate(parsed, SETTINGS, T0) == evaluate(observed(TWO_POOLS), SETTINGS, T0)
