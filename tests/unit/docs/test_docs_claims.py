"""Docs that the tests keep true (issue 35, item 6).

Every field path, condition type and reason, metric and label, alert, setting or environment variable, chart
value and CLI subcommand named in docs/, README.md, SECURITY.md, CONTRIBUTING.md, the chart README, the runbooks,
runtime/README.md and examples/ is checked against the code that defines it. Each check is proven to fail when
the code alone renames what the docs name (the `*_renamed_*` tests), so a rename cannot leave the docs behind.
"""

from __future__ import annotations

import copy
import shutil
from collections import Counter
from pathlib import Path

import pytest

from tests.unit.docs import checks, truth
from tests.unit.docs.corpus import REPO_ROOT, Block, all_blocks, code_spans, description_blocks


@pytest.fixture(scope="module")
def blocks() -> list[Block]:
    return all_blocks()


@pytest.fixture(scope="module")
def schema() -> dict[str, truth.JsonSchema]:
    return truth.model_schema()


@pytest.fixture(scope="module")
def foreign() -> dict[str, set[str]]:
    return truth.foreign_top_fields()


@pytest.fixture(scope="module")
def vocabulary() -> truth.Vocabulary:
    return truth.code_vocabulary()


@pytest.fixture(scope="module")
def tooling() -> set[str]:
    return truth.tooling_env()


def _rename_in_schema(
    schema: dict[str, truth.JsonSchema], part: str, segments: list[str]
) -> dict[str, truth.JsonSchema]:
    """A copy of the schema in which the last field of the path has another name."""
    renamed = copy.deepcopy(schema)
    node = renamed[part]
    for segment in segments[:-1]:
        node = node["properties"][segment.removesuffix("[]")]
        if segment.endswith("[]") or ("properties" not in node and "items" in node):
            node = node["items"]
    last = segments[-1].removesuffix("[]")
    node["properties"][last + "Renamed"] = node["properties"].pop(last)
    return renamed


def _most_cited_paths(blocks: list[Block], schema: dict[str, truth.JsonSchema]) -> dict[str, list[str]]:
    """The deepest most-cited valid path of spec and of status: what a rename would most surely leave behind."""
    cited: Counter[tuple[str, tuple[str, ...]]] = Counter()
    for block in blocks:
        for part, segments in checks.field_paths(block):
            if len(segments) > 1 and truth.walk_schema(schema[part], segments) is None:
                cited[part, tuple(segments)] += 1
    best: dict[str, list[str]] = {}
    for (part, path), _count in cited.most_common():
        best.setdefault(part, list(path))
    return best


# ---------------------------------------------------------------- field paths


def test_every_field_path_the_docs_name_is_in_the_crd_schema(
    blocks: list[Block], schema: dict[str, truth.JsonSchema], foreign: dict[str, set[str]]
) -> None:
    cited = [path for block in blocks for path in checks.field_paths(block)]
    assert len(cited) > 100, "the extraction found almost no field paths: is the corpus still read?"
    assert checks.field_path_problems(blocks, schema, foreign) == []


@pytest.mark.parametrize("part", ["spec", "status"])
def test_field_path_check_fails_when_the_code_renames_a_field(
    blocks: list[Block], schema: dict[str, truth.JsonSchema], part: str, foreign: dict[str, set[str]]
) -> None:
    segments = _most_cited_paths(blocks, schema)[part]
    renamed = _rename_in_schema(schema, part, segments)
    problems = checks.field_path_problems(blocks, renamed, foreign)
    claim = f"{part}.{'.'.join(segments)}"
    assert any(f"`{claim}`" in problem for problem in problems), (claim, problems)


def test_hub_secret_path_is_checked_where_the_runbook_names_it(
    blocks: list[Block], foreign: dict[str, set[str]]
) -> None:
    # The runbook once cited spec.model.hubSecretRef; the field lives under spec.model.source.
    wrong = Block(REPO_ROOT / "docs" / "runbooks.md", 1, "the token of `spec.model.hubSecretRef`", "")
    (problem,) = checks.field_path_problems([wrong], truth.model_schema(), foreign)
    assert "'hubSecretRef'" in problem and "source" in problem


