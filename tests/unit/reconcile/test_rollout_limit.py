"""The fleet's limit on rollouts in flight at once (SPECDEC_MAX_CONCURRENT_ROLLOUTS, issue 32 item 3): a model whose
next rollout finds the limit reached waits as a freeze holds, with Progressing=False RolloutQueued naming the models
in flight; a model whose rollout is in flight keeps its slot and goes on; the slot frees when the rollout ends."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specdec_operator.handlers.services.rollout_slots import RolloutSlots
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from specdec_operator.reconcile.rollout_limit import LIMIT_SOURCE, RolloutsInFlight, rolls_out
from tests.unit.reconcile.reconcilefactories import SETTINGS, T2, condition, observed
from tests.unit.reconcile.test_canary_drain import route
from tests.unit.reconcile.test_freeze import canary_wire, deployments, settled_children, spec

FULL = RolloutsInFlight(limit=2, others=("team-a/llama70b", "team-b/qwen"), holds_slot=False)


def changed(wire: dict[str, Any], in_flight: RolloutsInFlight | None, **kwargs: Any) -> ReconcilePlan:
    children, status = settled_children(wire)
    model = replace(observed(spec(max_model_len=8192), status=status, children=children, generation=2),
                    rollouts_in_flight=in_flight)
    return evaluate(model, SETTINGS, T2)


def test_a_spec_change_waits_for_a_slot_while_the_limit_is_reached_naming_the_models_in_flight() -> None:
    queued = changed(spec(), FULL)
    assert deployments(queued) == [] and queued.delete == []
    progressing = condition(queued, "Progressing")
    assert progressing[:2] == ("False", "RolloutQueued"), progressing
    assert LIMIT_SOURCE in progressing[2] and "2 of 2 in flight (team-a/llama70b, team-b/qwen)" in progressing[2]
    assert "llama8b-gfx942 keeps revision" in progressing[2], progressing
    assert queued.queued and queued.rolls_out is False
    # The pools keep serving what they ran: nothing says they roll.
    assert condition(queued, "Ready")[:2] == ("True", "PoolsReady") and queued.events == []


def test_below_the_limit_or_holding_a_slot_the_change_rolls_out_and_takes_the_slot() -> None:
    for in_flight in (None, replace(FULL, others=("team-a/llama70b",)), replace(FULL, holds_slot=True)):
        plan = changed(spec(), in_flight)
        assert sorted(deployments(plan)) == ["llama8b-gfx90a", "llama8b-gfx942"], in_flight
        assert condition(plan, "Progressing")[:2] == ("True", "NewRevision"), in_flight
        assert plan.rolls_out is True and not plan.queued


def test_a_model_with_nothing_to_roll_out_is_not_queued_and_holds_no_slot() -> None:
    children, status = settled_children(spec())
    plan = evaluate(replace(observed(spec(), status=status, children=children), rollouts_in_flight=FULL),
                    SETTINGS, T2)
    assert plan.apply == [] and not plan.queued and plan.rolls_out is False
    assert condition(plan, "Progressing")[1] != "RolloutQueued"


def test_no_canary_starts_while_the_limit_is_reached() -> None:
    children, status = settled_children(canary_wire())
    model = replace(observed(canary_wire(max_model_len=8192), status=status, children=children, generation=2),
                    route=route(100, None), route_read=True, rollouts_in_flight=FULL)
    queued = evaluate(model, SETTINGS, T2)
    assert deployments(queued) == [] and queued.status is not None and queued.status.canary is None
    assert condition(queued, "Progressing")[:2] == ("False", "RolloutQueued")


def test_a_freeze_is_named_before_the_limit() -> None:
    children, status = settled_children(spec())
    model = replace(observed(spec(freeze=True, max_model_len=8192), status=status, children=children,
                             generation=2), rollouts_in_flight=FULL)
    assert condition(evaluate(model, SETTINGS, T2), "Progressing")[:2] == ("False", "RolloutsFrozen")


def deployment(name: str, track: str = "stable", revision: str = "r1", **status: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": status.pop("generation", 1),
                         "labels": {"specdec.io/track": track}},
            "spec": {"replicas": 2, "template": {"metadata": {"labels": {"specdec.io/revision": revision}}}},
            "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, **status}}


def test_a_rollout_is_in_flight_until_every_pod_runs_the_template_and_no_canary_is_left() -> None:
    settled = deployment("m-gfx942")
    assert not rolls_out({"m-gfx942": settled}, [settled])
    assert rolls_out({"m-gfx942": settled}, [deployment("m-gfx942", revision="r2")])  # this pass changes it
    assert rolls_out({"m-gfx942": deployment("m-gfx942", generation=2)})  # not seen by its controller yet
    assert rolls_out({"m-gfx942": deployment("m-gfx942", updatedReplicas=1)})  # new pods not all made
    assert rolls_out({"m-gfx942": deployment("m-gfx942", replicas=3)})  # old pods still there
    assert rolls_out({"m-gfx942-canary": deployment("m-gfx942-canary", track="canary")})
    # A pod that is not ready (a crash, a slow load) is not a rollout; a new pool is not one either.
    assert not rolls_out({"m-gfx942": deployment("m-gfx942", readyReplicas=0)})
    assert not rolls_out({}, [deployment("m-gfx942")])


def test_the_slots_admit_at_most_the_limit_and_wake_the_queued_when_one_frees() -> None:
    slots = RolloutSlots(limit=1)
    a, b, c = ("ns", "a"), ("ns", "b"), ("ns", "c")
    seeded = slots.in_flight(a, lambda: [c])  # after a restart: c's Deployments are mid-rollout
    assert seeded == RolloutsInFlight(1, ("ns/c",), holds_slot=False) and seeded.full
    assert slots.record(a, rolls_out=False, queued=True) == []
    assert slots.in_flight(b, lambda: []) is not None and slots.in_flight(b, lambda: [a]).full  # seeded once
    assert slots.record(b, rolls_out=False, queued=True) == []
    assert slots.record(c, rolls_out=True, queued=False) == []  # still rolling: keeps its slot
    assert slots.in_flight(c, lambda: []) == RolloutsInFlight(1, (), holds_slot=True)
    assert slots.record(c, rolls_out=False, queued=False) == [a, b]  # done: the queued models look again
    assert not slots.in_flight(a, lambda: []).full
    assert slots.record(a, rolls_out=True, queued=False) == []
    assert slots.in_flight(b, lambda: []).full  # a took the slot before b's pass ran
    assert slots.release(a) == [b]  # a's loop ended (deleted)
    assert slots.record(b, rolls_out=None, queued=False) == []  # a pass that planned nothing changes nothing


def test_without_a_limit_nothing_is_counted() -> None:
    slots = RolloutSlots(limit=0)
    assert slots.in_flight(("ns", "a"), lambda: [("ns", "b")]) is None
    assert slots.record(("ns", "a"), rolls_out=True, queued=False) == []
