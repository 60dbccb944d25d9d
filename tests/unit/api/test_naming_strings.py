"""Every string in the spec that names something is refused at admission when empty or malformed.

The CRD's CEL rule and the pydantic model give the same message, which names the field; each such rule has
an invalid manifest (tests/manifests/invalid) that the e2e suite applies to a real API server
(tests/e2e/test_api.py) and that the models refuse here with the same words. A new string field must
either get a format (api/kubeformats.py) or be listed below as free text with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specdec_operator.api.kubeformats import MODEL_REFERENCE, RELATIVE_PATH, SERVED_MODEL_NAME, SIMULATOR_PROFILE
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.reconcile.plan import validation_message
from tests.unit.api.specfactories import spec_wire
from tests.unit.api.test_crd import ALL_NODES, VALIDATIONS

INVALID = Path(__file__).resolve().parents[2] / "manifests" / "invalid"

# String fields that name nothing, or whose rule sits on the parent object, and why.
NOT_FORMATTED_HERE = {
    "spec.drafters.items.model": "its format depends on the method (import path for custom_class): rule on the drafter",
    "spec.runtime.env.items.value": "free text",
    "spec.runtime.extraArgs.items": "vLLM arguments: the owned-flag rules sit on spec.runtime",
    "spec.runtime.pod.annotations.*": "free text",
    "spec.runtime.pod.volumes.items.mountPath": "a path: rules on the volume (absolute, not an owned path)",
    "spec.runtime.pod.volumes.items.subPath": "a path: rule on the volume (relative, no '..')",
}
# Maps whose keys are resource names: the rule on spec.runtime.resources checks them with the amounts.
KEYS_CHECKED_BY_PARENT = {"spec.runtime.resources.requests", "spec.runtime.resources.limits"}


def spec_string_nodes() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path, node)
        for path, node in ALL_NODES
        if path.startswith("spec.") and node.get("type") == "string" and "enum" not in node
    ]


def format_rules() -> list[str]:
    """Messages of the CEL rules that check a string's format (a `matches` on it), naming strings included."""
    formats = {e["message"] for _, e in VALIDATIONS if ".matches(" in e["rule"] and " must be " in e["message"]}
    return sorted(formats)


def expectation(path: Path) -> str:
    return path.read_text().splitlines()[0].removeprefix("# expect: ")


