"""decide(): table-driven cases of the K policy, each checked for its action, target and evidence."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.tuner.costmodel import StepCoefficients, StepPrediction
from specdec_operator.tuner.estimator import estimate_acceptance
from specdec_operator.tuner.policy import LoadLevel, PoolEvidence, decide
from tests.unit.tuner.factories import chain_delta

STEP = StepCoefficients(base_s=0.022, per_token_s=0.00012, draft_base_s=0.0022, draft_per_token_s=0.00002)
CHAT = [0.72, 0.60, 0.52, 0.47, 0.43, 0.40]
NOW = 10_000.0


def evidence(
    *,
    k: int = 5,
    acceptance: Sequence[float] = CHAT,
    batch: float | None = 48.0,
    samples: float = 50_000,
    step_sd: float = 0.01,
    method: str = "eagle3",
    observed: dict[int, float] | None = None,
    **extra: object,
) -> PoolEvidence:
    windows = {seen: chain_delta(acceptance, seen, drafts) for seen, drafts in (observed or {k: 200_000.0}).items()}
    return PoolEvidence(
        pool=str(extra.pop("pool", "p")),
        current_k=k,
        samples_at_k=samples,
        batch=batch,
        acceptance=estimate_acceptance(windows, method),
        steps={kk: StepPrediction(STEP.seconds(batch or 1.0, kk), step_sd) for kk in range(17)},
        **extra,  # type: ignore[arg-type]
    )


def speculation(**autotune: object) -> Speculation:
    return Speculation(initial_k=3, min_k=0, max_k=10, autotune=Autotune(**autotune))  # type: ignore[arg-type]


def decided(pool: PoolEvidence, spec: Speculation | None = None, last_change_at: float | None = None):  # type: ignore[no-untyped-def]
    outcome = decide([pool], spec or speculation(), now=NOW, last_change_at=last_change_at)
    return outcome.assessments[0].decision


def test_a_clear_confident_gain_changes_k_with_its_evidence() -> None:
    decision = decided(evidence(k=5))
    assert (decision.action, decision.from_k, decision.to_k) == ("Change", 5, 2)
    assert decision.predicted_gain > 0.2
    assert decision.confidence >= 0.9
    assert "K=5 E=" in decision.reason and "K=2 E=" in decision.reason and "B=48.0" in decision.reason


@pytest.mark.parametrize(
    ("pool", "spec", "last_change_at", "reason"),
    [
        (evidence(samples=100), None, None, "100 of 2000 samples"),
        (evidence(), None, NOW - 60, "cooldown 540s left"),
        (evidence(k=2), None, None, "K=2 is best"),
        (evidence(k=3), speculation(min_gain=0.2), None, "gain below 20.0%"),
        (evidence(), speculation(enabled=False), None, "autotune disabled"),
        (evidence(batch=None), None, None, "no usable metrics"),
    ],
    ids=["min-samples", "cooldown", "already-best", "min-gain", "disabled", "no-data"],
)
def test_holds(pool: PoolEvidence, spec: Speculation | None, last_change_at: float | None, reason: str) -> None:
    decision = decided(pool, spec, last_change_at)
    assert decision.action == "Hold"
    assert decision.to_k == decision.from_k
    assert reason in decision.reason


def test_returning_to_the_k_just_left_needs_twice_the_gain() -> None:
    spec = speculation(min_gain=0.05)  # the move 3 -> 2 is predicted +8%
    assert decided(evidence(k=3), spec).action == "Change"
    held = decided(evidence(k=3, previous_k=2), spec)
    assert held.action == "Hold" and "gain below 10.0%" in held.reason


def test_the_return_from_an_exploration_that_measured_worse_needs_only_min_gain() -> None:
    # The pool explored 2 -> 3 and measured K=3 worse by about 8%: going back is the exploration's answer. Held by
    # the doubled return threshold, the pool would keep the worse K it only went to measure.
    spec = speculation(min_gain=0.05)
    back = decided(evidence(k=3, previous_k=2, explored=True), spec)
    assert (back.action, back.to_k) == ("Change", 2)
    # The same move after a confident change 2 -> 3 is a flip back, and the hysteresis holds it.
    assert decided(evidence(k=3, previous_k=2, explored=False), spec).action == "Hold"


def test_doubt_that_blocks_a_jump_explores_one_step_towards_it() -> None:
    # Deep, flat acceptance seen only up to K=3 at a light load: the best K lies far in extrapolated land.
    decision = decided(evidence(k=3, acceptance=[0.9], batch=2.0, step_sd=0.25))
    assert decision.action == "Explore"
    assert decision.to_k == 4
    assert "exploring K=4" in decision.reason


def test_k_outside_the_spec_bounds_is_pulled_back_at_once() -> None:
    decision = decided(evidence(k=12), last_change_at=NOW)
    assert (decision.action, decision.to_k) == ("Change", 10)


def test_speculation_off_without_any_acceptance_evidence_explores_k1() -> None:
    decision = decided(evidence(k=0, observed={}))
    assert (decision.action, decision.to_k) == ("Explore", 1)


def test_block_drafters_compare_only_measured_k_values() -> None:
    pool = evidence(k=5, method="dflash", observed={5: 200_000.0, 2: 200_000.0})
    decision = decided(pool)
    assert (decision.action, decision.to_k) == ("Change", 2)
    alone = decided(evidence(k=5, method="dflash"))
    assert alone.to_k in (0, 5)  # only K=0 (exactly 1 token per step) and the measured K=5 are known


def test_latency_objective_prefers_the_k_that_meets_the_tpot_target() -> None:
    spec = speculation(objective="Latency", tpot_target_ms=9.0)
    decision = decided(evidence(k=1, acceptance=[0.9], batch=2.0), spec)
    assert decision.action in ("Change", "Explore")
    assert decision.to_k > 1


def test_one_pool_at_a_time_and_none_while_a_rollout_runs() -> None:
    pools = [evidence(pool="a", k=5, weight=1.0), evidence(pool="b", k=5, weight=4.0)]
    outcome = decide(pools, speculation(), now=NOW, last_change_at=None)
    assert outcome.decision is not None and outcome.decision.pool == "b"
    held = {a.pool: a.decision for a in outcome.assessments}
    assert held["a"].action == "Hold" and "one pool at a time: b goes first" in held["a"].reason
    rolling = decide(
        [evidence(pool="a", rolling=True), evidence(pool="b")], speculation(), now=NOW, last_change_at=None
    )
    assert rolling.decision is None
    assert all("rollout of pool a still in progress" in a.decision.reason for a in rolling.assessments)


def test_recommended_k_is_reported_even_while_holding() -> None:
    outcome = decide([evidence(samples=10)], speculation(), now=NOW, last_change_at=None)
    assert outcome.assessments[0].recommended_k == 2
    assert outcome.decision is None


def test_a_k_is_scored_over_the_recent_load_levels_not_only_the_current_batch() -> None:
    # Now the pool runs 4 sequences, where a deep K pays; over the forecast it runs 96 most of the time, where
    # K 2 serves most tokens. The K best over the levels is chosen, and the reason says it was scored over them.
    levels = tuple(LoadLevel(batch, weight, {kk: StepPrediction(STEP.seconds(batch, kk), 0.01) for kk in range(17)})
                   for batch, weight in ((4.0, 600.0), (96.0, 3000.0)))
    alone = decided(evidence(k=5, batch=4.0, acceptance=[0.8, 0.74, 0.70, 0.66, 0.63]))
    over = decided(evidence(k=5, batch=4.0, acceptance=[0.8, 0.74, 0.70, 0.66, 0.63], loads=levels))
    assert alone.to_k >= 5
    assert (over.action, over.to_k) == ("Change", 2)
    assert "over 2 recent loads" in over.reason


def _prior_doubt_pool(k: int, measured_sd: float, prior_sd: float, **extra: object) -> PoolEvidence:
    """A pool measured at K only: its step there is known, every other K's rests on the cost priors (a drafter far
    costlier than its prior says makes the mean predict too little gain away from K)."""
    pool = evidence(k=k, acceptance=[0.8, 0.74, 0.7, 0.66, 0.63], batch=4.0, ready_s=60.0, **extra)
    priced = {kk: StepPrediction(pred.seconds, measured_sd if kk == k else prior_sd) for kk, pred in pool.steps.items()}
    return PoolEvidence(**{**pool.__dict__, "steps": priced})


def test_a_gain_the_cost_priors_alone_hide_is_explored_one_step() -> None:
    # At K=5 the mean predicts nothing worth a restart, but only the priors say so: the step times of the other
    # Ks are unmeasured and doubted by 25%. Holding would keep the priors' answer for ever; one step measures it.
    # (K=4 is predicted +2.5%, below 3% + the restart's 0.3%.)
    decision = decided(_prior_doubt_pool(5, 0.01, 0.25))
    assert (decision.action, decision.from_k, decision.to_k) == ("Explore", 5, 4)
    assert "cost priors" in decision.reason


def test_no_exploration_where_the_step_times_are_measured() -> None:
    # The same hold with every K's step measured (only the doubt floor left): nothing to learn, no restart.
    decision = decided(_prior_doubt_pool(5, 0.01, 0.01))
    assert decision.action == "Hold"
    assert "gain below" in decision.reason


def test_exploring_on_prior_doubt_respects_the_cooldown() -> None:
    decision = decided(_prior_doubt_pool(5, 0.01, 0.25), last_change_at=NOW - 60)
    assert decision.action == "Hold"