def test_other_kinds_fields_are_told_apart_from_the_models(foreign: dict[str, set[str]]) -> None:
    text = "a Deployment's `spec.replicas`, the route's `status.parents`, jq `.spec.rules[].backendRefs[]`"
    block = Block(REPO_ROOT / "docs" / "x.md", 1, text, text)
    assert checks.field_path_problems([block], truth.model_schema(), foreign) == []
    made_up = Block(REPO_ROOT / "docs" / "x.md", 1, "`spec.nonsense.x` and `api/spec.py`", "")
    (problem,) = checks.field_path_problems([made_up], truth.model_schema(), foreign)
    assert "'nonsense'" in problem


def test_every_example_and_doc_manifest_uses_fields_of_the_schema(schema: dict[str, truth.JsonSchema]) -> None:
    documents = checks.manifest_documents()
    assert {where for where, _ in documents} >= {
        f"examples/{path.name}"
        for path in (REPO_ROOT / "examples").glob("*.yaml")
        if "SpeculativeModel" in path.read_text()
    }
    assert checks.manifest_problems(documents, schema) == []


def test_manifest_check_fails_when_the_code_renames_a_field(schema: dict[str, truth.JsonSchema]) -> None:
    renamed = _rename_in_schema(schema, "spec", ["model", "tensorParallelSize"])
    problems = checks.manifest_problems(checks.manifest_documents(), renamed)
    assert any("spec.model.tensorParallelSize" in problem for problem in problems), problems


# ---------------------------------------------------------------- conditions and reasons


