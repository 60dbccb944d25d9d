"""The sources of truth the docs are checked against, each read from the code (never retyped here).

- fields: the SpeculativeModel schema generated from the pydantic models (what `crds generate` writes);
- condition types: `conditions.ConditionType`; reasons and event reasons: the string literals of the operator's
  and the runtime's code (reasons are written as literals where they are decided, or as f-strings);
- metrics: the operator's registry (`specdec_operator.metrics.REGISTRY`);
- alerts: the chart's PrometheusRule template;
- settings: `OperatorEnvSettings` (env `SPECDEC_<FIELD>`), plus the variables the tooling reads;
- chart values: values.yaml; CLI: the argparse trees of `specdec-operator`, `specdec-runtime` and `bench`.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, get_args

import yaml
from pydantic import BaseModel

from tests.unit.docs.corpus import REPO_ROOT

JsonSchema = dict[str, Any]

CAMEL_WORD = re.compile(r"\b[A-Z][A-Za-z0-9]+\b")


# ---------------------------------------------------------------- fields


def model_schema() -> dict[str, JsonSchema]:
    """{"spec": schema, "status": schema} from the pydantic models, as the CRD generator builds them."""
    from specdec_operator.api.crdgen import openapi_schema
    from specdec_operator.api.spec import SpeculativeModelSpec
    from specdec_operator.api.status import SpeculativeModelStatus

    return {"spec": openapi_schema(SpeculativeModelSpec), "status": openapi_schema(SpeculativeModelStatus)}


# Top-level fields of other kinds' spec and status that the docs name (a Deployment's `spec.replicas`, an
# HTTPRoute's `status.parents`). Kubernetes kinds come from the client's models; the two CRDs the operator
# works with but does not define are listed from their upstream schemas.
_KUBERNETES_MODELS = (
    "V1DeploymentSpec",
    "V1DeploymentStatus",
    "V1PodSpec",
    "V1PodStatus",
    "V1ServiceSpec",
    "V1ServiceStatus",
    "V1PodDisruptionBudgetSpec",
    "V1PodDisruptionBudgetStatus",
    "V2HorizontalPodAutoscalerSpec",
    "V2HorizontalPodAutoscalerStatus",
    "V1ScaleSpec",
    "V1ScaleStatus",
    "V1NodeSpec",
    "V1NodeStatus",
)
OTHER_KINDS: dict[str, dict[str, tuple[str, ...]]] = {
    # Gateway API v1 HTTPRoute (gateway.networking.k8s.io): the canary's traffic split is written there.
    "HTTPRoute": {"spec": ("parentRefs", "hostnames", "rules"), "status": ("parents",)},
    # Gateway API v1 Gateway and v1beta1 ReferenceGrant: what attaches and admits the route's backends.
    "Gateway": {"spec": ("gatewayClassName", "listeners", "addresses", "infrastructure"),
                "status": ("addresses", "conditions", "listeners")},
    "ReferenceGrant": {"spec": ("from", "to"), "status": ()},
    # Prometheus Operator monitors and rules: the chart's ServiceMonitor, PodMonitor and PrometheusRule.
    "ServiceMonitor/PodMonitor/PrometheusRule": {
        "spec": ("endpoints", "podMetricsEndpoints", "selector", "namespaceSelector", "jobLabel", "groups"),
        "status": (),
    },
    # Argo CD Application: docs/gitops.md.
    "Application": {"spec": ("source", "sources", "destination", "syncPolicy", "ignoreDifferences", "project"),
                    "status": ("health", "sync", "operationState", "resources")},
    # KEDA v2 ScaledObject (keda.sh): docs/autoscaling.md scales a model through it.
    "ScaledObject": {
        "spec": (
            "scaleTargetRef",
            "pollingInterval",
            "cooldownPeriod",
            "initialCooldownPeriod",
            "idleReplicaCount",
            "minReplicaCount",
            "maxReplicaCount",
            "advanced",
            "triggers",
            "fallback",
        ),
        "status": (
            "scaleTargetKind",
            "originalReplicaCount",
            "externalMetricNames",
            "health",
            "pausedReplicaCount",
            "hpaName",
        ),
    },
}


def foreign_top_fields() -> dict[str, set[str]]:
    from kubernetes_asyncio import client

    found: dict[str, set[str]] = {"spec": set(), "status": set()}
    for name in _KUBERNETES_MODELS:
        part = "spec" if name.endswith("Spec") else "status"
        found[part] |= set(getattr(client, name).attribute_map.values())
    for kind in OTHER_KINDS.values():
        for part, names in kind.items():
            found[part] |= set(names)
    return found


def walk_schema(schema: JsonSchema, segments: list[str]) -> str | None:
    """None if the path exists in the schema, else what is wrong with it."""
    node = schema
    walked: list[str] = []
    for segment in segments:
        name, is_list = segment.removesuffix("[]"), segment.endswith("[]")
        if "properties" not in node and node.get("type") == "array" and "items" in node:
            node = node["items"]  # `drafters.model` read as `drafters[].model`
        properties = node.get("properties")
        if properties is None:
            if node.get("x-kubernetes-preserve-unknown-fields") or node.get("additionalProperties"):
                return None  # a free-form map (env, pod knobs passed through): any key
            return f"{'.'.join(walked) or 'it'} has no field {name!r}"
        if name not in properties:
            return (
                f"{'.'.join(walked) or 'the top level'} has no field {name!r} (fields: {', '.join(sorted(properties))})"
            )
        node = properties[name]
        walked.append(segment)
        if is_list:
            if node.get("type") != "array":
                return f"{'.'.join(walked)} is not a list"
            node = node["items"]
    return None


# ---------------------------------------------------------------- conditions and reasons


def condition_types() -> set[str]:
    from specdec_operator.api.status import ConditionType  # the type conditions.py decides and writes

    return set(get_args(ConditionType))


# Condition types of other objects whose `Type=Status` the docs quote: the Gateway API's route conditions,
# which the operator reads (reconcile/route_status.py) but does not own.
FOREIGN_CONDITION_TYPES = {"Accepted": "Gateway API route condition", "ResolvedRefs": "Gateway API route condition"}


@dataclass
class Vocabulary:
    """CamelCase words the code writes as strings (reasons, event reasons, kinds) and its class names."""

    words: set[str] = field(default_factory=set)
    patterns: list[re.Pattern[str]] = field(default_factory=list)  # f-strings such as f"Rollout{mode}"

    def knows(self, token: str) -> bool:
        return token in self.words or any(pattern.fullmatch(token) for pattern in self.patterns)


def _python_files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
        else:
            yield from sorted(root.rglob("*.py"))


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of bare string statements (docstrings): prose, not what the code writes."""
    return {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _prose_nodes(tree: ast.AST) -> set[int]:
    """Docstrings, and the `description=`/`help=` texts of fields and CLI options: prose that documents a
    name (and is itself checked as a doc through the CRD), not a name the code writes."""
    prose = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("description", "help"):
            prose |= {id(inner) for inner in ast.walk(node.value)}
    return prose


def code_vocabulary(root: Path = REPO_ROOT) -> Vocabulary:
    vocabulary = Vocabulary()
    for path in _python_files(root / "operator" / "specdec_operator", root / "runtime" / "specdec_runtime"):
        tree = ast.parse(path.read_text())
        prose = _prose_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
                vocabulary.words.update(CAMEL_WORD.findall(node.value))
            elif isinstance(node, ast.ClassDef):
                vocabulary.words.add(node.name)
            elif isinstance(node, ast.JoinedStr):
                parts = [
                    re.escape(str(part.value)) if isinstance(part, ast.Constant) else "[A-Z][A-Za-z0-9]*"
                    for part in node.values
                ]
                pattern = "".join(parts)
                if re.fullmatch(r"[A-Z][A-Za-z0-9]*(?:\\?[A-Za-z0-9]|\[A-Z\]\[A-Za-z0-9\]\*)*", pattern):
                    vocabulary.patterns.append(re.compile(pattern))
    return vocabulary


# ---------------------------------------------------------------- metrics and alerts


def metric_names() -> dict[str, set[str]]:
    """Every sample name the operator's registry exposes -> its label names."""
    from specdec_operator.metrics import REGISTRY

    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
        "summary": ("_sum", "_count", "_created"),
        "info": ("_info",),
    }
    found: dict[str, set[str]] = {}
    for collector in list(REGISTRY._collector_to_names):
        labels = set(getattr(collector, "_labelnames", ()))
        for family in cast(Any, collector).describe():
            # A histogram or summary is named by its family too (`specdec_scrape_duration_seconds`).
            for suffix in (
                *suffixes.get(family.type, ("",)),
                *(("",) if family.type in ("histogram", "summary") else ()),
            ):
                found[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return found


# Labels Prometheus adds to every series it scrapes (target labels); the chart's selectors use `job`.
TARGET_LABELS = {
    "job": "scrape target label",
    "instance": "scrape target label",
    "pod": "Prometheus Operator target label",
    "service": "Prometheus Operator target label",
    "container": "Prometheus Operator target label",
    "endpoint": "Prometheus Operator target label",
}


@dataclass(frozen=True)
class Alert:
    name: str
    labels: frozenset[str]  # what the fired alert carries: its expression's outer grouping plus static labels


def alerts(root: Path = REPO_ROOT) -> dict[str, Alert]:
    """The PrometheusRule template's alerts, read from the template (no helm needed)."""
    text = (root / "charts" / "specdec-operator" / "templates" / "prometheusrule.yaml").read_text()
    found: dict[str, Alert] = {}
    for chunk in re.split(r"\n\s*- alert: ", text)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        expr = chunk.split("expr:", 1)[1].split("\n          for:", 1)[0].split("\n          labels:", 1)[0]
        grouping = re.search(r"\b(?:max|min|sum|avg|count)\s+by\s*\(([^)]*)\)", expr)
        labels = {label.strip() for label in grouping.group(1).split(",")} if grouping else set()
        static = re.search(r"\n          labels:\n((?:            \S.*\n)+)", chunk)
        if static:
            labels |= {line.strip().split(":", 1)[0] for line in static.group(1).split("\n") if ":" in line}
        found[name] = Alert(name, frozenset(label for label in labels if label and not label.startswith("{{")))
    return found


# ---------------------------------------------------------------- settings and environment


def settings_env() -> dict[str, str]:
    """SPECDEC_<FIELD> -> field name, for every OperatorEnvSettings field (nested ones as SPECDEC_<A>__<B>)."""
    from specdec_operator.settings import OperatorEnvSettings

    def walk(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str]]:
        for name, info in model.model_fields.items():
            yield prefix + name.upper(), name
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                yield from walk(annotation, f"{prefix}{name.upper()}__")

    prefix = str(OperatorEnvSettings.model_config.get("env_prefix", ""))
    return dict(walk(OperatorEnvSettings, prefix))


