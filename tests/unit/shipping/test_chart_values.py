"""values.yaml against values.schema.json, and the chart's defaults against the operator's own."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from specdec_operator.api.vocabulary import GFX_TARGETS
from specdec_operator.settings import DEFAULT_IMAGE_TARGETS, DEFAULT_IMAGES, OperatorEnvSettings
from tests.unit.shipping.chart import CHART_DIR, load_values


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_default_values_match_the_schema(validator: jsonschema.Draft7Validator) -> None:
    errors = [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(load_values())
    ]
    assert errors == []


def _with(path: str, value: Any) -> dict[str, Any]:
    values = copy.deepcopy(load_values())
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
        node = node[key]
    node[leaf] = value
    return values


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("replicaCount", -1),
        ("watchNamespaces", ["Team_A"]),
        ("watchNamespaces", ["team-a", "team-a"]),
        ("runtime.images", {"gfx908": "vllm/vllm-openai-rocm:v0.33.0"}),  # MI100: vLLM 0.33 has no ROCm support
        ("runtime.images", {"gfx942": "vllm/vllm-openai-rocm"}),  # untagged image floats
        ("runtime.imageTargets", {"vllm/vllm-openai-rocm:v0.33.0": []}),
        ("runtime.pod.security", "privileged"),
        ("runtime.pod.supplementalGroups", ["video"]),
        ("runtime.pod.fsGroup", -1),
        ("runtime.pod.weightsCacheClaim", "HF Cache"),
        ("scrape.intervalSeconds", 0),
        ("scrape.concurrency", 0),
        ("kvHeadroomFraction", 1),
        ("tuner", {"cooldownSeconds": 600}),  # removed: the operator never read it (CRD defaults apply)
        ("metrics.prometheusRule.kThrash.cooldown", "ten minutes"),
        ("peering.name", "Specdec Operator"),
        ("metrics.port", 0),
        ("metrics.serviceMonitor.interval", "thirty seconds"),
        ("podSecurityContext.runAsUser", 0),
        ("podSecurityContext.runAsNonRoot", False),
        ("image.pullPolicy", "Sometimes"),
        ("dashboard.namespace", "Grafana"),
        ("resourcez", {}),  # a typo of a top-level key
    ],
)
def test_schema_rejects(validator: jsonschema.Draft7Validator, path: str, value: Any) -> None:
    assert not validator.is_valid(_with(path, value))


def test_schema_gfx_targets_are_the_api_vocabulary() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert tuple(schema["definitions"]["gfxTarget"]["enum"]) == GFX_TARGETS


def test_runtime_images_default_to_the_operator_defaults() -> None:
    runtime = load_values()["runtime"]
    assert runtime["images"] == DEFAULT_IMAGES
    assert runtime["imageTargets"] == DEFAULT_IMAGE_TARGETS
    assert runtime["simulatorImage"] == OperatorEnvSettings().simulator_image




def test_the_chart_claims_the_kubernetes_versions_the_e2e_suite_runs_on() -> None:
    """kubeVersion's lower bound is the local control plane's minor version: nothing older is tested."""
    import yaml

    from tests.unit.shipping.chart import KUBERNETES_VERSION

    claimed = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["kubeVersion"]
    major, minor, _ = KUBERNETES_VERSION.lstrip("v").split(".")
    assert claimed == f">={major}.{minor}.0-0", (claimed, KUBERNETES_VERSION)
