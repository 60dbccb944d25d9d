"""A canary that fails returns the pool to the K the decision record says it left, read from status only;
a canary of a spec change never touches K."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specdec_operator.canary.analysis import Verdict
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.reconcile.reconcilefactories import SETTINGS, T0, T1, T2, live, live_children, observed, status_wire

POOL = "llama8b-gfx942"
CANARY = {"strategy": "Canary", "canary": {"steps": [{"weight": 50, "pauseSeconds": 60}, {"weight": 100}]}}
EAGLE3 = drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
SPEC = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942"]}, rollout=CANARY)
FAILED = Verdict("Fail", "ThresholdsMissed", "accepted length 1.4 vs stable 2.7 (ratio 0.52 < 0.90)")


def decision(from_k: int, to_k: int) -> dict[str, Any]:
    return {"id": "d1", "time": T0, "pool": POOL, "fromK": from_k, "toK": to_k, "action": "Change", "reason": "r"}


def settled(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    first = evaluate(observed(spec), SETTINGS, T0)
    children = live_children(first)
    second = evaluate(observed(spec, status=status_wire(first), children=children), SETTINGS, T0)
    return children, status_wire(second)


def canary_then_fail(spec: dict[str, Any], status: dict[str, Any], children: list[dict[str, Any]]) -> ReconcilePlan:
    started = evaluate(observed(spec, status=status, children=children), SETTINGS, T1)
    assert started.status is not None and started.status.canary is not None
    assert started.status.canary.phase == "Progressing"
    canary_revision = started.status.canary.canary_revision
    with_canary = [*children, *(live(obj) for obj in started.apply if obj["kind"] == "Deployment"
                                and obj["metadata"]["name"].endswith("-canary"))]
    return evaluate(observed(spec, status=status_wire(started), children=with_canary), SETTINGS, T2,
                    verdicts={canary_revision: FAILED})


def rendered_k(plan: ReconcilePlan) -> str:
    [stable] = [o for o in plan.apply if o["kind"] == "Deployment" and o["metadata"]["name"] == POOL] or [None]
    return "" if stable is None else str(stable["spec"]["template"]["metadata"]["annotations"][contract.ANNOTATION_K])


def test_a_failed_tuner_canary_returns_to_the_k_in_the_decision_record() -> None:
    children, status = settled(SPEC)
    assert status["pools"][0]["effectiveK"] == 3
    status["pools"][0]["effectiveK"] = 5  # the decision, as the decision pass wrote it
    status["speculation"]["lastDecision"] = decision(3, 5)
    failed = canary_then_fail(SPEC, status, children)
    assert failed.status is not None and failed.status.canary is not None
    assert "CanaryFailed" in [event.reason for event in failed.events]
    # Back at K=3 the desired revision is the stable one again, so the canary is gone.
    assert failed.status.canary.phase in ("RolledBack", "Aborted")
    assert [p.effective_k for p in failed.status.pools] == [3]
    assert {p.k for p in failed.pools} == {3}
    assert rendered_k(failed) in ("", "3")  # the stable Deployment still runs K=3: nothing to change there


def test_a_failed_spec_change_canary_keeps_k_even_with_a_matching_old_decision() -> None:
    children, status = settled(SPEC)
    status["speculation"]["lastDecision"] = decision(2, 3)  # an older tuner change, long promoted
    changed = spec_wire(drafters=[drafter_wire("eagle3", "example-org/EAGLE3-v2")],
                        placement={"gfxTargets": ["gfx942"]}, rollout=CANARY)
    failed = canary_then_fail(changed, status, children)
    assert failed.status is not None and failed.status.canary is not None
    assert failed.status.canary.phase == "RolledBack"
    assert [p.effective_k for p in failed.status.pools] == [3]


def test_a_canary_that_ends_in_a_pass_whose_route_is_unreadable_is_announced_with_the_status_it_writes() -> None:
    """A pass whose HTTPRoute GET failed applies nothing, but still writes status, a canary's verdict with it: the
    events announcing that verdict go with that write, or they are never posted (the next pass starts from it)."""
    routed = spec_wire(drafters=[EAGLE3], placement={"gfxTargets": ["gfx942"]},
                       rollout={**CANARY, "canary": {**CANARY["canary"],
                                                     "traffic": {"httpRouteRef": {"name": "llama8b"}}}})
    children, status = settled(routed)
    status["pools"][0]["effectiveK"] = 5  # the K decision pass's record
    status["speculation"]["lastDecision"] = decision(3, 5)
    started = evaluate(observed(routed, status=status, children=children), SETTINGS, T1)
    assert started.status is not None and started.status.canary is not None
    revision = started.status.canary.canary_revision
    canary = [live(o) for o in started.apply if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-canary")]
    model = replace(observed(routed, status=status_wire(started), children=[*children, *canary]),
                    route_error="GET httproutes/llama8b: TimeoutError")
    unread = evaluate(model, SETTINGS, T2, verdicts={revision: FAILED})
    assert unread.apply == [] and unread.delete == [] and unread.status is not None
    assert unread.status.canary is not None and unread.status.canary.phase == "RolledBack"
    assert {"HTTPRouteUnreadable", "CanaryFailed"} <= {e.reason for e in unread.events}, unread.events
