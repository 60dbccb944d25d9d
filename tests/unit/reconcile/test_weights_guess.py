"""Ready says when the target's size is a guess from its name, so a platform engineer knows what memory and the
drafter's fit rest on (issue 32, item 4)."""

from __future__ import annotations

from specdec_operator.reconcile.plan import evaluate
from tests.unit.api.specfactories import spec_wire
from tests.unit.reconcile.reconcilefactories import SETTINGS, T0, T1, condition, live_children, observed, status_wire


def ready_message(wire: dict) -> str:  # type: ignore[type-arg]
    first = evaluate(observed(wire), SETTINGS, T0)
    second = evaluate(observed(wire, status=status_wire(first), children=live_children(first)), SETTINGS, T1)
    status, reason, message = condition(second, "Ready")
    assert (status, reason) == ("True", "PoolsReady"), message
    return message


def test_a_size_guessed_from_the_name_is_named_in_ready_and_a_declared_one_is_not() -> None:
    guessed = ready_message(spec_wire(model={"name": "RedHatAI/Llama-3.1-8B-Instruct-FP8"}))
    assert "guessed from the model's name" in guessed and "8-bit as its name says" in guessed, guessed
    assert "spec.model.weightsGib" in guessed
    declared = ready_message(spec_wire(model={"name": "RedHatAI/Llama-3.1-8B-Instruct-FP8", "weightsGib": 8.5}))
    assert "guessed" not in declared, declared
