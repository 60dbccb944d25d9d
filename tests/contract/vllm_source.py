"""Read facts straight from the vllm 0.33.0 wheel's source with `ast`; nothing is imported or installed."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

VLLM_VERSION = "0.33.0"
WHEEL_CACHE = Path(os.environ.get("SPECDEC_WHEEL_CACHE", Path.home() / ".cache" / "specdec-operator" / "wheels"))

SPECULATIVE_CONFIG = "vllm/config/speculative.py"
SPEC_DECODE_METRICS = "vllm/v1/spec_decode/metrics.py"
LOGGERS = "vllm/v1/metrics/loggers.py"
BUCKETS = "vllm/v1/metrics/buckets.py"
ENGINE = "vllm/v1/engine/__init__.py"

METRIC_CLASSES = {"_counter_cls": "counter", "_gauge_cls": "gauge", "_histogram_cls": "histogram"}


class WheelUnavailable(RuntimeError):
    """PyPI (or the network to it) refused the download."""


def vllm_wheel() -> Path:
    """The cached wheel, downloaded once with `pip download --no-deps` (pip's cache makes reruns cheap)."""
    cached = sorted(WHEEL_CACHE.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if cached:
        return cached[0]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         f"vllm=={VLLM_VERSION}", "--dest", str(WHEEL_CACHE)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise WheelUnavailable(lines[-1] if lines else f"pip exited {result.returncode}")
    return sorted(WHEEL_CACHE.glob(f"vllm-{VLLM_VERSION}-*.whl"))[0]


class VllmSource:
    def __init__(self, wheel: Path) -> None:
        self._wheel = zipfile.ZipFile(wheel)
        self._trees: dict[str, ast.Module] = {}

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self._wheel.read(path).decode("utf-8"), filename=path)
        return self._trees[path]

    def class_fields(self, path: str, class_name: str) -> set[str]:
        cls = next(n for n in self.tree(path).body if isinstance(n, ast.ClassDef) and n.name == class_name)
        return {
            node.target.id
            for node in cls.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and "ClassVar" not in ast.unparse(node.annotation)
        }

    def literal_values(self, path: str, alias: str) -> set[str]:
        """Every string a module-level `Alias = Literal[...]` admits, following nested Literal aliases."""
        aliases = {
            node.targets[0].id: node.value
            for node in self.tree(path).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Subscript) and ast.unparse(node.value.value) == "Literal"
        }

        def expand(node: ast.expr) -> set[str]:
            if isinstance(node, ast.Subscript):
                return expand(node.slice)
            if isinstance(node, ast.Tuple):
                return set().union(*(expand(element) for element in node.elts))
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return {node.value}
            if isinstance(node, ast.Name) and node.id in aliases:
                return expand(aliases[node.id])
            raise AssertionError(f"unexpected node in Literal: {ast.unparse(node)}")

        return expand(aliases[alias])

    def module_constant(self, path: str, name: str) -> object:
        target: ast.expr
        for node in self.tree(path).body:
            if isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            elif isinstance(node, ast.Assign):
                target, value = node.targets[0], node.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id == name:
                return ast.literal_eval(value)
        raise KeyError(f"{name} not in {path}")

    def metrics(self, path: str) -> dict[str, tuple[str, str]]:
        """name -> (type, documentation) for every metric declared with self._<kind>_cls(name=..., ...),
        plus the (name, documentation) pairs of `counter_specs` lists fed to the counter class."""
        found: dict[str, tuple[str, str]] = {}
        for node in ast.walk(self.tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                kind = METRIC_CLASSES.get(node.func.attr)
                keywords = {k.arg: k.value for k in node.keywords}
                name, doc = keywords.get("name"), keywords.get("documentation")
                if kind and isinstance(name, ast.Constant) and isinstance(doc, ast.Constant):
                    found[str(name.value)] = (kind, str(doc.value))
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "counter_specs":
                for name, doc in ast.literal_eval(node.value):
                    found[name] = ("counter", doc)
        return found

    def call_keyword(self, path: str, metric: str, keyword: str) -> str:
        """The source text of `keyword=` in the call declaring `metric`."""
        for node in ast.walk(self.tree(path)):
            if isinstance(node, ast.Call):
                keywords = {k.arg: k.value for k in node.keywords}
                name = keywords.get("name")
                if isinstance(name, ast.Constant) and name.value == metric and keyword in keywords:
                    return ast.unparse(keywords[keyword])
        raise KeyError(f"{metric}.{keyword} not in {path}")

    def assignment(self, path: str, target: str) -> str:
        for node in ast.walk(self.tree(path)):
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == target:
                return ast.unparse(node.value)
        raise KeyError(f"{target} not in {path}")