def _copy_sources(tmp_path: Path) -> Path:
    for source in ("operator/specdec_operator", "runtime/specdec_runtime"):
        shutil.copytree(REPO_ROOT / source, tmp_path / source, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _cited_reasons(blocks: list[Block], types: set[str]) -> Counter[str]:
    cited: Counter[str] = Counter()
    for block in blocks:
        if checks.REASON_CONTEXT.search(block.context):
            cited.update(token for token in checks.REASON_TOKEN.findall(block.text) if token not in types)
    return cited


def test_every_condition_type_and_reason_the_docs_name_is_in_the_code(
    blocks: list[Block], vocabulary: truth.Vocabulary
) -> None:
    types = truth.condition_types()
    assert len(_cited_reasons(blocks, types)) > 20, "the extraction found almost no reasons"
    assert checks.reason_problems(blocks, vocabulary, types) == []


def test_reason_check_fails_when_the_code_renames_a_reason(
    blocks: list[Block], tmp_path: Path, vocabulary: truth.Vocabulary
) -> None:
    """A scratch copy of the sources with one reason the docs cite renamed everywhere in the code."""
    types = truth.condition_types()
    reason = next(
        token
        for token, _ in _cited_reasons(blocks, types).most_common()
        if token in vocabulary.words and token not in checks.FOREIGN_REASONS
    )
    root = _copy_sources(tmp_path)
    for path in root.rglob("*.py"):
        text = path.read_text()
        if reason in text:
            path.write_text(text.replace(reason, reason + "Renamed"))
    problems = checks.reason_problems(blocks, truth.code_vocabulary(root), types)
    assert any(f"`{reason}`" in problem for problem in problems), (reason, problems)


def test_reasons_built_by_f_strings_are_known(tmp_path: Path, vocabulary: truth.Vocabulary) -> None:
    # capacity.py posts f"Rollout{mode}": RolloutSurge and RolloutInPlace are reasons though never spelt whole.
    assert vocabulary.knows("RolloutSurge")
    (tmp_path / "operator" / "specdec_operator").mkdir(parents=True)
    (tmp_path / "runtime" / "specdec_runtime").mkdir(parents=True)
    (tmp_path / "operator" / "specdec_operator" / "m.py").write_text('event = f"Rollout{mode}"\n')
    assert truth.code_vocabulary(tmp_path).knows("RolloutInPlace")
    assert not truth.code_vocabulary(tmp_path).knows("CanaryFailed")


def test_names_of_other_projects_beside_reasons_are_not_taken_for_reasons(vocabulary: truth.Vocabulary) -> None:
    text = (
        "Events: vLLM's `PrometheusStatLogger` and a `NetworkPolicy` are not reasons; "
        "`CanaryFailed` is one, `CanaryExploded` is not."
    )
    block = Block(REPO_ROOT / "docs" / "x.md", 1, text, text)
    (problem,) = checks.reason_problems([block], vocabulary, truth.condition_types())
    assert "`CanaryExploded`" in problem


def test_condition_check_fails_when_the_code_renames_a_condition_type(
    blocks: list[Block], vocabulary: truth.Vocabulary
) -> None:
    types = truth.condition_types()
    problems = checks.reason_problems(blocks, vocabulary, (types - {"Degraded"}) | {"Impaired"})
    assert any("'Degraded' is not a condition type" in problem for problem in problems), problems
    selector = checks.reason_problems(blocks, vocabulary, (types - {"Ready"}) | {"Available"})
    assert any('type="Ready"' in problem for problem in selector), selector


# ---------------------------------------------------------------- metrics, labels, alerts, runbooks


def test_every_metric_and_label_the_docs_name_is_in_the_registry(blocks: list[Block]) -> None:
    metrics = truth.metric_names()
    cited = {name for block in blocks for name, _ in checks.METRIC.findall(block.text)}
    assert len(cited & set(metrics)) > 15, "the extraction found almost no metrics"
    assert checks.metric_problems(blocks, metrics, checks.source_packages()) == []


def test_metric_check_fails_when_the_code_renames_a_metric_or_a_label(blocks: list[Block]) -> None:
    metrics = truth.metric_names()
    renamed = {
        ("specdec_k_flips_total" if name == "specdec_k_changes_total" else name): labels
        for name, labels in metrics.items()
    }
    problems = checks.metric_problems(blocks, renamed, checks.source_packages())
    assert any("`specdec_k_changes_total`" in problem for problem in problems), problems
    relabelled = {
        name: ({"kind" if label == "type" else label for label in labels}) for name, labels in metrics.items()
    }
    problems = checks.metric_problems(blocks, relabelled, checks.source_packages())
    assert any("has no label 'type'" in problem for problem in problems), problems


def test_every_alert_the_docs_name_is_in_the_chart_and_has_a_runbook(blocks: list[Block]) -> None:
    alerts = truth.alerts()
    assert len(alerts) >= 5
    assert checks.alert_problems(blocks, alerts) == []
    sections = checks.runbook_sections((REPO_ROOT / "docs" / "runbooks.md").read_text())
    assert checks.runbook_problems(None, sections, alerts) == []


def test_alert_and_runbook_checks_fail_when_the_chart_renames_an_alert(blocks: list[Block], tmp_path: Path) -> None:
    template = REPO_ROOT / "charts" / "specdec-operator" / "templates" / "prometheusrule.yaml"
    scratch = tmp_path / "charts" / "specdec-operator" / "templates" / "prometheusrule.yaml"
    scratch.parent.mkdir(parents=True)
    scratch.write_text(template.read_text().replace("alert: SpecdecKThrash", "alert: SpecdecKFlapping"))
    alerts = truth.alerts(tmp_path)
    assert any("SpecdecKThrash" in problem for problem in checks.alert_problems(blocks, alerts))
    sections = checks.runbook_sections((REPO_ROOT / "docs" / "runbooks.md").read_text())
    assert "docs/runbooks.md: no section for alert SpecdecKFlapping" in checks.runbook_problems(None, sections, alerts)


def test_a_runbook_cannot_promise_a_label_its_rule_aggregates_away() -> None:
    alerts = truth.alerts()
    sections = {"SpecdecModelNotReady": "The alert's `reason` label is the condition's reason."}
    (problem,) = checks.runbook_problems(None, sections, {"SpecdecModelNotReady": alerts["SpecdecModelNotReady"]})
    assert "no `reason` label" in problem


# ---------------------------------------------------------------- settings, environment, chart values


def test_every_setting_and_variable_the_docs_name_exists(blocks: list[Block], tooling: set[str]) -> None:
    settings = truth.settings_env()
    cited = {name for block in blocks for name, _ in checks.ENV.findall(block.text)}
    assert len(cited & set(settings)) >= 3, "the extraction found almost no settings"
    assert checks.env_problems(blocks, settings, tooling) == []
    assert checks.setting_name_problems(blocks, settings) == []


def test_setting_check_fails_when_the_code_renames_a_setting(blocks: list[Block], tooling: set[str]) -> None:
    settings = truth.settings_env()
    cited = Counter(name for block in blocks for name, _ in checks.ENV.findall(block.text) if name in settings)
    for name, _ in cited.most_common(3):
        renamed = {(key + "_RENAMED" if key == name else key): field for key, field in settings.items()}
        problems = checks.env_problems(blocks, renamed, tooling)
        assert any(f"`{name}`" in problem for problem in problems), (name, problems)
    renamed_fields = {
        key: ("node_missing_grace" if field == "node_missing_grace_seconds" else field)
        for key, field in settings.items()
    }
    assert any("nodeMissingGraceSeconds" in problem for problem in checks.setting_name_problems(blocks, renamed_fields))


def test_tooling_variables_are_those_the_code_reads(tmp_path: Path) -> None:
    (tmp_path / "hack").mkdir()
    (tmp_path / "hack" / "tool.py").write_text(
        'import os\nLANES = os.environ.get("SPECDEC_E2E_LANES")\nENV = {"SPECDEC_HANDED_TO_A_PROCESS": "1"}\n'
        '"""SPECDEC_IN_A_DOCSTRING"""\n'
    )
    (tmp_path / "hack" / "script").write_text('#!/usr/bin/env bash\necho "${SPECDEC_CLUSTER_DIR:-x}"\n')
    assert truth.tooling_env(tmp_path) == {"SPECDEC_E2E_LANES", "SPECDEC_CLUSTER_DIR"}


def test_every_chart_value_the_docs_name_is_in_values_yaml(
    blocks: list[Block], schema: dict[str, truth.JsonSchema]
) -> None:
    assert checks.chart_value_problems(blocks, truth.chart_values(), schema["spec"]) == []


def test_chart_value_check_fails_when_the_chart_renames_a_value(
    blocks: list[Block], schema: dict[str, truth.JsonSchema]
) -> None:
    values = copy.deepcopy(truth.chart_values())
    values["shard"]["labelSelector"] = values["shard"].pop("modelSelector")
    values["metrics"]["prometheusRule"]["kThrash"]["window"] = values["metrics"]["prometheusRule"]["kThrash"].pop(
        "cooldown"
    )
    problems = checks.chart_value_problems(blocks, values, schema["spec"])
    assert any("`shard.modelSelector`" in problem for problem in problems), problems
    assert any("`metrics.prometheusRule.kThrash.cooldown`" in problem for problem in problems), problems


# ---------------------------------------------------------------- CLI


def test_every_cli_subcommand_the_docs_name_exists(blocks: list[Block]) -> None:
    tree = truth.cli_tree()
    cited = [
        command
        for block in blocks
        for span in code_spans(block.text)
        for command in checks.COMMAND.findall(span.strip())
    ]
    assert len(cited) > 10, "the extraction found almost no commands"
    assert checks.cli_problems(blocks, tree) == []


def test_cli_check_fails_when_the_code_renames_a_subcommand(blocks: list[Block]) -> None:
    tree = truth.cli_tree()
    tree["specdec-operator"]["crd"] = tree["specdec-operator"].pop("crds")
    tree["specdec-runtime"]["serve"] = tree["specdec-runtime"].pop("launch")
    tree["specdec-operator"]["bench"] = {"k-tuner", "canary"}
    problems = checks.cli_problems(blocks, tree)
    for claim in ("`specdec-operator crds`", "`specdec-runtime launch`", "`specdec-operator bench tuner`"):
        assert any(claim in problem for problem in problems), (claim, problems)


# ---------------------------------------------------------------- the CRD's own descriptions


def test_crd_descriptions_name_real_fields_settings_metrics_and_values(
    schema: dict[str, truth.JsonSchema],
    foreign: dict[str, set[str]],
    vocabulary: truth.Vocabulary,
    tooling: set[str],
) -> None:
    """`kubectl explain` is documentation too: its field paths, reasons, metrics and settings are checked alike."""
    described = description_blocks(schema)
    assert len(described) > 100
    assert checks.field_path_problems(described, schema, foreign) == []
    assert checks.reason_problems(described, vocabulary, truth.condition_types()) == []
    assert checks.metric_problems(described, truth.metric_names(), checks.source_packages()) == []
    assert checks.env_problems(described, truth.settings_env(), tooling) == []
    assert checks.chart_value_problems(described, truth.chart_values(), schema["spec"]) == []
    part, segments = _most_cited_paths(described, schema).popitem()
    renamed = _rename_in_schema(schema, part, segments)
    stale = checks.field_path_problems(description_blocks(renamed), renamed, foreign)
    claim = f"`{part}.{'.'.join(segments)}`"
    assert any(claim in problem for problem in stale), (claim, stale)
