"""The tuner's K decision and the canary verdict are reached from the pure evaluation (issue 35): `evaluate` reads
the tuning inputs gather() put in the observed model, records a proposed K alone, and says what to commit."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import SpeculativeModelStatus
from specdec_operator.bench.closedloop import settings_for
from specdec_operator.canary.evidence import CanaryWindows
from specdec_operator.reconcile.observed import ObservedModel, TuningInputs
from specdec_operator.reconcile.plan import evaluate, read_status
from specdec_operator.reconcile.tuning_inputs import pool_contexts
from specdec_operator.reconcile.tuning_policy import canary_step_verdicts
from specdec_operator.render.names import service_name
from specdec_operator.tuner.engine import TunerState
from specdec_operator.tuner.samples import ScrapeResult, parse_metrics
from specdec_runtime.simulator.profile import load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.canary.canaryfactories import canary_status
from tests.unit.canary.test_evidence import simulated_windows
from tests.unit.reconcile.reconcilefactories import NAME, NAMESPACE, SETTINGS, live_children, observed, status_wire
from tests.unit.tuner.factories import target

PROFILES = Path(__file__).resolve().parents[3] / "runtime" / "specdec_runtime" / "profiles"
T0, T1 = "2026-12-01T12:00:00Z", "2026-12-01T12:05:00Z"
SPEC = spec_wire(drafters=[drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")],
                 placement={"gfxTargets": ["gfx942"]},
                 speculation={"initialK": 5, "minK": 1, "maxK": 8,
                              "autotune": {"enabled": True, "intervalSeconds": 15, "minSamples": 1000,
                                           "minGain": 0.01}})


def settled() -> ObservedModel:
    """The model after its first pass rendered it and its Deployments rolled out, at K=5."""
    first = evaluate(observed(SPEC), SETTINGS, T0)
    return observed(SPEC, status=status_wire(first), children=live_children(first))


def fed_tuner(pool: str) -> TunerState:
    """A tuner that watched the pool run K=5 on a profile whose best K is 2 for two minutes."""
    state = TunerState()
    replica = VirtualReplica(load_profile(PROFILES / "e2e-opt-k2.yaml"), settings_for(5, "eagle3"), model_name="m",
                             seed=5)
    contexts = pool_contexts(read_status(settled().status).status.pools, {}, set())
    for t in range(5, 125, 5):
        replica.advance_to(float(t))
        state.observe(contexts, [ScrapeResult(target(k=5, pool=pool), float(t), "ok",
                                              parse_metrics(replica.metrics_text()))])
    return state


def with_tuning(model: ObservedModel, state: TunerState, now: float, due_at: float) -> ObservedModel:
    inputs = TuningInputs(state=state, windows=CanaryWindows(), now=now, next_evaluation_at=due_at,
                          decision_id="d-test")
    return dataclasses.replace(model, tuning=inputs)


def test_a_due_evaluation_proposes_k_and_the_plan_records_it_alone() -> None:
    model = settled()
    pool = model.children_of_kind("Deployment")[0]["metadata"]["labels"]["specdec.io/pool"]
    plan = evaluate(with_tuning(model, fed_tuner(pool), 125.0, 120.0), SETTINGS, T1)
    decision = plan.tuning.proposal
    assert decision is not None and decision.from_k == 5 and decision.to_k != 5
    assert decision.id == "d-test" and decision.time == T1  # the gathered audit id, the pass's wall-clock stamp
    # Recorded alone: status carries the new K and the record; nothing is rendered or deleted in this pass.
    assert plan.apply == [] and plan.delete == []
    assert plan.status is not None and plan.status.speculation.last_decision == decision
    assert [p.effective_k for p in plan.status.pools if p.name == decision.pool] == [decision.to_k]
    assert [e.reason for e in plan.events] == ["KChanged" if decision.action == "Change" else "KExplore"]
    assert plan.tuning.proposed_at == 125.0 and plan.tuning.next_evaluation_at == 125.0 + 15
    assert plan.tuning.report is not None


def test_an_evaluation_not_due_decides_nothing_and_keeps_its_due_time() -> None:
    model = settled()
    pool = model.children_of_kind("Deployment")[0]["metadata"]["labels"]["specdec.io/pool"]
    plan = evaluate(with_tuning(model, fed_tuner(pool), 125.0, 130.0), SETTINGS, T1)
    assert plan.tuning.proposal is None and plan.tuning.report is None
    assert plan.tuning.next_evaluation_at == 130.0
    # autotune just switched on (no due time yet): a fresh interval starts now.
    plan = evaluate(with_tuning(model, fed_tuner(pool), 125.0, math.inf), SETTINGS, T1)
    assert plan.tuning.proposal is None and plan.tuning.next_evaluation_at == 140.0


def test_without_autotune_nothing_is_evaluated_and_the_loop_is_not_woken_for_it() -> None:
    spec = spec_wire(**{**SPEC, "speculation": {**SPEC["speculation"], "autotune": {"enabled": False}}})
    first = evaluate(observed(spec), SETTINGS, T0)
    model = observed(spec, status=status_wire(first), children=live_children(first))
    plan = evaluate(with_tuning(model, TunerState(), 125.0, 120.0), SETTINGS, T1)
    assert plan.tuning.proposal is None and plan.tuning.report is None
    assert plan.tuning.next_evaluation_at == math.inf


def routed_step(canary_weight: int) -> tuple[ObservedModel, SpeculativeModelSpec, SpeculativeModelStatus]:
    """A canary step in flight behind our HTTPRoute, whose weights give the canary `canary_weight` percent."""
    wire = spec_wire(rollout={"strategy": "Canary", "canary": {
        "traffic": {"httpRouteRef": {"name": "llm"}},
        "analysis": {"minRequests": 20, "minDrafts": 200}}})
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": "llm", "namespace": NAMESPACE},
             "spec": {"rules": [{"backendRefs": [
                 {"name": service_name(NAME, "stable"), "port": 8000, "weight": 100 - canary_weight},
                 {"name": service_name(NAME, "canary"), "port": 8000, "weight": canary_weight}]}]},
             # A Gateway has accepted the route as it is, so its weights are the split in force.
             "status": {"parents": [{"parentRef": {"name": "inference-gateway"}, "conditions": [
                 {"type": "Accepted", "status": "True"}]}]}}
    model = dataclasses.replace(observed(wire), route=route, route_read=True)
    previous = SpeculativeModelStatus(canary=canary_status(
        stable_revision="stable", canary_revision="canary", weight=canary_weight))
    return model, SpeculativeModelSpec.model_validate(wire), previous


def test_a_routed_step_whose_sides_served_other_shares_than_the_weights_holds_on_a_sample_ratio_mismatch() -> None:
    # Two identical pods that each served half the requests: right for a 50% weight, not for 20%.
    windows = simulated_windows("quick", "quick", seconds=120.0)
    for weight, expected in ((50, ("Pass", "ThresholdsMet")), (20, ("Inconclusive", "TrafficMismatch"))):
        model, spec, previous = routed_step(weight)
        inputs = TuningInputs(state=TunerState(), windows=windows, now=0.0, next_evaluation_at=math.inf)
        verdict = canary_step_verdicts(model, inputs, spec, previous)["canary"]
        assert verdict is not None and (verdict.outcome, verdict.reason) == expected, verdict.message
    assert "sample-ratio mismatch: the canary served 50.0% of the requests, its weight says 20.0%" in verdict.message
