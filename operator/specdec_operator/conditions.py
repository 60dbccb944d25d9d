"""Conditions keyed by type. One helper keeps lastTransitionTime unless the status flips."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specdec_operator.api.status import Condition, ConditionType

CONDITION_ORDER: tuple[ConditionType, ...] = ("Ready", "Progressing", "Degraded", "Tuning")


@dataclass(frozen=True)
class ConditionUpdate:
    type: ConditionType
    status: bool | None  # None = Unknown
    reason: str
    message: str


def route_condition(reason: str, message: str) -> ConditionUpdate:
    """A Gateway that refuses our HTTPRoute (reconcile/route_status.py): the model is degraded, in its words."""
    return ConditionUpdate("Degraded", True, reason, message)


def _status_text(status: bool | None) -> Literal["True", "False", "Unknown"]:
    return "Unknown" if status is None else ("True" if status else "False")


def set_condition(
    existing: Sequence[Condition], update: ConditionUpdate, generation: int, now: str
) -> list[Condition]:
    """Return the conditions with `update` applied; the transition time moves only when status flips."""
    status = _status_text(update.status)
    previous = next((c for c in existing if c.type == update.type), None)
    transition = previous.last_transition_time if previous and previous.status == status else now
    fresh = Condition(
        type=update.type,
        status=status,
        reason=update.reason,
        message=update.message,
        last_transition_time=transition,
        observed_generation=generation,
    )
    merged = [c for c in existing if c.type != update.type] + [fresh]
    return sorted(merged, key=lambda c: CONDITION_ORDER.index(c.type))


def apply_updates(
    existing: Sequence[Condition], updates: Sequence[ConditionUpdate], generation: int, now: str
) -> list[Condition]:
    """Apply updates in order; a later update of a type replaces an earlier one before anything is compared,
    so an intermediate value never resets a condition's lastTransitionTime."""
    last = {update.type: update for update in updates}
    conditions = list(existing)
    for update in last.values():
        conditions = set_condition(conditions, update, generation, now)
    return conditions
