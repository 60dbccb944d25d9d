"""spec.placement.pools[]: one gfx target's pool with its own tensor parallelism, image or replicas (issue 32, item
4), as the example that needs it renders: a 70B target at TP2 on 192 GiB MI300X and TP4 on 64 GiB MI250X GCDs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.reconcile.plan import ReconcilePlan, evaluate
from specdec_runtime import contract
from specdec_runtime.config import RuntimeConfig
from tests.unit.reconcile.reconcilefactories import SETTINGS, T0, observed

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "draft-70b-mi300x-mi250x.yaml"


def example_spec() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text())["spec"])


def pool_objects(plan: ReconcilePlan, gfx: str) -> tuple[dict[str, Any], RuntimeConfig]:
    [deployment] = [o for o in plan.apply if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(gfx)]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    mount = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME)
    [config_map] = [o for o in plan.apply if o["metadata"]["name"] == mount["configMap"]["name"]]
    return container, RuntimeConfig.model_validate_json(config_map["data"][contract.CONFIG_KEY])


def test_each_pool_runs_its_own_tensor_parallelism_in_its_argv_gpus_and_memory() -> None:
    plan = evaluate(observed(example_spec()), SETTINGS, T0)
    mi300x, mi300x_config = pool_objects(plan, "gfx942")
    mi250x, mi250x_config = pool_objects(plan, "gfx90a")
    assert (mi300x_config.tensor_parallel_size, mi250x_config.tensor_parallel_size) == (2, 4)
    assert mi300x["args"][mi300x["args"].index("--tensor-parallel-size") + 1] == "2"
    assert mi250x["args"][mi250x["args"].index("--tensor-parallel-size") + 1] == "4"
    assert mi300x["resources"]["limits"]["amd.com/gpu"] == "2" and mi250x["resources"]["limits"]["amd.com/gpu"] == "4"
    assert plan.status is not None
    assert {p.gfx_target: p.replicas for p in plan.status.pools} == {"gfx942": 2, "gfx90a": 2}


def test_a_pools_image_and_replicas_replace_the_models_for_that_pool_only() -> None:
    wire = example_spec()
    wire["placement"]["pools"] = [{"gfxTarget": "gfx90a", "image": "registry.example.com/team/vllm-cdna2:0.33",
                                   "replicas": 1}]
    plan = evaluate(observed(wire), SETTINGS, T0)
    mi300x, _ = pool_objects(plan, "gfx942")
    mi250x, config = pool_objects(plan, "gfx90a")
    assert mi250x["image"] == "registry.example.com/team/vllm-cdna2:0.33" and mi300x["image"] != mi250x["image"]
    assert config.tensor_parallel_size == 4
    assert plan.status is not None
    assert {p.gfx_target: p.replicas for p in plan.status.pools} == {"gfx942": 2, "gfx90a": 1}


@pytest.mark.parametrize(("pools", "message"), [
    ([{"gfxTarget": "gfx1100", "tensorParallelSize": 2}], r"must be one of spec\.placement\.gfxTargets"),
    ([{"gfxTarget": "gfx942"}, {"gfxTarget": "gfx942"}], "must not name a gfx target twice"),
])
def test_pool_settings_must_name_one_allowed_target_once(pools: list[dict[str, Any]], message: str) -> None:
    wire = example_spec()
    wire["placement"]["pools"] = pools
    with pytest.raises(ValidationError, match=message):
        SpeculativeModelSpec.model_validate(wire)


def test_a_drafter_at_the_targets_tp_must_match_every_pools_tp() -> None:
    wire = example_spec()
    wire["drafters"][0]["draftTensorParallelSize"] = 4
    with pytest.raises(ValidationError, match=r"must equal every spec\.placement\.pools"):
        SpeculativeModelSpec.model_validate(wire)
