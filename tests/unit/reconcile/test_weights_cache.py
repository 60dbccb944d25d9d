"""WeightsCached says where a model's new pods get their weights, and says it plainly when every new revision (every
K change autotune makes) downloads them again (issue 32, item 3)."""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec_operator.reconcile.observed import EvaluationSettings
from specdec_operator.reconcile.plan import evaluate
from specdec_operator.render.podspec import DEFAULT_POD_SETTINGS
from tests.unit.api.specfactories import spec_wire
from tests.unit.reconcile.reconcilefactories import SETTINGS, T0, condition, observed


def weights_cached(wire: dict[str, Any], settings: EvaluationSettings = SETTINGS) -> tuple[str, str, str]:
    return condition(evaluate(observed(wire), settings, T0), "WeightsCached")


def test_without_a_cache_it_is_false_and_says_autotune_restarts_download_again() -> None:
    status, reason, message = weights_cached(spec_wire())
    assert (status, reason) == ("False", "NoWeightsCache")
    assert "autotune is on" in message and "spec.runtime.weightsCache.claimName" in message
    fixed = spec_wire(speculation={"autotune": {"enabled": False}})
    status, reason, message = weights_cached(fixed)
    assert (status, reason) == ("False", "NoWeightsCache") and "autotune" not in message


def test_a_cache_claim_from_the_spec_or_the_install_a_models_volume_or_the_simulator_is_true() -> None:
    assert weights_cached(spec_wire(runtime={"weightsCache": {"claimName": "hf"}}))[:2] == ("True", "CacheMounted")
    install = dataclasses.replace(SETTINGS, pod=dataclasses.replace(DEFAULT_POD_SETTINGS, weights_cache_claim="hf"))
    assert weights_cached(spec_wire(), install)[:2] == ("True", "CacheMounted")
    opted_out = spec_wire(runtime={"weightsCache": {"enabled": False}})
    assert weights_cached(opted_out, install)[:2] == ("False", "NoWeightsCache")
    on_volume = spec_wire(model={"source": {"pvcName": "llama-weights"}})
    assert weights_cached(on_volume)[:2] == ("True", "WeightsOnVolume")
    assert weights_cached(spec_wire(runtime={"simulate": True}))[:2] == ("True", "Simulated")
