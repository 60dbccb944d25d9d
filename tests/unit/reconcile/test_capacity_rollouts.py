"""Rollouts on a full and on a roomy pool, driven through the pure reconcile against a simulated cluster."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from specdec_operator.canary.analysis import Verdict
from specdec_operator.decisions.capacity import FleetClaims
from specdec_operator.gpu.inventory import NodeGpus, PodGpus
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from tests.unit.api.specfactories import spec_wire
from tests.unit.canary.canaryfactories import PASS
from tests.unit.gpu.gpufactories import MI300X, homogeneous_node
from tests.unit.reconcile.clustersim import SimCluster
from tests.unit.reconcile.reconcilefactories import SETTINGS, condition, observed

EAGLE_A = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE_B = "example-org/EAGLE3-LLaMA3.1-Instruct-8B-v2"
START = datetime(2026, 11, 29, 10, 0, 0)
CANARY = {
    "strategy": "Canary",
    "canary": {"steps": [{"weight": 50, "pauseSeconds": 10}, {"weight": 100, "pauseSeconds": 10}],
               "analysis": {"timeoutSeconds": 600}},
}


class AlwaysPass(dict[str, Verdict | None]):
    """Every canary revision passes its analysis: these tests are about capacity, not verdicts."""

    def get(self, key: str, default: Verdict | None = None) -> Verdict | None:  # type: ignore[override]
        return PASS

    def __bool__(self) -> bool:
        return True


def fleet(count: int) -> list[NodeGpus]:
    return [homogeneous_node(f"mi300x-{i}", MI300X, 8, partition="spx_nps1") for i in range(count)]


def model_spec(**rollout: Any) -> dict[str, Any]:
    return spec_wire(
        model={"tensorParallelSize": 8},
        drafters=[{"method": "eagle3", "model": EAGLE_A}],
        speculation={"initialK": 3, "minK": 1, "maxK": 8, "autotune": {"enabled": False}},
        placement={"gfxTargets": ["gfx942"], "replicasPerPool": 2},
        rollout={"strategy": "Rolling", **rollout},
    )


@dataclasses.dataclass
class Run:
    sim: SimCluster
    spec: dict[str, Any]
    status: dict[str, Any] = dataclasses.field(default_factory=dict)
    tick_count: int = 0
    serving: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (stable, canary) ready per tick
    events: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    weights: list[int] = dataclasses.field(default_factory=list)
    plan: ReconcilePlan | None = None

    def reconcile(self) -> ReconcilePlan:
        now = START + timedelta(seconds=30 * self.tick_count)
        self.sim.now = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        seen = dataclasses.replace(
            observed(self.spec, nodes=self.sim.nodes, status=self.status, children=self.sim.observed_children()),
            gpu_claims=FleetClaims.of(self.sim.gpu_pods()),
        )
        plan = evaluate(seen, SETTINGS, self.sim.now, verdicts=AlwaysPass())
        assert plan.status is not None and plan.invalid_spec is None
        self.sim.write(plan)
        self.status = plan.status.to_wire()
        self.events += [(e.reason, e.message) for e in plan.events]
        canary = self.status.get("canary") or {}
        if canary.get("phase") == "Progressing" and canary.get("weight") and (
                not self.weights or self.weights[-1] != canary["weight"]):
            self.weights.append(canary["weight"])
        self.plan = plan
        return plan

    def step(self) -> None:
        self.reconcile()
        self.sim.tick()
        self.tick_count += 1
        self.serving.append((self.sim.serving("stable"), self.sim.serving("canary")))

    def until(self, done: Any, limit: int = 40) -> int:
        for ticks in range(limit):
            self.step()
            if done(self):
                return ticks + 1
        raise AssertionError(f"not done after {limit} ticks: serving {self.serving}, events {self.events}")


def settled(run: Run, revision_count: int = 1) -> bool:
    pods = [p for pods in run.sim.pods.values() for p in pods]
    revisions = {p.revision for p in pods}
    return (len(pods) == 2 and all(p.ready for p in pods) and len(revisions) == revision_count
            and set(run.sim.deployments) == {"llama8b-gfx942"})


def at_desired_revision(run: Run) -> bool:
    wanted = run.sim.deployments["llama8b-gfx942"]["spec"]["template"]["metadata"]["labels"]["specdec.io/revision"]
    pods = [p for pods in run.sim.pods.values() for p in pods]
    return settled(run) and {p.revision for p in pods} == {wanted} and (run.status.get("canary") or {}).get(
        "phase") not in ("Progressing", "Paused") and set(run.sim.deployments) == {"llama8b-gfx942"}


def started(nodes: int, **rollout: Any) -> Run:
    run = Run(SimCluster(fleet(nodes)), model_spec(**rollout))
    run.until(settled)
    run.serving.clear()
    return run


def k_change(run: Run, k: int) -> None:
    run.spec["speculation"].update({"initialK": k, "minK": k, "maxK": k})


def drafter_change(run: Run) -> None:
    run.spec["rollout"] = {**run.spec["rollout"], **CANARY}
    run.spec["drafters"] = [{"method": "eagle3", "model": EAGLE_B}]


def strategy(run: Run) -> tuple[int, int]:
    rolling = run.sim.deployments["llama8b-gfx942"]["spec"]["strategy"]["rollingUpdate"]
    return rolling["maxSurge"], rolling["maxUnavailable"]


def test_k_change_on_a_full_pool_replaces_in_place_and_completes() -> None:
    run = started(2)
    k_change(run, 5)
    ticks = run.until(at_desired_revision)
    assert strategy(run) == (0, 1)
    assert min(s + c for s, c in run.serving) >= 1  # maxUnavailable 1 of 2
    assert run.sim.pending() == 0 and ticks <= 8
    decision = run.status["pools"][0]["rollout"]
    assert decision["mode"] == "InPlace" and "0 of 16 gfx942 GPUs on 2 nodes are free" in decision["reason"]
    assert [r for r, _ in run.events if r.startswith("Rollout")] == ["RolloutInPlace"]


def test_the_same_k_change_surges_when_the_pool_has_room() -> None:
    run = started(3)
    k_change(run, 5)
    run.until(at_desired_revision)
    assert strategy(run) == (1, 0)
    assert min(s + c for s, c in run.serving) >= 2
    assert run.status["pools"][0]["rollout"]["mode"] == "Surge"
    assert any(r == "RolloutSurge" and "8 of 24 gfx942 GPUs" in m for r, m in run.events), run.events


def test_drafter_canary_on_a_full_pool_takes_replicas_from_the_stable_set_and_promotes() -> None:
    run = started(2)
    drafter_change(run)
    run.until(at_desired_revision)
    assert run.weights == [50, 100]
    assert run.status["canary"]["phase"] == "Promoted"
    assert min(s + c for s, c in run.serving) >= 1
    # Never more replicas than the pool holds: stable + canary stayed within 2 (16 GPUs) at every tick.
    assert max(s + c for s, c in run.serving) <= 2
    assert run.status["pools"][0]["rollout"]["mode"] == "InPlace"
    reasons = [r for r, _ in run.events]
    for reason in ("RolloutInPlace", "CanaryStarted", "CanaryStepPassed", "CanaryPromoted"):
        assert reason in reasons, reasons
    assert "CanaryTimedOut" not in reasons


def test_drafter_canary_with_room_surges_without_dropping_a_serving_replica() -> None:
    run = started(5)  # 16 serve, 24 free: the canary's 2 replicas and the promotion's surge fit beside
    drafter_change(run)
    run.until(at_desired_revision)
    assert run.weights == [50, 100]
    assert min(s + c for s, c in run.serving) >= 2, run.serving
    assert run.status["pools"][0]["rollout"]["mode"] == "Surge"


def test_canary_steps_hold_their_replica_split_on_a_full_pool() -> None:
    run = started(2)
    drafter_change(run)
    split_at_50: set[tuple[int, int]] = set()

    def done(current: Run) -> bool:
        canary = current.status.get("canary") or {}
        if canary.get("phase") == "Progressing" and canary.get("weight") == 50:
            split_at_50.add(current.serving[-1])
        return at_desired_revision(current)

    run.until(done)
    # While 50% of traffic goes to the canary, one replica serves on each side.
    assert split_at_50 and all(stable >= 1 and canary >= 1 for stable, canary in split_at_50), split_at_50


def test_max_unavailable_two_replaces_two_at_once() -> None:
    run = started(2, maxUnavailable=2)
    k_change(run, 5)
    ticks = run.until(at_desired_revision)
    assert strategy(run) == (0, 2) and ticks <= 5


def test_max_surge_zero_replaces_in_place_even_with_room() -> None:
    run = started(4, maxSurge=0)
    k_change(run, 5)
    run.until(at_desired_revision)
    assert strategy(run) == (0, 1)
    assert "spec.rollout.maxSurge is 0" in run.status["pools"][0]["rollout"]["reason"]


def test_a_surge_whose_free_gpus_were_taken_switches_to_in_place() -> None:
    run = started(3)
    k_change(run, 5)
    run.reconcile()  # the surge decision is taken with 8 free GPUs ...
    assert run.status["pools"][0]["rollout"]["mode"] == "Surge"
    # ... which another workload takes before the surge pod is scheduled.
    run.sim.foreign.append(PodGpus("batch", "trainer", 8, "mi300x-2"))
    run.sim.tick()
    assert run.sim.pending() == 1
    run.until(at_desired_revision)
    decision = run.status["pools"][0]["rollout"]
    assert decision["mode"] == "InPlace" and "cannot be scheduled" in decision["reason"], decision
    assert strategy(run) == (0, 1)


def test_other_workloads_gpus_cap_the_pool_and_the_shortfall_is_a_condition() -> None:
    sim = SimCluster(fleet(2), foreign=[PodGpus("batch", "trainer", 8, "mi300x-0")])
    run = Run(sim, model_spec())
    run.until(lambda r: sum(p.ready for pods in r.sim.pods.values() for p in pods) == 1)
    assert run.plan is not None
    assert run.sim.deployments["llama8b-gfx942"]["spec"]["replicas"] == 1
    status, reason, message = condition(run.plan, "Degraded")
    assert (status, reason) == ("True", "InsufficientGpus")
    assert message == ("gfx942: 1 of 2 replicas fit: 2 at TP 8 need 16 GPUs, but other models and workloads hold "
                       "8 of the 16 GPUs on 2 nodes")
    assert run.sim.pending() == 0


def test_a_pool_with_no_gpu_left_is_not_created_and_says_why() -> None:
    foreign = [PodGpus("batch", f"trainer-{i}", 8, f"mi300x-{i}") for i in range(2)]
    seen = dataclasses.replace(observed(model_spec(), nodes=fleet(2)), gpu_claims=FleetClaims.of(foreign))
    plan = evaluate(seen, SETTINGS, "2026-11-29T10:00:00Z")
    assert not [o for o in plan.apply if o["kind"] == "Deployment"]
    assert condition(plan, "Ready")[:2] == ("False", "InsufficientGpus")
    assert "hold 16 of the 16 GPUs" in condition(plan, "Degraded")[2]


def test_a_pod_pending_past_the_grace_period_is_reported_with_the_schedulers_message() -> None:
    stuck = PodGpus("inference", "llama8b-gfx942-abc", 8, None, "inference/llama8b", "llama8b-gfx942",
                    "0/2 nodes are available: 2 Insufficient amd.com/gpu", "2026-11-29T10:00:00Z")
    seen = dataclasses.replace(observed(model_spec(), nodes=fleet(2)), gpu_claims=FleetClaims.of([stuck]))
    early = evaluate(seen, SETTINGS, "2026-11-29T10:00:20Z")
    assert condition(early, "Degraded")[1] != "PodsUnschedulable"
    late = evaluate(seen, SETTINGS, "2026-11-29T10:01:00Z")
    assert condition(late, "Degraded") == (
        "True", "PodsUnschedulable",
        "pod llama8b-gfx942-abc Pending for 60 s: 0/2 nodes are available: 2 Insufficient amd.com/gpu")


def test_a_budget_change_mid_rollout_redecides_whatever_other_pools_wait_for() -> None:
    run = started(3)
    k_change(run, 5)
    run.step()
    assert run.status["pools"][0]["rollout"]["mode"] == "Surge"
    # Another pool of the model waits for GPUs; this pool's budget changes under its rollout.
    run.sim.foreign.append(PodGpus("inference", "llama8b-gfx90a-x", 8, None, "inference/llama8b", "llama8b-gfx90a",
                                   "0/3 nodes are available", "2026-11-29T09:00:00Z"))
    run.spec["rollout"]["maxSurge"] = 0
    run.until(at_desired_revision)
    decision = run.status["pools"][0]["rollout"]
    assert decision["mode"] == "InPlace" and "cannot be scheduled" not in decision["reason"], decision
