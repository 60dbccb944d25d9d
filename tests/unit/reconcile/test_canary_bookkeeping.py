"""Issue 21's bookkeeping defects, through the reconciler's pure evaluation: a failed tuner canary is recorded
once as RolledBack with its verdict, the K it failed is recorded for the tuner in the same write, a new
decision to that K canaries again instead of being silently reverted, and KChanged comes with the promotion."""

from __future__ import annotations

from typing import Any

from specdec_operator.api.spec import Canary, Rollout, SpeculativeModelSpec
from specdec_operator.canary.analysis import Verdict
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.reconcile.reconcilefactories import SETTINGS, T0, T1, T2, live, observed, status_wire
from tests.unit.reconcile.test_k_rollback import EAGLE3, POOL, SPEC, canary_then_fail, decision, settled

T3 = "2026-11-29T10:15:00Z"
T4 = "2026-11-29T10:20:00Z"
PASSED = Verdict("Pass", "ThresholdsMet", "goodput per sequence 30.1 vs 27.0 (ratio 1.11 >= 0.99)")


def failed_k_change() -> tuple[list[dict[str, Any]], ReconcilePlan]:
    children, status = settled(SPEC)
    status["pools"][0]["effectiveK"] = 5  # the decision, as the decision pass wrote it
    status["speculation"]["lastDecision"] = {**decision(3, 5), "predictedGain": 0.12}
    return children, canary_then_fail(SPEC, status, children)


def reasons(plan: ReconcilePlan) -> list[str]:
    return [event.reason for event in plan.events]


def test_a_failed_tuner_canary_is_recorded_once_as_rolled_back_with_its_verdict() -> None:
    _, failed = failed_k_change()
    assert failed.status is not None and failed.status.canary is not None
    assert reasons(failed).count("CanaryFailed") == 1
    assert "CanaryCancelled" not in reasons(failed)
    canary = failed.status.canary
    assert (canary.phase, canary.verdict) == ("RolledBack", "Fail")
    assert "accepted length 1.4 vs stable 2.7" in canary.message
    assert [p.effective_k for p in failed.status.pools] == [3]


def test_the_rolled_back_k_is_in_status_with_the_rollback_itself() -> None:
    _, failed = failed_k_change()
    assert failed.status is not None and failed.status.canary is not None
    [rejected] = failed.status.speculation.rejected_ks
    assert (rejected.pool, rejected.k, rejected.predicted_gain) == (POOL, 5, 0.12)
    assert rejected.stable_revision == failed.status.canary.stable_revision == failed.status.pools[0].revision
    assert rejected.reason == "ThresholdsMissed"


def test_the_pass_after_a_rollback_changes_nothing() -> None:
    children, failed = failed_k_change()
    after = evaluate(observed(SPEC, status=status_wire(failed), children=children), SETTINGS, T3)
    assert after.status is not None and after.status.canary is not None
    assert reasons(after) == []
    assert after.status.canary.phase == "RolledBack"
    assert len(after.status.speculation.rejected_ks) == 1


def test_a_new_decision_to_a_rolled_back_k_canaries_again_instead_of_a_silent_revert() -> None:
    children, failed = failed_k_change()
    status = status_wire(failed)
    # The tuner's evidence overturned the rejection (tuner/policy.py): a new decision, recorded first.
    status["pools"][0]["effectiveK"] = 5
    status["speculation"]["lastDecision"] = {**decision(3, 5), "id": "d2", "time": T3}
    again = evaluate(observed(SPEC, status=status, children=children), SETTINGS, T4)
    assert again.status is not None and again.status.canary is not None
    assert "CanaryStarted" in reasons(again)
    assert again.status.canary.phase == "Progressing"
    assert again.status.canary.decision_id == "d2"
    assert [p.effective_k for p in again.status.pools] == [5]


def test_k_changed_is_posted_when_the_canary_promotes_the_decision() -> None:
    children, status = settled(SPEC)
    status["pools"][0]["effectiveK"] = 5
    status["speculation"]["lastDecision"] = decision(3, 5)
    started = evaluate(observed(SPEC, status=status, children=children), SETTINGS, T1)
    assert started.status is not None and started.status.canary is not None
    assert "KChanged" not in reasons(started)
    revision = started.status.canary.canary_revision
    canary = [live(obj) for obj in started.apply if obj["kind"] == "Deployment"
              and obj["metadata"]["name"].endswith("-canary")]
    plan, moments = started, [T2, T3, T4]
    for moment in moments:
        plan = evaluate(observed(SPEC, status=status_wire(plan), children=[*children, *canary]), SETTINGS, moment,
                        verdicts={revision: PASSED})
        if "KChanged" in reasons(plan):
            break
    assert plan.status is not None and plan.status.canary is not None
    assert plan.status.canary.phase == "Promoted"
    assert reasons(plan).count("KChanged") == 1
    [changed] = [event for event in plan.events if event.reason == "KChanged"]
    assert "K 3 -> 5 rolled out (canary promoted)" in changed.message and "(decision d1)" in changed.message


def test_strategy_canary_alone_gets_the_default_steps_and_analysis() -> None:
    spec = SpeculativeModelSpec.model_validate(spec_wire(rollout={"strategy": "Canary"}))
    assert spec.rollout.canary == Canary()
    assert spec.rollout.canary.analysis.timeout_seconds > sum(s.pause_seconds for s in spec.rollout.canary.steps[:1])
    assert Rollout.model_validate({"strategy": "Canary", "canary": None}).canary == Canary()
    assert Rollout.model_validate({"strategy": "Rolling"}).canary is None


def test_strategy_canary_alone_canaries_a_spec_change_with_thresholds() -> None:
    plain = spec_wire(drafters=[EAGLE3], rollout={"strategy": "Canary"}, placement={"gfxTargets": ["gfx942"]})
    children, status = settled(plain)
    changed = spec_wire(drafters=[drafter_wire("eagle3", "example-org/EAGLE3-v2")], rollout={"strategy": "Canary"},
                        placement={"gfxTargets": ["gfx942"]})
    started = evaluate(observed(changed, status=status, children=children), SETTINGS, T0)
    assert started.status is not None and started.status.canary is not None
    assert started.status.canary.phase == "Progressing"
