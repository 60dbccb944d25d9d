"""Generate the SpeculativeModel CRD from the pydantic models (the one source of the schema).

Pydantic emits JSON Schema with `$ref`s, `anyOf: [X, null]` for optionals and titles; the API server
wants a structural OpenAPI v3 schema. This module inlines and strips until it is one.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from specdec_operator import GROUP, KIND, PLURAL, VERSION
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import SpeculativeModelStatus

JsonSchema = dict[str, Any]

_DROPPED_KEYS = {"title", "$defs"}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "Drafter", "type": "string", "jsonPath": ".status.summary.drafter"},
    {"name": "K", "type": "string", "jsonPath": ".status.summary.effectiveK", "description": "Effective K per pool"},
    {"name": "Acceptance", "type": "string", "jsonPath": ".status.summary.acceptance"},
    {"name": "Pools", "type": "integer", "jsonPath": ".status.summary.pools"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas",
     "description": "Replicas placed across all pools"},
    {"name": "Canary", "type": "string", "jsonPath": ".status.summary.canary", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# `kubectl scale`, an HPA and KEDA drive spec.placement.totalReplicas; status says how many replicas the
# operator placed and which pods are the model's (the HPA reads their metrics through this selector).
SCALE_SUBRESOURCE: dict[str, str] = {
    "specReplicasPath": ".spec.placement.totalReplicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}


def _resolve(node: Any, defs: dict[str, JsonSchema]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        return _resolve({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    any_of = node.get("anyOf")
    if isinstance(any_of, list):
        non_null = [option for option in any_of if option.get("type") != "null"]
        if len(non_null) == 1 and len(non_null) < len(any_of):
            # An Optional field: absence is how Kubernetes spells null.
            return _resolve({**non_null[0], **{k: v for k, v in node.items() if k != "anyOf"}}, defs)
    out: JsonSchema = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "default":
            # null and object defaults stay out of the schema: pydantic applies them when the operator
            # parses the spec, and stored objects should not freeze today's defaults.
            if value is not None and not isinstance(value, (dict, list)):
                out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020 numbers become OpenAPI 3.0's bound plus boolean flag.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key in ("properties",):
            out[key] = {name: _resolve(prop, defs) for name, prop in value.items()}
        else:
            out[key] = _resolve(value, defs)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def openapi_schema(model: type[Any]) -> JsonSchema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _resolve(raw, raw.get("$defs", {}))  # type: ignore[no-any-return]


def build_crd() -> dict[str, Any]:
    spec_schema = openapi_schema(SpeculativeModelSpec)
    status_schema = openapi_schema(SpeculativeModelStatus)
    status_schema["properties"]["conditions"]["x-kubernetes-list-type"] = "map"
    status_schema["properties"]["conditions"]["x-kubernetes-list-map-keys"] = ["type"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["specmodel", "sm"],
                "categories": ["specdec"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": SCALE_SUBRESOURCE},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": SpeculativeModelSpec.__doc__,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version: specdec.io/v1alpha1."},
                                "kind": {"type": "string", "description": "SpeculativeModel."},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated by `specdec-operator crds generate` from specdec_operator.api. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)
