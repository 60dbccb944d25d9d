"""Claims the docs make, each checked against its source of truth. Every check returns the claims it could
not verify, each with where it is written and why, so a failure names the doc line to fix."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.unit.docs import truth
from tests.unit.docs.corpus import REPO_ROOT, Block, code_spans

# ---------------------------------------------------------------- field paths

# `spec.a.b[].c` or `.status.x` (jsonpath, jq); not `body.spec.x` (code) nor `api/spec.py` (a file).
FIELD_PATH = re.compile(
    r"(?:(?<![\w$/.-])\.(?=spec\b|status\b)|(?<![\w$/.-]))(spec|status)((?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\])?)+)"
)
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "txt", "toml"}


def field_paths(block: Block) -> Iterable[tuple[str, list[str]]]:
    for match in FIELD_PATH.finditer(block.text):
        segments = match.group(2).lstrip(".").split(".")
        if len(segments) == 1 and segments[0] in FILE_SUFFIXES:
            continue  # spec.py, status.md: file names
        yield match.group(1), segments


def field_path_problems(
    blocks: Iterable[Block], schema: dict[str, truth.JsonSchema], foreign: dict[str, set[str]]
) -> list[str]:
    problems = []
    for block in blocks:
        for part, segments in field_paths(block):
            top = segments[0].removesuffix("[]")
            claim = f"{part}.{'.'.join(segments)}"
            if top not in schema[part].get("properties", {}):
                if top in foreign[part]:
                    continue  # another kind's field (a Deployment's spec.replicas, an HTTPRoute's status.parents)
                problems.append(
                    f"{block.where()}: `{claim}`: SpeculativeModel {part} has no field {top!r}, "
                    f"nor does any other kind the docs speak of"
                )
                continue
            problem = truth.walk_schema(schema[part], segments)
            if problem:
                problems.append(f"{block.where()}: `{claim}`: {problem}")
    return problems


def _key_paths(node: Any, prefix: list[str]) -> Iterable[list[str]]:
    if isinstance(node, dict):
        for key, child in node.items():
            yield [*prefix, str(key)]
            yield from _key_paths(child, [*prefix, str(key)])
    elif isinstance(node, list):
        for item in node:
            if prefix:
                yield from _key_paths(item, [*prefix[:-1], prefix[-1] + "[]"])


def manifest_documents(root: Path = REPO_ROOT) -> list[tuple[str, Any]]:
    """Every SpeculativeModel in examples/*.yaml and in the docs' fenced YAML, with where it is."""
    from tests.unit.docs.corpus import doc_files, example_files

    found: list[tuple[str, Any]] = []
    for path in example_files(root):
        found += [(str(path.relative_to(root)), doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    for path in doc_files(root):
        for number, fence in enumerate(re.findall(r"```ya?ml\n(.*?)```", path.read_text(), flags=re.S)):
            try:
                docs = [doc for doc in yaml.safe_load_all(fence) if doc]
            except yaml.YAMLError:
                continue  # a fragment with placeholders, not a manifest
            found += [(f"{path.relative_to(root)} (YAML block {number + 1})", doc) for doc in docs]
    return [(where, doc) for where, doc in found if isinstance(doc, dict) and doc.get("kind") == "SpeculativeModel"]


def manifest_problems(documents: Iterable[tuple[str, Any]], schema: dict[str, truth.JsonSchema]) -> list[str]:
    problems = []
    for where, doc in documents:
        for part in ("spec", "status"):
            for segments in _key_paths(doc.get(part) or {}, []):
                problem = truth.walk_schema(schema[part], segments)
                if problem:
                    problems.append(f"{where}: {part}.{'.'.join(segments)}: {problem}")
    return problems


# ---------------------------------------------------------------- conditions and reasons

# A block speaks of reasons when it says so: claims elsewhere (a class named in passing) are not reasons.
REASON_CONTEXT = re.compile(r"\b(?:reasons?|conditions?|events?)\b", re.I)
REASON_TOKEN = re.compile(r"`([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+)`")  # `CamelCase` with two humps or more
CONDITION_PAIR = re.compile(r"\b([A-Z][a-z]+(?:[A-Z][a-z]+)*)=(True|False|Unknown|[A-Z][a-z][A-Za-z0-9]*)\b")
CONDITION_SELECTOR = re.compile(r"specdec_model_condition\{[^}]*\btype=\"([A-Za-z]+)\"")
ALERT_NAME = re.compile(r"\bSpecdec[A-Z][A-Za-z0-9]+\b")

# Names from other projects that docs cite beside reasons or events; each with why it is not ours to check.
FOREIGN_REASONS: dict[str, str] = {}
# A name with one of these endings is a class of another project (vLLM's PrometheusStatLogger, a transformers
# LlamaConfig), never a reason: reasons say what happened (NoCompatibleNodes, CanaryFailed, OOMKilled).
CODE_NAME_SUFFIXES = (
    "Config",
    "Logger",
    "Proposer",
    "Worker",
    "Runner",
    "Backend",
    "Builder",
    "Metadata",
    "Manager",
    "Parser",
    "Scheduler",
    "Client",
    "Server",
    "Handler",
    "Engine",
    "Processor",
    "Executor",
    "Selector",
)


def kubernetes_names() -> set[str]:
    """Kinds and types of the Kubernetes API (NetworkPolicy, PodSpec): the client's model names unversioned."""
    from kubernetes_asyncio import client

    return {re.sub(r"^V\d+(?:alpha\d+|beta\d+)?", "", name) for name in dir(client) if re.match(r"^V\d", name)}


def _foreign(token: str, kubernetes: set[str]) -> bool:
    return token in FOREIGN_REASONS or token in kubernetes or token.endswith(CODE_NAME_SUFFIXES)


def reason_problems(blocks: Iterable[Block], vocabulary: truth.Vocabulary, types: set[str]) -> list[str]:
    kubernetes = kubernetes_names()
    problems = []
    for block in blocks:
        claims: list[str] = []
        if REASON_CONTEXT.search(block.context):
            claims += [token for token in REASON_TOKEN.findall(block.text) if not ALERT_NAME.fullmatch(token)]
        for condition, value in CONDITION_PAIR.findall(block.text):
            if condition not in types and condition not in truth.FOREIGN_CONDITION_TYPES:
                problems.append(
                    f"{block.where()}: `{condition}={value}`: {condition!r} is not a condition type "
                    f"(types: {', '.join(sorted(types))})"
                )
            elif value not in ("True", "False", "Unknown"):
                claims.append(value)
        for condition in CONDITION_SELECTOR.findall(block.text):
            if condition not in types:
                problems.append(f'{block.where()}: type="{condition}": not a condition type')
        for token in claims:
            if token not in types and not vocabulary.knows(token) and not _foreign(token, kubernetes):
                problems.append(f"{block.where()}: `{token}`: no reason, event or name of that spelling in the code")
    return problems


# ---------------------------------------------------------------- metrics, labels, alerts

METRIC = re.compile(r"(?<![\w/.-])(specdec_[a-z0-9_]*[a-z0-9])(\*|_\*)?(?![\w/-]|\.[a-z])")
SELECTOR = re.compile(r"(specdec_[a-z0-9_]+)\{([^}]*)\}")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)\s*\(?\s*(?:[a-z_]+\()*\s*(specdec_[a-z0-9_]+)")


def source_packages(root: Path = REPO_ROOT) -> set[str]:
    """Python packages of the source roots (specdec_operator, specdec_runtime): names, not metrics."""
    return {
        path.name
        for source in ("operator", "runtime")
        for path in (root / source).iterdir()
        if (path / "__init__.py").exists()
    }


def metric_problems(blocks: Iterable[Block], metrics: dict[str, set[str]], packages: set[str]) -> list[str]:
    problems = []
    for block in blocks:
        for name, wildcard in METRIC.findall(block.text):
            if name in packages:
                continue
            if wildcard:
                if not any(known.startswith(name) for known in metrics):
                    problems.append(f"{block.where()}: `{name}{wildcard}`: no metric starts with {name!r}")
            elif name not in metrics:
                problems.append(f"{block.where()}: `{name}`: not a metric of the operator's registry")
        for name, selector in SELECTOR.findall(block.text):
            for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", selector):
                if name in metrics and label not in metrics[name] and label not in truth.TARGET_LABELS:
                    problems.append(
                        f"{block.where()}: `{name}{{{label}=...}}`: {name} has no label {label!r} "
                        f"(labels: {', '.join(sorted(metrics[name]))})"
                    )
        for labels, name in GROUPING.findall(block.text):
            for label in (label.strip() for label in labels.split(",")):
                if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label):
                    continue  # `by (...)`: an elision
                if name in metrics and label not in metrics[name] and label not in truth.TARGET_LABELS:
                    problems.append(f"{block.where()}: `by ({label})` over {name}: no such label")
    return problems


def alert_problems(blocks: Iterable[Block], alerts: dict[str, truth.Alert]) -> list[str]:
    problems = []
    for block in blocks:
        for name in ALERT_NAME.findall(block.text):
            if name not in alerts:
                problems.append(f"{block.where()}: {name}: no such alert in the chart's PrometheusRule")
    return problems


def runbook_problems(runbook: Block | None, sections: dict[str, str], alerts: dict[str, truth.Alert]) -> list[str]:
    """Each alert has a runbook section (its runbook_url anchor), and a section's `x` label claims are labels
    its alert carries."""
    problems = [f"docs/runbooks.md: no section for alert {name}" for name in alerts if name not in sections]
    for name, text in sections.items():
        if name not in alerts:
            problems.append(f"docs/runbooks.md: section {name}: no such alert")
            continue
        for label in re.findall(r"`([a-z_]+)` label", text):
            if label not in alerts[name].labels:
                problems.append(
                    f"docs/runbooks.md, {name}: the alert has no `{label}` label "
                    f"(it carries {', '.join(sorted(alerts[name].labels))})"
                )
    return problems


def runbook_sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (\S+)\s*$", text, flags=re.M)
    return {parts[index]: parts[index + 1] for index in range(1, len(parts) - 1, 2)}


# ---------------------------------------------------------------- settings, environment, chart values

ENV = re.compile(r"\b(SPECDEC_[A-Z0-9_]*[A-Z0-9])\b(\*)?")
SETTING_NAME = re.compile(r"`([a-z][A-Za-z0-9]+)`[^`\n]{0,3}\(?operator setting")
VALUE_PATH = re.compile(r"^([a-z][A-Za-z0-9]*(?:\.[a-z][A-Za-z0-9]*)+)(?:\s*[=:].*)?$")
CHART_VALUE_CLAIM = re.compile(r"(?:chart values?|values?\.yaml|`--set)\s*\(?`([^`]+)`", re.I)


def env_problems(blocks: Iterable[Block], settings: dict[str, str], tooling: set[str]) -> list[str]:
    known = set(settings) | tooling
    problems = []
    for block in blocks:
        for name, wildcard in ENV.findall(block.text):
            if wildcard or name.endswith("__"):
                if not any(known_name.startswith(name) for known_name in known):
                    problems.append(f"{block.where()}: `{name}*`: no variable starts so")
            elif name not in known and name != "SPECDEC_":
                problems.append(
                    f"{block.where()}: `{name}`: neither an operator setting (OperatorEnvSettings) nor "
                    f"a variable the tooling reads"
                )
    return problems


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def setting_name_problems(blocks: Iterable[Block], settings: dict[str, str]) -> list[str]:
    fields = set(settings.values())
    return [
        f"{block.where()}: `{name}` (operator setting): OperatorEnvSettings has no field {_snake(name)!r}"
        for block in blocks
        for name in SETTING_NAME.findall(block.text)
        if _snake(name) not in fields
    ]


OTHER_PROJECT_SPAN = re.compile(r"\b([A-Za-z][\w-]*)'s `([^`]+)`")
OURS = {"chart", "operator", "specdec-operator", "release"}


def chart_value_problems(blocks: Iterable[Block], values: dict[str, Any], spec: truth.JsonSchema) -> list[str]:
    """A dotted `a.b.c` (optionally `=x` or `: x`) whose first key is a top-level value, or any token the text
    calls a chart value, must be a key path of values.yaml. Not: a path that is a field of the spec (the docs
    write spec fields relative to spec, `runtime.resources`), a file name (`runtime.json`), or another
    project's value (cert-manager's `crds.enabled`)."""
    problems = []
    for block in blocks:
        claimed = set(CHART_VALUE_CLAIM.findall(block.text))
        others = {span for owner, span in OTHER_PROJECT_SPAN.findall(block.text) if owner.lower() not in OURS}
        for span in code_spans(block.text):
            if span in others or span.rsplit(".", 1)[-1] in FILE_SUFFIXES:
                continue
            match = VALUE_PATH.match(span.strip())
            if not match:
                if span in claimed and re.fullmatch(r"[a-z][A-Za-z0-9]*", span.split("=")[0].split(":")[0].strip()):
                    top = span.split("=")[0].split(":")[0].strip()
                    if top not in values:
                        problems.append(f"{block.where()}: chart value `{top}`: not in values.yaml")
                continue
            segments = match.group(1).split(".")
            if segments[0] not in values and span not in claimed:
                continue  # not about the chart (a Python module path, a field relative to a spec object)
            if truth.walk_schema(spec, segments) is None and truth.value_path_problem(values, segments):
                continue  # a spec field written relative to spec
            problem = truth.value_path_problem(values, segments)
            if problem:
                problems.append(f"{block.where()}: chart value `{match.group(1)}`: {problem}")
    return problems


# ---------------------------------------------------------------- CLI

COMMAND = re.compile(
    r"(?:^|\$ |&& |\|\| |; |\| |\.venv/bin/|\bhelp: )(specdec-operator|specdec-runtime|kubectl specdec)"
    r"((?:\s+[a-z][a-z0-9-]*)*)"
)


def cli_problems(blocks: Iterable[Block], tree: dict[str, dict[str, set[str] | None]]) -> list[str]:
    problems = []
    for block in blocks:
        for span in code_spans(block.text):
            for command, words in COMMAND.findall(span.strip()):
                parts = words.split()
                if not parts:
                    continue
                subcommands = tree[command]
                if parts[0] not in subcommands:
                    problems.append(
                        f"{block.where()}: `{command} {parts[0]}`: no such subcommand "
                        f"({', '.join(sorted(subcommands))})"
                    )
                    continue
                inner = subcommands[parts[0]]
                if inner and len(parts) > 1 and parts[1] not in inner:
                    problems.append(
                        f"{block.where()}: `{command} {parts[0]} {parts[1]}`: no such subcommand "
                        f"({', '.join(sorted(inner))})"
                    )
    return problems