def _reads_in_shell(text: str) -> set[str]:
    return set(re.findall(r"\$\{?(SPECDEC_[A-Z0-9_]+)", text))


def tooling_env(root: Path = REPO_ROOT) -> set[str]:
    """SPECDEC_* variables that code other than the settings reads: written as a literal that is not a dict
    key or docstring (a dict of SPECDEC_* values is what a test or the demo hands to an operator, not a read)."""
    names: set[str] = set()
    sources = [
        root / "operator",
        root / "runtime",
        root / "hack",
        root / "tests" / "e2e",
        root / "tests" / "contract",
        root / "tests" / "conftest.py",
    ]
    for path in _python_files(*[source for source in sources if source.exists()]):
        text = path.read_text()
        if "SPECDEC_" not in text:
            continue
        tree = ast.parse(text)
        skip = _docstring_nodes(tree) | {
            id(key) for node in ast.walk(tree) if isinstance(node, ast.Dict) for key in node.keys if key is not None
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                names.update(re.findall(r"^(SPECDEC_[A-Z0-9_]+)$", node.value))
    # The unit tests read a few variables too ($SPECDEC_HELM); there only reads count, as the unit tests also
    # name settings in lists of what the chart must set.
    for path in _python_files(root / "tests" / "unit"):
        text = path.read_text()
        if "SPECDEC_" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Call)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and ("environ" in ast.dump(node.func) or "getenv" in ast.dump(node.func))
            ):
                names.update(re.findall(r"^(SPECDEC_[A-Z0-9_]+)$", str(node.args[0].value)))
    for script in [*(root / "hack").iterdir(), *((root / ".ci").iterdir() if (root / ".ci").exists() else [])]:
        if script.is_file() and script.suffix == "" and script.read_bytes()[:2] == b"#!":
            names |= _reads_in_shell(script.read_text())
    return names


