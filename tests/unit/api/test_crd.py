"""The generated CRD: structural, fully described, CEL rules that name their field, columns, committed copy."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from specdec_operator.api.crdgen import build_crd
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.vocabulary import GFX_TARGETS, SPECULATIVE_METHODS
from specdec_operator.cli import main as cli_main
from specdec_operator.crdfiles import CRD_PATHS, REPO_ROOT, check_crd_files

Schema = dict[str, Any]
CRD = build_crd()
VERSION = CRD["spec"]["versions"][0]
ROOT: Schema = VERSION["schema"]["openAPIV3Schema"]
# JSON Schema constructs a structural OpenAPI v3 schema may not contain.
NOT_STRUCTURAL = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const", "prefixItems", "discriminator"}


def schema_nodes(node: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node with a dotted path (`items` for list elements, `*` for map values)."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, f"{path}.{name}".lstrip("."))
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}.items")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}.*")


def at(path: str) -> Schema:
    """Schema node for a field path such as `spec.drafters[].model` or `status.summary.pools`."""
    node = ROOT
    for part in path.split("."):
        name, is_list = part.removesuffix("[]"), part.endswith("[]")
        assert name in node.get("properties", {}), f"{path}: no field {name!r}"
        node = node["properties"][name]
        if is_list:
            node = node["items"]
    return node


ALL_NODES = list(schema_nodes(ROOT))
VALIDATIONS = [
    (path, entry) for path, node in ALL_NODES for entry in node.get("x-kubernetes-validations", [])
]


def structural_problems(path: str, node: Schema) -> list[str]:
    problems = [f"{path}: {key}" for key in sorted(NOT_STRUCTURAL & node.keys())]
    if "type" not in node and node.get("x-kubernetes-preserve-unknown-fields") is not True:
        problems.append(f"{path}: no type")
    if "default" in node and (node["default"] is None or isinstance(node["default"], (dict, list))):
        problems.append(f"{path}: default {node['default']!r}")
    # metadata is the one object the API server knows itself.
    fields = {"properties", "additionalProperties", "x-kubernetes-preserve-unknown-fields"}
    if node.get("type") == "object" and path != "metadata" and not fields & node.keys():
        problems.append(f"{path}: object without fields (would be pruned empty)")
    return problems


def test_schema_is_structural() -> None:
    assert [problem for path, node in ALL_NODES for problem in structural_problems(path, node)] == []


def test_every_field_is_described_for_kubectl_explain() -> None:
    # The API server documents ObjectMeta itself; list and map elements inherit their field's text.
    undescribed = [
        path or "<root>"
        for path, node in ALL_NODES
        if path != "metadata" and not path.endswith((".items", ".*")) and not node.get("description", "").strip()
    ]
    assert undescribed == []


def test_required_fields_exist_as_properties() -> None:
    for path, node in ALL_NODES:
        assert set(node.get("required", [])) <= node.get("properties", {}).keys(), path


def test_vocabularies_are_exactly_vllm_033_methods_and_supported_gfx_targets() -> None:
    assert at("spec.drafters[].method")["enum"] == list(SPECULATIVE_METHODS)
    assert at("spec.placement.gfxTargets[]")["enum"] == list(GFX_TARGETS)
    assert "medusa" not in SPECULATIVE_METHODS and "gfx908" not in GFX_TARGETS
    assert at("spec.model.tensorParallelSize")["enum"] == [1, 2, 4, 8]
    assert (at("spec.speculation.maxK")["minimum"], at("spec.speculation.maxK")["maximum"]) == (0, 16)


# (schema path of the rule, a distinctive piece of its message); one row per CEL rule in the CRD.
EXPECTED_RULES = [
    ("spec", "draftTensorParallelSize must be 1 or spec.model.tensorParallelSize"),
    ("spec.model.source", "set either pvcName"),
    ("spec.drafters.items", "spec.drafters[].model is required"),
    ("spec.drafters.items", "spec.drafters[].model must not be set"),
    ("spec.drafters.items", "promptLookupMin must not exceed promptLookupMax"),
    ("spec.drafters.items", "promptLookupMin/Max apply only to methods ngram"),
    ("spec.drafters.items", "method extract_hidden_states is refused"),
    ("spec.drafters.items", "mtpLayers is required for method mtp"),
    ("spec.drafters.items", "mtpLayers applies only to method mtp"),
    ("spec.drafters.items", "dotted import path of a proposer class"),
    ("spec", "initialK must be a K vLLM accepts for every mtp drafter"),
    ("spec.speculation", "spec.speculation.minK must be <= spec.speculation.maxK"),
    ("spec.speculation", "spec.speculation.initialK must lie within [minK, maxK]"),
    ("spec.speculation.autotune", "tpotTargetMs is required when objective is Latency"),
    ("spec.placement", "set replicasPerPool or totalReplicas, not both"),
    ("spec.placement", "gfxTargets must not repeat a target"),
    ("spec.runtime", "extraArgs may not set a flag the operator owns"),
    ("spec.runtime", "extraArgs may not set --attention-config as a whole nor its backend key"),
    ("spec.rollout", "httpRouteRef requires spec.rollout.strategy Canary"),
    ("spec.rollout.canary", "steps[].weight must strictly increase"),
]


def test_every_expected_cel_rule_is_present_and_nothing_else() -> None:
    found = sorted((path, entry["message"]) for path, entry in VALIDATIONS)
    assert len(found) == len(EXPECTED_RULES)
    for path, fragment in EXPECTED_RULES:
        assert any(p == path and fragment in message for p, message in found), (path, fragment)


@pytest.mark.parametrize(("path", "entry"), VALIDATIONS, ids=[e["message"][:60] for _, e in VALIDATIONS])
def test_cel_message_names_a_real_field_under_the_rule(path: str, entry: dict[str, str]) -> None:
    named = re.match(r"spec(\.[A-Za-z\[\]]+)+", entry["message"])
    assert named, f"message does not start with a field path: {entry['message']}"
    field = named.group(0)
    at(field)  # the field exists
    assert field.replace("[]", "").startswith(path.replace(".items", "")), (field, path)


@pytest.mark.parametrize(("path", "entry"), VALIDATIONS, ids=[e["message"][:60] for _, e in VALIDATIONS])
def test_cel_rule_refers_only_to_fields_of_its_node(path: str, entry: dict[str, str]) -> None:
    node = dict(ALL_NODES)[path]
    chains = re.findall(r"\bself((?:\.[A-Za-z]+)+)", entry["rule"])
    assert chains
    for chain in chains:
        current = node
        for name in chain.strip(".").split("."):
            if name in ("all", "exists", "exists_one", "map", "isSorted", "startsWith", "size", "matches"):
                break
            assert name in current.get("properties", {}), f"{entry['rule']}: self{chain}"
            current = current["properties"][name]


def test_names_scope_and_subresources() -> None:
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"]) == ("specdec.io", "Namespaced", "SpeculativeModel")
    assert {"sm", "specmodel"} <= set(spec["names"]["shortNames"])
    assert VERSION["name"] == "v1alpha1" and VERSION["served"] and VERSION["storage"]
    assert VERSION["subresources"] == {"status": {}}
    assert ROOT["required"] == ["spec"]


def test_conditions_are_a_map_keyed_by_a_required_type() -> None:
    conditions = at("status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


PRINTER_COLUMNS = {column["name"]: column for column in VERSION["additionalPrinterColumns"]}


@pytest.mark.parametrize(
    ("name", "json_path", "column_type"),
    [
        ("Ready", '.status.conditions[?(@.type=="Ready")].status', "string"),
        ("Model", ".spec.model.name", "string"),
        ("Drafter", ".status.summary.drafter", "string"),
        ("K", ".status.summary.effectiveK", "string"),
        ("Acceptance", ".status.summary.acceptance", "string"),
        ("Pools", ".status.summary.pools", "integer"),
        ("Age", ".metadata.creationTimestamp", "date"),
    ],
)
def test_printer_column(name: str, json_path: str, column_type: str) -> None:
    column = PRINTER_COLUMNS[name]
    assert (column["jsonPath"], column["type"]) == (json_path, column_type)
    if re.fullmatch(r"\.(spec|status)(\.[A-Za-z]+)+", json_path):
        assert at(json_path.lstrip("."))["type"] == column_type


def test_committed_crd_files_match_the_models() -> None:
    assert check_crd_files() == []
    for path in CRD_PATHS:
        assert yaml.safe_load(path.read_text()) == CRD


def test_crds_generate_check_command_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["crds", "generate", "--check"]) == 0
    assert capsys.readouterr().err == ""


EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))


def example_specs(path: Path) -> list[dict[str, Any]]:
    return [doc["spec"] for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == "SpeculativeModel"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_validate_against_the_schema_and_the_models(path: Path) -> None:
    # OpenAPI 3.0 bounds (boolean exclusiveMinimum) are Draft 4 semantics; x-kubernetes-* keys are ignored.
    validator = jsonschema.Draft4Validator(ROOT["properties"]["spec"])
    specs = example_specs(path)
    assert specs
    for body in specs:
        validator.validate(body)
        SpeculativeModelSpec.model_validate(body)
