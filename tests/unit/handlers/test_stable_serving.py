"""Whether a canary step has a baseline: a one-replica pool canaried in place has no stable replica."""

from __future__ import annotations

from typing import Any

from specdec_operator.api.status import CanaryStatus
from specdec_operator.reconcile.observed import ObservedModel
from specdec_operator.reconcile.tuning_policy import stable_serving

CANARY = CanaryStatus(pool="m-gfx942", stable_revision="a", canary_revision="b", phase="Progressing", weight=10,
                      step_started_at="2026-12-01T12:00:00Z")


def observed(stable_replicas: int | None) -> ObservedModel:
    children: dict[tuple[str, str], dict[str, Any]] = {}
    if stable_replicas is not None:
        children[("Deployment", "m-gfx942")] = {"kind": "Deployment", "metadata": {"name": "m-gfx942"},
                                                "spec": {"replicas": stable_replicas}}
    return ObservedModel(namespace="ns", name="m", uid="u", generation=1, spec={}, status={}, children=children)


def test_a_stable_deployment_scaled_to_zero_for_an_in_place_canary_is_no_baseline() -> None:
    assert stable_serving(observed(0), CANARY) is False


def test_a_stable_deployment_with_replicas_or_unknown_is_a_baseline() -> None:
    assert stable_serving(observed(1), CANARY) is True
    assert stable_serving(observed(None), CANARY) is True  # not seen yet: never judge without a baseline early
    assert stable_serving(observed(0), None) is True
