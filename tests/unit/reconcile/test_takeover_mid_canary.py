"""A replica that takes over mid-canary (kill -9 of the leader, tests/e2e/test_ha.py) resumes the canary; it never
rolls the stable Deployment to the canary's revision, whatever its first passes see of the owned objects.

The survivor is a fresh loop with no memory: status is all it knows of the canary. Kopf fills its indices once;
a replica that paused after that (it led briefly, then a peer with a higher priority appeared) is resumed with
indices that hold what they held when it paused, and each kind is re-listed on its own while the model loops
already run. Its first pass may then see the model (status.canary Progressing at step 1) without its stable
Deployment, or without its canary Deployment.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.reconcile.reconcilefactories import SETTINGS, T0, T1, T2, live, live_children, observed, status_wire

POOL = "llama8b-gfx942"
CANARY_NAME = f"{POOL}-canary"
CANARY = {"strategy": "Canary", "canary": {
    "steps": [{"weight": 10, "pauseSeconds": 10}, {"weight": 50, "pauseSeconds": 10}, {"weight": 100}],
    "traffic": {"httpRouteRef": {"name": "llama8b-route"}}}}
SPEC = spec_wire(drafters=[drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")],
                 placement={"gfxTargets": ["gfx942"]}, rollout=CANARY)
CHANGED = spec_wire(drafters=[drafter_wire("eagle3", "example-org/EAGLE3-v2")],
                    placement={"gfxTargets": ["gfx942"]}, rollout=CANARY)
T3 = "2026-11-29T10:10:05Z"


def revision(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["metadata"]["labels"][contract.LABEL_REVISION])


def deployments(plan: ReconcilePlan) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in plan.apply if o["kind"] == "Deployment"}


def at_step_one() -> tuple[list[dict[str, Any]], dict[str, Any], str, str]:
    """(live children, status) of the dead leader's last pass: the drafter changed and the canary's first step
    routes 10%; and the stable and canary revisions."""
    first = evaluate(observed(SPEC), SETTINGS, T0)
    children = live_children(first)
    settled = evaluate(observed(SPEC, status=status_wire(first), children=children), SETTINGS, T0)
    started = evaluate(observed(CHANGED, status=status_wire(settled), children=children), SETTINGS, T1)
    assert started.status is not None and started.status.canary is not None
    canary = [live(deployments(started)[CANARY_NAME])]
    stepped = evaluate(observed(CHANGED, status=status_wire(started), children=[*children, *canary]),
                       SETTINGS, T2)
    assert stepped.status is not None and stepped.status.canary is not None
    assert (stepped.status.canary.phase, stepped.status.canary.step, stepped.status.canary.weight) == (
        "Progressing", 0, 10)
    return [*children, *canary], status_wire(stepped), stepped.status.canary.stable_revision, \
        stepped.status.canary.canary_revision


def without(children: list[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    return [c for c in children if not (c["kind"] == "Deployment" and c["metadata"]["name"] in names)]


def test_a_takeover_that_sees_no_deployment_yet_never_rolls_the_stable_to_the_canary() -> None:
    children, status, stable, canary = at_step_one()
    # The survivor's index from before the model existed: nothing of it re-listed yet.
    for seen in ([], without(children, POOL, CANARY_NAME), without(children, POOL)):
        plan = evaluate(observed(CHANGED, status=status, children=seen), SETTINGS, T3)
        rolled = [name for name, body in deployments(plan).items() if name == POOL and revision(body) != stable]
        assert rolled == [], f"stable Deployment rendered at the canary's revision {canary} from {len(seen)} children"
        assert plan.status is not None and plan.status.canary is not None
        assert (plan.status.canary.phase, plan.status.canary.step, plan.status.canary.stable_revision) == (
            "Progressing", 0, stable)
        # Held as it is: the canary Deployment stays, the route keeps its weights, nothing is announced.
        assert ("Deployment", CANARY_NAME) not in plan.delete and CANARY_NAME not in deployments(plan)
        assert plan.route_weight is None
        assert [event.reason for event in plan.events] == []


def test_the_canary_goes_on_once_the_deployments_are_seen_again() -> None:
    children, status, stable, _ = at_step_one()
    held = evaluate(observed(CHANGED, status=status, children=without(children, POOL, CANARY_NAME)), SETTINGS, T3)
    plan = evaluate(observed(CHANGED, status=status_wire(held), children=children), SETTINGS, T3)
    assert plan.status is not None and plan.status.canary is not None
    assert (plan.status.canary.phase, plan.status.canary.step, plan.status.canary.weight) == ("Progressing", 0, 10)
    # The route follows the step's replica split (equal load per pod): at 10% of this two-replica pool, one
    # canary beside one stable replica.
    assert plan.route_weight == 50
    assert all(revision(body) == stable for name, body in deployments(plan).items() if name == POOL)


def test_status_names_the_stable_revision_while_a_canary_is_in_flight() -> None:
    # Whatever the stable Deployment's template says as read (a stale cache, a hand edit, an earlier wrong roll),
    # an in-flight canary is not cancelled as "the desired revision is the stable one again".
    children, status, stable, canary = at_step_one()
    [deployment] = [c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"] == POOL]
    mislabelled = {**deployment, "spec": {**deployment["spec"], "template": {
        **deployment["spec"]["template"], "metadata": {**deployment["spec"]["template"]["metadata"], "labels": {
            **deployment["spec"]["template"]["metadata"]["labels"], contract.LABEL_REVISION: canary}}}}}
    plan = evaluate(observed(CHANGED, status=status, children=[*without(children, POOL), mislabelled]),
                    SETTINGS, T3)
    assert plan.status is not None and plan.status.canary is not None
    assert "CanaryCancelled" not in [event.reason for event in plan.events]
    assert (plan.status.canary.phase, plan.status.canary.stable_revision) == ("Progressing", stable)


def test_a_held_pool_says_why_and_a_spec_back_at_the_stable_revision_renders_it() -> None:
    children, status, stable, _ = at_step_one()
    seen = without(children, POOL)
    held = evaluate(observed(CHANGED, status=status, children=seen), SETTINGS, T3)
    assert held.status is not None
    progressing = next(c for c in held.status.conditions if c.type == "Progressing")
    assert f"stable Deployment of {POOL} not observed" in progressing.message
    # The spec that rendered the stable revision can render it again: nothing to wait for.
    reverted = evaluate(observed(SPEC, status=status, children=seen), SETTINGS, T3)
    assert revision(deployments(reverted)[POOL]) == stable


def test_a_pass_whose_owned_objects_are_not_known_yet_decides_and_writes_nothing() -> None:
    children, status, _, _ = at_step_one()
    unknown = replace(observed(CHANGED, status=status, children=without(children, POOL)), children_known=False)
    plan = evaluate(unknown, SETTINGS, T3)
    assert plan.held is not None
    assert (plan.apply, plan.delete, plan.status, plan.events, plan.route_weight) == ([], [], None, [], None)
