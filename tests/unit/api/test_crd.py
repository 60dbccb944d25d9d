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
from specdec_operator.api.vocabulary import GFX_PRODUCTS, GFX_TARGETS, SPECULATIVE_METHODS
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
    # Supported gfx targets, then the product aliases of supported targets (api/vocabulary.py).
    assert at("spec.placement.gfxTargets[]")["enum"] == [*GFX_TARGETS, *GFX_PRODUCTS]
    assert "medusa" not in SPECULATIVE_METHODS and "gfx908" not in GFX_TARGETS and "mi100" not in GFX_PRODUCTS
    assert at("spec.model.tensorParallelSize")["enum"] == [1, 2, 4, 8]
    assert (at("spec.speculation.maxK")["minimum"], at("spec.speculation.maxK")["maximum"]) == (0, 16)


NODE_TERMS = "spec.runtime.pod.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution.items"
# (schema path of the rule, a distinctive piece of its message); one row per CEL rule in the CRD.
EXPECTED_RULES = [
    ("spec", "draftTensorParallelSize must be 1 or spec.model.tensorParallelSize"),
    ("spec.model.source", "set either pvcName"),
    ("spec.model.source", "source.path requires spec.model.source.pvcName"),
    ("spec.drafters", "must not list the same method and model twice"),
    ("spec.drafters", "must list at least one drafter"),
    ("spec.runtime.env", "HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES differ"),
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
    ("spec.placement", "bound how totalReplicas is split"),
    ("spec.placement", "maxReplicasPerPool must not be below minReplicasPerPool"),
    ("spec.placement", "pools[].gfxTarget must be one of spec.placement.gfxTargets"),
    ("spec.placement", "pools must not name a gfx target twice"),
    ("spec.placement", "pools[].replicas cannot be set with totalReplicas"),
    ("spec", "must equal every spec.placement.pools[].tensorParallelSize"),
    ("spec.placement.pools.items.image", "spec.placement.pools[].image must be an image reference"),
    ("spec.runtime", "extraArgs may not set a flag the operator owns"),
    ("spec.runtime", "extraArgs may not set --attention-config as a whole nor its backend key"),
    ("spec.runtime", "extraArgs may not set a flag that sizes vLLM's GPUs or nodes"),
    ("spec.rollout", "httpRouteRef requires spec.rollout.strategy Canary"),
    ("spec.rollout", "maxSurge and spec.rollout.maxUnavailable cannot both be 0"),
    ("spec.rollout.canary", "steps[].weight must strictly increase"),
    # Formats and rules of everything that reaches an owned object (api/kubeformats.py, api/pod.py,
    # api/resources.py): admission refuses what the API server would refuse in the Deployment.
    ("spec", "spec.runtime.env may not set HF_TOKEN"),
    ("spec.model.source.pvcName", "must be a DNS-1123 subdomain"),
    # Names of what vLLM loads and serves: refused at admission rather than when vLLM starts.
    ("spec.model.name", "must be a Hugging Face repo id"),
    ("spec.model.servedName", "must be a name of printable ASCII characters without spaces"),
    ("spec.model.source.path", "must be a relative path"),
    ("spec.drafters.items", "spec.drafters[].model must be a Hugging Face repo id"),
    ("spec.runtime.simulatorProfile", "must be a profile name or file path"),
    ("spec.model.source.hubSecretRef.name", "must be a DNS-1123 subdomain"),
    ("spec.model.source.hubSecretRef.key", "must be a key"),
    ("spec.placement.nodeSelector", "keys must be a qualified name"),
    ("spec.placement.nodeSelector.*", "values must be a label value"),
    ("spec.placement.tolerations.items", "value must be empty when operator is Exists"),
    ("spec.placement.tolerations.items", "tolerationSeconds requires effect NoExecute"),
    ("spec.placement.tolerations.items", "key is required unless operator is Exists"),
    ("spec.placement.tolerations.items", "key is required: a keyless Exists toleration matches every taint"),
    ("spec.placement.tolerations.items", "key must not be one of AMD's transient GPU taints"),
    ("spec.placement.tolerations.items.key", "must be a qualified name"),
    ("spec.placement.tolerations.items.value", "must be a label value"),
    ("spec.runtime.image", "must be an image reference"),
    ("spec.runtime.env.items", "set value or valueFrom, not both"),
    ("spec.runtime.env.items.name", "printable ASCII characters other than '='"),
    ("spec.runtime.env.items.valueFrom", "exactly one of secretKeyRef and configMapKeyRef"),
    ("spec.runtime.env.items.valueFrom.secretKeyRef.name", "must be a DNS-1123 subdomain"),
    ("spec.runtime.env.items.valueFrom.secretKeyRef.key", "must be a key"),
    ("spec.runtime.env.items.valueFrom.configMapKeyRef.name", "must be a DNS-1123 subdomain"),
    ("spec.runtime.env.items.valueFrom.configMapKeyRef.key", "must be a key"),
    *[
        row
        for which in ("requests", "limits")
        for row in [
            ("spec.runtime.resources", f"resources.{which} keys must be cpu, memory"),
            ("spec.runtime.resources", f"resources.{which} may not set amd.com/gpu"),
            ("spec.runtime.resources", f"resources.{which}: extended resources such as example.com/device take"),
            ("spec.runtime.resources", f"resources.{which}: a hugepages-<size> amount"),
            (f"spec.runtime.resources.{which}.*", f"resources.{which} values must be non-negative quantities"),
        ]
    ],
    ("spec.runtime.resources", "requests must not exceed spec.runtime.resources.limits"),
    ("spec.runtime.resources", "limits must be set for every extended resource"),
    ("spec.runtime.pod", "pod.labels may not set specdec.io/ keys"),
    ("spec.runtime.pod", "pod.annotations may not set specdec.io/ keys"),
    ("spec.runtime.pod", "mountPath must be unique"),
    ("spec.runtime.pod.labels", "keys must be a qualified name"),
    ("spec.runtime.pod.labels.*", "values must be a label value"),
    ("spec.runtime.pod.annotations", "keys must be a qualified name"),
    ("spec.runtime.pod.serviceAccountName", "must be a DNS-1123 subdomain"),
    ("spec.runtime.pod.priorityClassName", "must be a DNS-1123 subdomain"),
    ("spec.runtime.pod.imagePullSecrets.items.name", "must be a DNS-1123 subdomain"),
    ("spec.runtime.pod.volumes.items", "must set exactly one of secret, configMap"),
    ("spec.runtime.pod.volumes.items", "name may not be runtime-config, dshm, models, hf-cache"),
    ("spec.runtime.pod.volumes.items", "mountPath may not be or lie under /etc/specdec, /dev/shm"),
    ("spec.runtime.pod.volumes.items", "must be an absolute path"),
    ("spec.runtime.pod.volumes.items", "mountPath must not be / nor have an empty, '.' or '..' segment"),
    ("spec.runtime.pod.volumes.items", "subPath must be a relative path"),
    ("spec.runtime.pod.volumes.items.name", "must be a DNS-1123 label"),
    ("spec.runtime.pod.volumes.items.secret.secretName", "must be a DNS-1123 subdomain"),
    ("spec.runtime.pod.volumes.items.configMap.name", "must be a DNS-1123 subdomain"),
    ("spec.runtime.pod.volumes.items.persistentVolumeClaim.claimName", "must be a DNS-1123 subdomain"),
    ("spec.runtime.pod.volumes.items.emptyDir.sizeLimit", "must be a non-negative quantity"),
    ("spec.runtime.weightsCache.claimName", "must be a DNS-1123 subdomain"),
    ("spec.rollout.canary.traffic.httpRouteRef.name", "must be a DNS-1123 subdomain"),
    ("spec.rollout.canary.traffic.httpRouteRef.namespace", "must be a DNS-1123 label"),
    *[
        (f"{NODE_TERMS}.preference.matchExpressions.items{suffix}", fragment)
        for suffix, fragment in [("", "operators In and NotIn need values, Exists and DoesNotExist take none, Gt"),
                                 (".key", "nodeAffinity keys must be a qualified name"),
                                 (".values.items", "nodeAffinity values must be a label value")]
    ],
    *[
        (f"{term}{suffix}", fragment)
        for kind in ("podAffinity", "podAntiAffinity")
        for term in (f"spec.runtime.pod.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution.items",
                     f"spec.runtime.pod.affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution.items"
                     ".podAffinityTerm")
        for suffix, fragment in [
            (".topologyKey", "affinity topologyKey must be a qualified name"),
            (".labelSelector.matchLabels", "labelSelector matchLabels keys must be a qualified name"),
            (".labelSelector.matchLabels.*", "labelSelector matchLabels values must be a label value"),
            (".labelSelector.matchExpressions.items", "labelSelector operators In and NotIn need values"),
            (".labelSelector.matchExpressions.items.key", "labelSelector keys must be a qualified name"),
            (".labelSelector.matchExpressions.items.values.items", "labelSelector values must be a label value"),
        ]
    ],
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
    # A rule on map values (`.*`) names the map; a type used in several places (affinity terms) names the
    # knob it belongs to, and the API server's error path adds the exact place.
    named_path, rule_path = field.replace("[]", ""), path.replace(".items", "").removesuffix(".*")
    assert named_path.startswith(rule_path) or (
        rule_path.startswith("spec.runtime.pod.affinity.") and named_path.startswith("spec.runtime.pod.affinity")
    ), (field, path)


def test_a_message_expression_names_the_field_its_message_names() -> None:
    expressions = [(path, entry) for path, entry in VALIDATIONS if "messageExpression" in entry]
    assert [path for path, _ in expressions] == ["spec.runtime"]  # extraArgs that size vLLM's GPUs or nodes
    for _, entry in expressions:
        field = entry["message"].split(" ", 1)[0]
        assert entry["messageExpression"].startswith(f"'{field} may not set ' + "), entry["messageExpression"]


@pytest.mark.parametrize(("path", "entry"), VALIDATIONS, ids=[e["message"][:60] for _, e in VALIDATIONS])
def test_cel_rule_refers_only_to_fields_of_its_node(path: str, entry: dict[str, str]) -> None:
    node = dict(ALL_NODES)[path]
    chains = re.findall(r"\bself((?:\.[A-Za-z]+)+)", entry["rule"])
    # A rule on a string (a format) refers to the value itself.
    assert chains or (node["type"] == "string" and re.search(r"\bself\b", entry["rule"]))
    methods = ("all", "exists", "exists_one", "map", "filter", "isSorted", "startsWith", "size", "contains", "split",
               "matches", "substring", "endsWith")
    for chain in chains:
        current = node
        for name in chain.strip(".").split("."):
            if name in methods:
                break
            assert name in current.get("properties", {}), f"{entry['rule']}: self{chain}"
            current = current["properties"][name]


def test_names_scope_and_subresources() -> None:
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"]) == ("specdec.io", "Namespaced", "SpeculativeModel")
    assert {"sm", "specmodel"} <= set(spec["names"]["shortNames"])
    assert VERSION["name"] == "v1alpha1" and VERSION["served"] and VERSION["storage"]
    # kubectl scale, an HPA and KEDA drive totalReplicas; status says how many run and which pods they are.
    assert VERSION["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.placement.totalReplicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }}
    assert at("spec.placement.totalReplicas")["type"] == "integer"
    assert at("status.replicas")["type"] == "integer" and at("status.selector")["type"] == "string"
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