# ---------------------------------------------------------------- chart values


def chart_values(root: Path = REPO_ROOT) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((root / "charts" / "specdec-operator" / "values.yaml").read_text())
    return values


def value_path_problem(values: dict[str, Any], segments: list[str]) -> str | None:
    node: Any = values
    for index, segment in enumerate(segments):
        if not isinstance(node, dict):
            return f"{'.'.join(segments[:index])} is a {type(node).__name__}, not a map"
        if not node and index > 0:
            return None  # an empty map in values.yaml: free-form (labels, annotations, selectors)
        if segment not in node:
            return f"{'.'.join(segments[:index]) or 'values.yaml'} has no key {segment!r}"
        node = node[segment]
    return None


# ---------------------------------------------------------------- CLI


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
        elif action.choices and not action.option_strings and action.dest not in ("help",):
            found.update({str(choice): argparse.ArgumentParser() for choice in action.choices})
    return found


def cli_tree() -> dict[str, dict[str, set[str] | None]]:
    """command -> subcommand -> its sub-words (None: it takes free words, e.g. `simulate serve ...`)."""
    from specdec_operator.bench.cli import build_parser as bench_parser
    from specdec_operator.cli import build_parser
    from specdec_runtime.cli import _parser as runtime_parser

    def tree(
        parser: argparse.ArgumentParser, nested: dict[str, argparse.ArgumentParser] | None = None
    ) -> dict[str, set[str] | None]:
        found: dict[str, set[str] | None] = {}
        for name, sub in _subcommands(parser).items():
            inner = nested.get(name) if nested else None
            words = set(_subcommands(inner if inner is not None else sub))
            free = any(action.nargs == argparse.REMAINDER for action in sub._actions)
            found[name] = None if free else words
        return found

    operator = tree(build_parser(), {"bench": bench_parser()})
    return {
        "specdec-operator": operator,
        "specdec-runtime": tree(runtime_parser()),
        # kubectl runs kubectl-specdec, which hands its words to `specdec-operator status` (fleetview.py)
        "kubectl specdec": {"status": operator["status"]},
    }
