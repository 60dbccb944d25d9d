"""A proposed K change is remembered only once it is in status (the reconciler calls `commit` after the write).

The issue's reproduction: a decision whose status write failed must not leave the tuner believing it left
a K it never left, or a real improvement is later held by the doubled return threshold and the cooldown.
"""

from __future__ import annotations

from pathlib import Path

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.bench.closedloop import settings_for
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.policy import RETURN_GAIN_FACTOR
from specdec_operator.tuner.samples import ScrapeResult, parse_metrics
from specdec_runtime.simulator.profile import load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from tests.unit.tuner.factories import target

PROFILES = Path(__file__).resolve().parents[3] / "runtime" / "specdec_runtime" / "profiles"
COOLDOWN_S = 60


def _pool(k: int) -> PoolContext:
    # Pods Ready within a second: the restart costs next to nothing, so the threshold is minGain's (the restart's
    # cost is test_restart_cost.py's).
    return PoolContext(name="p", gfx_target="gfx942", drafter_method="eagle3", effective_k=k, replicas=1, ready_s=1.0)


def _feed(state: TunerState, replica: VirtualReplica, start: int, stop: int, k: int) -> None:
    for t in range(start, stop, 5):
        replica.advance_to(float(t))
        state.observe([_pool(k)], [ScrapeResult(target(k=k), float(t), "ok", parse_metrics(replica.metrics_text()))])


def _speculation(min_gain: float) -> Speculation:
    autotune = Autotune(interval_seconds=15, cooldown_seconds=COOLDOWN_S, min_samples=1000, min_gain=min_gain)
    return Speculation(initial_k=5, min_k=0, max_k=10, autotune=autotune)


def _first_proposal_gain() -> float:
    """The gain the tuner predicts for leaving K=5 on the K=2 profile, to set minGain just below it."""
    state, replica = TunerState(), VirtualReplica(
        load_profile(PROFILES / "e2e-opt-k2.yaml"), settings_for(5, "eagle3"), model_name="m", seed=5)
    _feed(state, replica, 5, 125, 5)
    decision = state.evaluate(125.0, [_pool(5)], _speculation(0.01)).decision
    assert decision is not None and decision.from_k == 5
    return decision.predicted_gain


def test_a_proposal_whose_write_failed_is_proposed_again_at_the_same_threshold() -> None:
    gain = _first_proposal_gain()
    # The real gain sits between minGain and the doubled return threshold, like the issue's +4% vs 3%/6%.
    speculation = _speculation(gain / 1.5)
    assert speculation.autotune.min_gain < gain < speculation.autotune.min_gain * RETURN_GAIN_FACTOR

    def run(seen_at_k2: bool, commit_before_write_fails: bool = False) -> tuple[str, str]:
        state, replica = TunerState(), VirtualReplica(
            load_profile(PROFILES / "e2e-opt-k2.yaml"), settings_for(5, "eagle3"), model_name="m", seed=5)
        if seen_at_k2:
            state.evaluate(1.0, [_pool(2)], speculation)  # the pool ran K=2 before: moving there is a return
        _feed(state, replica, 5, 125, 5)
        first = state.evaluate(125.0, [_pool(5)], speculation)
        proposal = first.decision
        if proposal is None:
            return first.decisions[0].action, first.decisions[0].reason
        assert proposal.action == "Change" and proposal.from_k == 5
        if commit_before_write_fails:
            # The old code committed inside evaluate(). Even so, the tuner's K follows the pool's K in status,
            # so no phantom K is left behind: only the cooldown runs (test_only_commit_starts_the_cooldown).
            state.commit(proposal, 125.0)
        # The status write failed: the cluster still runs K=5, and the tuner keeps observing it there.
        _feed(state, replica, 130, 130 + COOLDOWN_S + 30, 5)
        later = state.evaluate(130.0 + COOLDOWN_S + 30, [_pool(5)], speculation)
        decision = later.decisions[0]
        return decision.action, decision.reason

    action, reason = run(seen_at_k2=False)
    assert action == "Change", reason
    action, reason = run(seen_at_k2=False, commit_before_write_fails=True)
    assert action == "Change", reason
    # The defect this guards against: a K the tuner believes it left makes K=2 a return, held at the doubled
    # threshold. Only a K the pool really ran may do that.
    return_action, return_reason = run(seen_at_k2=True)
    assert return_action == "Hold" and "below" in return_reason, return_reason


def test_only_commit_starts_the_cooldown() -> None:
    state, replica = TunerState(), VirtualReplica(
        load_profile(PROFILES / "e2e-opt-k2.yaml"), settings_for(5, "eagle3"), model_name="m", seed=5)
    _feed(state, replica, 5, 125, 5)
    speculation = _speculation(0.01)
    proposal = state.evaluate(125.0, [_pool(5)], speculation).decision
    assert proposal is not None and state.last_change_at is None
    _feed(state, replica, 130, 200, 5)
    again = state.evaluate(200.0, [_pool(5)], speculation).decision
    assert again is not None and again.to_k == proposal.to_k and state.last_change_at is None
    state.commit(again, 200.0)
    assert state.last_change_at == 200.0
