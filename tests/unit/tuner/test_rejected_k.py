"""After a rolled-back K change the tuner does not propose that K again for the same revision until the
evidence says otherwise: a predicted gain REJECTED_MARGIN above the one that failed, at confidence CONFIDENT."""

from __future__ import annotations

from specdec_operator.api.status import PoolStatus, RejectedK
from specdec_operator.reconcile.tuning_inputs import pool_contexts
from specdec_operator.tuner.policy import REJECTED_MARGIN
from tests.unit.tuner.test_policy import decided, evidence


def test_a_clear_gain_is_what_the_rejection_is_tested_against() -> None:
    free = decided(evidence(k=5))
    assert (free.action, free.to_k) == ("Change", 2)
    assert free.predicted_gain > 0.2


def test_a_rejected_k_is_not_proposed_again_on_the_same_evidence() -> None:
    gain = decided(evidence(k=5)).predicted_gain
    held = decided(evidence(k=5, rejected={2: gain}))
    assert held.to_k != 2
    # The next best K is still open: only the failed one is off the table.
    assert held.action in ("Hold", "Change", "Explore")


def test_the_evidence_says_otherwise_when_the_predicted_gain_clears_the_failed_one_by_the_margin() -> None:
    gain = decided(evidence(k=5)).predicted_gain
    # The failed canary had been predicted a smaller gain than the tuner sees now, by more than the margin.
    again = decided(evidence(k=5, rejected={2: gain - REJECTED_MARGIN - 0.01}))
    assert (again.action, again.to_k) == ("Change", 2)
    # Within the margin it stays rejected.
    still = decided(evidence(k=5, rejected={2: gain - REJECTED_MARGIN + 0.01}))
    assert still.to_k != 2


def test_rejections_apply_to_the_revision_they_were_recorded_against_only() -> None:
    pool = PoolStatus.model_validate({"name": "p", "gfxTarget": "gfx942", "drafter": {"method": "eagle3"},
                                      "effectiveK": 5, "revision": "rev-a"})
    record = RejectedK(pool="p", k=2, stable_revision="rev-a", time="2026-11-30T12:00:00Z", predicted_gain=0.1)
    [context] = pool_contexts([pool], {}, set(), [record])
    assert context.rejected == {2: 0.1}
    moved = pool.model_copy(update={"revision": "rev-b"})  # a spec change since: a new baseline
    [context] = pool_contexts([moved], {}, set(), [record])
    assert context.rejected == {}