@pytest.mark.parametrize(("path", "node"), spec_string_nodes(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_spec_string_has_a_format_or_a_reason(path: str, node: dict[str, Any]) -> None:
    rules = node.get("x-kubernetes-validations", [])
    assert rules or path in NOT_FORMATTED_HERE, f"{path}: no format rule and no reason in NOT_FORMATTED_HERE"
    assert "maxLength" in node, f"{path}: no maxLength bounds the cost of its rules"


def test_every_map_has_a_rule_on_its_keys() -> None:
    maps = [p for p, n in ALL_NODES if p.startswith("spec.") and isinstance(n.get("additionalProperties"), dict)]
    unchecked = [
        p for p in maps
        if p not in KEYS_CHECKED_BY_PARENT
        and not any(" keys must be " in e["message"] for e in dict(ALL_NODES)[p].get("x-kubernetes-validations", []))
    ]
    assert maps and unchecked == []


@pytest.mark.parametrize("message", format_rules(), ids=lambda m: m[:70])
def test_every_format_rule_has_an_invalid_manifest_the_models_refuse_in_the_same_words(message: str) -> None:
    manifests = [p for p in sorted(INVALID.glob("*.yaml")) if message.startswith(expectation(p))]
    assert manifests, f"no tests/manifests/invalid file expects {message!r}"
    for manifest in manifests:
        with pytest.raises(ValidationError) as caught:
            SpeculativeModelSpec.model_validate(yaml.safe_load(manifest.read_text())["spec"])
        assert validation_message(caught.value) == message, manifest.name


def _set(overrides: dict[str, Any], dotted: str, value: object) -> dict[str, Any]:
    node = overrides
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return overrides


# One place per naming string that is a plain field; an empty value is refused naming the field.
EMPTY_REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("spec.model.name", _set({}, "model.name", "")),
    ("spec.model.servedName", _set({}, "model.servedName", "")),
    ("spec.model.source.pvcName", _set({}, "model.source.pvcName", "")),
    ("spec.model.source.path", _set({}, "model.source", {"pvcName": "w", "path": ""})),
    ("spec.model.source.hubSecretRef.name", _set({}, "model.source.hubSecretRef", {"name": ""})),
    ("spec.model.source.hubSecretRef.key", _set({}, "model.source.hubSecretRef", {"name": "hf", "key": ""})),
    ("spec.drafters[].model", {"drafters": [{"method": "draft_model", "model": ""}]}),
    ("spec.drafters[].model", {"drafters": [{"method": "custom_class", "model": ""}]}),
    ("spec.runtime.image", _set({}, "runtime.image", "")),
    ("spec.runtime.simulatorProfile", _set({}, "runtime.simulatorProfile", "")),
    ("spec.runtime.env[].name", _set({}, "runtime.env", [{"name": "", "value": "x"}])),
    ("spec.runtime.env[].valueFrom.secretKeyRef.name",
     _set({}, "runtime.env", [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "", "key": "k"}}}])),
    ("spec.runtime.env[].valueFrom.secretKeyRef.key",
     _set({}, "runtime.env", [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": ""}}}])),
    ("spec.runtime.pod.serviceAccountName", _set({}, "runtime.pod.serviceAccountName", "")),
    ("spec.runtime.pod.priorityClassName", _set({}, "runtime.pod.priorityClassName", "")),
    ("spec.runtime.pod.imagePullSecrets[].name", _set({}, "runtime.pod.imagePullSecrets", [{"name": ""}])),
    ("spec.runtime.pod.labels", _set({}, "runtime.pod.labels", {"": "x"})),
    ("spec.runtime.pod.volumes[].name",
     _set({}, "runtime.pod.volumes", [{"name": "", "mountPath": "/x", "emptyDir": {}}])),
    ("spec.runtime.pod.volumes[].secret.secretName",
     _set({}, "runtime.pod.volumes", [{"name": "x", "mountPath": "/x", "secret": {"secretName": ""}}])),
    ("spec.runtime.weightsCache.claimName", _set({}, "runtime.weightsCache.claimName", "")),
    ("spec.placement.tolerations[].key", {"placement": {"tolerations": [{"key": "", "operator": "Exists"}]}}),
    ("spec.rollout.canary.traffic.httpRouteRef.name", {"rollout": {"strategy": "Canary", "canary": {
        "traffic": {"httpRouteRef": {"name": ""}}}}}),
    ("spec.rollout.canary.traffic.httpRouteRef.namespace", {"rollout": {"strategy": "Canary", "canary": {
        "traffic": {"httpRouteRef": {"name": "r", "namespace": ""}}}}}),
]


@pytest.mark.parametrize(("field", "overrides"), EMPTY_REFUSED, ids=[f for f, _ in EMPTY_REFUSED])
def test_an_empty_name_is_refused_naming_the_field(field: str, overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        SpeculativeModelSpec.model_validate(spec_wire(**overrides))
    message = validation_message(caught.value)
    assert message.startswith(f"{field} ") and " must be " in message, message


# huggingface_hub.utils.validate_repo_id's verdicts (huggingface_hub 2.4.0, in vLLM 0.33's venv).
HF_REPO_IDS_VALID = [
    "gpt2", "meta-llama/Llama-3.1-8B-Instruct", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-0.6B", "a", "_a_/b_",
    "org/m.v1-2_b", "a-.b", "x/" + "n" * 96, "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
]
HF_REPO_IDS_INVALID = [
    "", "a/b/c", "-a", "a-", ".a", "a.", "a--b", "a..b", "org/model.git", "x/" + "n" * 97, "org/", "/",
    "org//m", "a b", "org/mod el", "org/m:1", "o" * 97 + "/m",
]
ABSOLUTE_PATHS_VALID = [
    "/models/llama", "/models/.cache/m", "/a", "/root/.cache/huggingface/hub/models--org--m/snapshots/1",
]
ABSOLUTE_PATHS_INVALID = ["/", "/models/", "/models//m", "/models/../etc", "/models/./m", "/mo dels", "/x/y.git"]


def test_model_references_are_hub_repo_ids_or_absolute_paths() -> None:
    valid = HF_REPO_IDS_VALID + ABSOLUTE_PATHS_VALID
    assert [text for text in valid if not MODEL_REFERENCE.valid(text)] == []
    invalid = HF_REPO_IDS_INVALID + ABSOLUTE_PATHS_INVALID + ["models/llama/8b", "./m", "~/m", "C:/m", "é/m"]
    assert [text for text in invalid if MODEL_REFERENCE.valid(text)] == []


def test_weights_paths_stay_inside_the_claim() -> None:
    assert [p for p in ["llama", "org/llama-3.1", ".cache/x", "a/..b/c"] if not RELATIVE_PATH.valid(p)] == []
    bad = ["", "/llama", "llama/", "a//b", "..", "a/../../etc", ".", "a/./b", "a b"]
    assert [p for p in bad if RELATIVE_PATH.valid(p)] == []


def test_served_names_and_simulator_profiles() -> None:
    assert [n for n in ["llama", "meta-llama/Llama-3.1-8B", "a:b@c", "x" * 253] if not SERVED_MODEL_NAME.valid(n)] == []
    assert [n for n in ["", "-x", "--served", "a b", "tab\t", "é", "x" * 254] if SERVED_MODEL_NAME.valid(n)] == []
    good_profiles = ["bursty", "bursty.yaml", "/etc/profiles/p.yaml", "profiles/p_1.json"]
    assert [n for n in good_profiles if not SIMULATOR_PROFILE.valid(n)] == []
    assert [n for n in ["", "-p", "--seed=1", "a//b", "a/", "p q"] if SIMULATOR_PROFILE.valid(n)] == []
