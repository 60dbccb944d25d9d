"""Conditions keyed by type: lastTransitionTime moves only when the status flips; observedGeneration always."""

from __future__ import annotations

import pytest

from specdec_operator.api.status import Condition
from specdec_operator.conditions import ConditionUpdate, apply_updates, set_condition

READY_FALSE = Condition(
    type="Ready", status="False", reason="RolloutInProgress", message="waiting", last_transition_time="t0",
    observed_generation=1,
)


@pytest.mark.parametrize(
    ("update", "transition"),
    [
        (ConditionUpdate("Ready", False, "RolloutInProgress", "waiting"), "t0"),
        (ConditionUpdate("Ready", False, "NoCompatibleNodes", "gfx950: no nodes"), "t0"),  # reason alone: no flip
        (ConditionUpdate("Ready", True, "PoolsReady", "all ready"), "t1"),
        (ConditionUpdate("Ready", None, "NodeInventoryEmpty", "holding"), "t1"),
    ],
    ids=["same", "new-reason-same-status", "flip-true", "flip-unknown"],
)
def test_transition_time_moves_only_when_status_flips(update: ConditionUpdate, transition: str) -> None:
    [ready] = set_condition([READY_FALSE], update, generation=2, now="t1")
    assert ready.last_transition_time == transition
    assert (ready.reason, ready.message, ready.observed_generation) == (update.reason, update.message, 2)


@pytest.mark.parametrize(("status", "text"), [(True, "True"), (False, "False"), (None, "Unknown")])
def test_status_text(status: bool | None, text: str) -> None:
    [condition] = set_condition([], ConditionUpdate("Degraded", status, "R", ""), generation=1, now="t0")
    assert (condition.status, condition.last_transition_time) == (text, "t0")


def test_conditions_stay_keyed_by_type_in_a_fixed_order() -> None:
    conditions = apply_updates(
        [READY_FALSE],
        [
            ConditionUpdate("Reduced", True, "DrafterFallback", ""),
            ConditionUpdate("Degraded", False, "AsExpected", ""),
            ConditionUpdate("Ready", False, "RolloutInProgress", "still waiting"),
            ConditionUpdate("Progressing", True, "NewRevision", ""),
        ],
        generation=3,
        now="t1",
    )
    assert [c.type for c in conditions] == ["Ready", "Progressing", "Degraded", "Reduced"]
    assert {c.observed_generation for c in conditions} == {3}
    assert conditions[0].last_transition_time == "t0"


def test_later_update_of_the_same_type_wins() -> None:
    conditions = apply_updates(
        [],
        [ConditionUpdate("Ready", True, "A", ""), ConditionUpdate("Ready", False, "B", "")],
        generation=1,
        now="t0",
    )
    assert [(c.type, c.status, c.reason) for c in conditions] == [("Ready", "False", "B")]
