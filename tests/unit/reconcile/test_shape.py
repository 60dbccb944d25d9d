"""The shape of the code (issue 35): evaluate reads as a list of small policies, and no pure function takes a long
list of loose parameters (a frozen object named for the concept carries them instead, as RolloutInputs, VerdictInputs,
PoolTrack and NodeTargeting do).

Pure here means: no Kubernetes client, no kopf, no HTTP, no processes. Every module of specdec_operator and
specdec_runtime is either PURE or on the IO_EDGE, and a new module outside both lists fails until it is put in one.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest

import specdec_operator
import specdec_runtime

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
    # evaluate is the policies' chain (`decide`), then the one place status is built from what they decided.
    chain = [defined["evaluate"], defined["decide"]]
    called = {node.func.id for function in chain for node in ast.walk(function)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined}
    assert len(called) >= 8, sorted(called)  # a chain of policies, not one procedure
    too_long = {name: _lines(defined[name]) for name in {"evaluate", *called}
                if _lines(defined[name]) > MAX_POLICY_LINES}
    assert too_long == {}


# Held to MAX_PARAMETERS: these packages and modules (a name ending in "/" is a package, its new modules included).
PURE = (
    "specdec_operator/api/",  # the CRD's models and its schema
    "specdec_operator/canary/",  # canary evidence, analysis, steps and replay
    "specdec_operator/decisions/",
    "specdec_operator/gpu/",  # what nodes offer and pods claim
    "specdec_operator/reconcile/",  # the evaluation: observed -> desired, status, events
    "specdec_operator/render/",  # owned objects as dicts
    "specdec_operator/tuner/",  # but scraper.py (below)
    "specdec_operator/bench/",  # simulated canaries and tuner loops, seeded; but the engines and servers (below)
    "specdec_operator/conditions.py",
    "specdec_operator/timestamps.py",
    "specdec_operator/settings.py",  # settings models (pydantic reads the environment)
    "specdec_operator/metrics.py",  # metric definitions
    "specdec_operator/crdfiles.py",
    "specdec_operator/version.py",
    "specdec_operator/__init__.py",
    "specdec_runtime/config.py",  # the runtime config and its vLLM argv
    "specdec_runtime/contract.py",
    "specdec_runtime/routing.py",
    "specdec_runtime/podstates.py",
    "specdec_runtime/engine_env.py",
    "specdec_runtime/tiny_model.py",  # seeded checkpoints (written to files, no process, no network)
    "specdec_runtime/simulator/",  # the engine model, profiles, /metrics text; but the servers (below)
    "specdec_runtime/__init__.py",
)
# Not held to it: the I/O edge, where signatures are kopf's, aiohttp's or a process's. Why each is there:
IO_EDGE = {
    "specdec_operator/handlers/": "kopf handlers (kopf's signatures) and the services they run on the event loop",
    "specdec_operator/kube/": "the Kubernetes API client",
    "specdec_operator/cli.py": "the operator's entry point: starts kopf",
    "specdec_operator/fleetview.py": "the kubectl plugin: reads the cluster over HTTP",
    "specdec_operator/tuner/scraper.py": "scrapes the pods' /metrics with aiohttp",
    "specdec_operator/bench/cli.py": "the bench's entry point",
    "specdec_operator/bench/engine.py": "starts engines as processes and talks to them over HTTP",
    "specdec_operator/bench/hostile.py": "serves hostile /metrics with aiohttp",
    "specdec_runtime/cli.py": "the runtime's entry point",
    "specdec_runtime/launcher.py": "execs vLLM or the simulator",
    "specdec_runtime/fleet_driver.py": "the local fleet's kubelet stand-in: hosts simulators",
    "specdec_runtime/fleet_engine.py": "runs engines as processes",
    "specdec_runtime/supervision.py": "the fleet drivers' kubelet loop: starts, stops and back-off of workloads",
    "specdec_runtime/termination.py": "the kubelet stand-in's pod termination: waits, stops containers, deletes pods",
    "specdec_runtime/fleet_kube.py": "watches pods through the Kubernetes API",
    "specdec_runtime/gateway_standin.py": "proxies HTTP and watches Services and HTTPRoutes",
    "specdec_runtime/loadgen.py": "sends HTTP load",
    "specdec_runtime/simulator/server.py": "the simulator's aiohttp server",
    "specdec_runtime/simulator/hosted.py": "hosts simulators on aiohttp",
    "specdec_runtime/simulator/live.py": "paces tokens on the event loop's clock",
    "specdec_runtime/simulator/__main__.py": "an entry point",
}
ROOTS = (PACKAGE, Path(specdec_runtime.__file__).parent)
REPO = Path(__file__).resolve().parents[3]


def _modules() -> list[str]:
    return sorted(str(path.relative_to(root.parent)) for root in ROOTS for path in root.rglob("*.py"))


def _listed(module: str, listing: Iterable[str]) -> str | None:
    """The longest entry naming the module: itself, or the deepest package holding it."""
    names = [entry for entry in listing if module == entry or (entry.endswith("/") and module.startswith(entry))]
    return max(names, key=len, default=None)


def _is_pure(module: str) -> bool:
    pure, edge = _listed(module, PURE), _listed(module, IO_EDGE)
    return pure is not None and (edge is None or len(pure) > len(edge))


def _crowded(source: str) -> dict[str, int]:
    tree = ast.parse(source)
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    return {f"{f.name}:{f.lineno}": _parameters(f) for f in functions if _parameters(f) > MAX_PARAMETERS}


def test_every_module_is_either_pure_or_on_the_io_edge() -> None:
    unlisted = [module for module in _modules() if _listed(module, PURE) is None and _listed(module, IO_EDGE) is None]
    assert unlisted == []
    stale = [entry for entry in [*PURE, *IO_EDGE] if not any(_listed(module, [entry]) for module in _modules())]
    assert stale == []


def test_the_import_contracts_pure_modules_are_held_to_it() -> None:
    """The modules import-linter keeps free of kopf, the client and HTTP are all pure here too."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (decisions,) = [contract for contract in contracts if contract["name"].startswith("Decisions are pure")]
    modules = [module for module in _modules()
               if any(module.removesuffix(".py").replace("/", ".").startswith(source)
                      for source in decisions["source_modules"])]
    assert len(modules) > 50
    assert [module for module in modules if not _is_pure(module)] == []


PURE_MODULES = [module for module in _modules() if _is_pure(module)]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_no_pure_function_takes_a_long_list_of_loose_parameters(module: str) -> None:
    root = next(root for root in ROOTS if module.startswith(f"{root.name}/"))
    assert _crowded((root.parent / module).read_text()) == {}


def test_eight_parameters_are_too_many() -> None:
    """The count the test above holds: `self` and `cls` aside, positional and keyword-only alike, *args and
    **kwargs one each."""
    assert _crowded("def ok(a, b, c, d, e, f, g): ...") == {}
    assert _crowded("class C:\n    def ok(self, a, b, c, d, e, /, f, *, g): ...") == {}
    assert _crowded("def bad(a, b, c, d, e, f, g, h): ...") == {"bad:1": 8}
    assert _crowded("class C:\n    async def bad(cls, a, b, c, d, e, *args, f, **kwargs): ...") == {"bad:2": 8}
