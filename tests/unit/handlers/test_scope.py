"""The operator watches the whole cluster only when told so explicitly (issue 32, safe by default)."""

from __future__ import annotations

import pytest

from specdec_operator.cli import main
from specdec_operator.settings import OperatorEnvSettings


@pytest.mark.parametrize(("env", "problem"), [
    ({}, "SPECDEC_NAMESPACES (chart value watchNamespaces) is empty and SPECDEC_CLUSTER_WIDE"),
    ({"SPECDEC_NAMESPACES": "[]"}, "is empty and SPECDEC_CLUSTER_WIDE (chart value clusterWide) is not true"),
    ({"SPECDEC_NAMESPACES": '["a"]', "SPECDEC_CLUSTER_WIDE": "true"}, "set one of them, not both"),
    ({"SPECDEC_CLUSTER_WIDE": "true"}, None),
    ({"SPECDEC_NAMESPACES": '["a", "b"]'}, None),
])
def test_scope_must_be_explicit(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], problem: str | None) -> None:
    for name in ("SPECDEC_NAMESPACES", "SPECDEC_CLUSTER_WIDE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = OperatorEnvSettings().scope_problem()
    assert (found is None) if problem is None else (found is not None and problem in found), found


def test_the_operator_refuses_to_start_without_a_scope(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SPECDEC_NAMESPACES", raising=False)
    monkeypatch.delenv("SPECDEC_CLUSTER_WIDE", raising=False)
    assert main(["run"]) == 2  # before connecting anywhere
    error = capsys.readouterr().err
    assert "watchNamespaces" in error and "clusterWide" in error, error
