"""The shape of the pure evaluation (issue 35): evaluate reads as a list of small policies, and no pure function
of reconcile/, decisions/ or the condition policy takes a long list of loose parameters (a frozen inputs object
carries them instead, as RolloutInputs and PassInputs do)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specdec_operator

PACKAGE = Path(specdec_operator.__file__).parent
PLAN = PACKAGE / "reconcile" / "plan.py"
MAX_POLICY_LINES = 60
MAX_PARAMETERS = 7


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = function.args
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg not in ("self", "cls")]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def _lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    assert function.end_lineno is not None
    return function.end_lineno - function.lineno + 1


def test_evaluate_and_each_of_its_policies_fit_on_a_screen() -> None:
    defined = {f.name: f for f in _functions(PLAN)}
    evaluate = defined["evaluate"]
    called = {node.func.id for node in ast.walk(evaluate)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined}
    assert len(called) >= 8, sorted(called)  # a chain of policies, not one procedure
    too_long = {name: _lines(defined[name]) for name in {"evaluate", *called}
                if _lines(defined[name]) > MAX_POLICY_LINES}
    assert too_long == {}


PURE = sorted([*(PACKAGE / "reconcile").glob("*.py"), *(PACKAGE / "decisions").glob("*.py"),
               PACKAGE / "conditions.py"])


@pytest.mark.parametrize("path", PURE, ids=[str(p.relative_to(PACKAGE)) for p in PURE])
def test_no_pure_function_takes_a_long_list_of_loose_parameters(path: Path) -> None:
    crowded = {f"{f.name}:{f.lineno}": _parameters(f) for f in _functions(path) if _parameters(f) > MAX_PARAMETERS}
    assert crowded == {}
