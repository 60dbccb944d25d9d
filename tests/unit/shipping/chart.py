"""Render the chart with helm: $SPECDEC_HELM, else PATH, else the one hack/cluster built; skip without one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.build import binary_dir
from localcluster.versions import BUILDS, KUBERNETES_VERSION

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART_DIR = REPO_ROOT / "charts" / "specdec-operator"
RELEASE = "specdec"
RELEASE_NAMESPACE = "specdec-system"

Manifest = dict[str, Any]


def _built_helm() -> str | None:
    # Looked up, never built: building takes minutes and belongs to `hack/cluster build`.
    (helm_build,) = [build for build in BUILDS if build.name == "helm"]
    path = binary_dir(helm_build) / "helm"
    return str(path) if path.exists() else None


def find_helm() -> str:
    candidate = os.environ.get("SPECDEC_HELM") or shutil.which("helm") or _built_helm()
    if not candidate or not os.access(candidate, os.X_OK):
        pytest.skip("helm not found: set SPECDEC_HELM, put helm on PATH or run `hack/cluster build`")
    return candidate


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    # A helm built with `go install` reports Kubernetes v1.20 as its default, which the chart's kubeVersion
    # refuses; render for the version the local control plane runs instead.
    command = [helm, *args, "--kube-version", KUBERNETES_VERSION.lstrip("v")]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


# The chart refuses to render without a scope (watchNamespaces, or clusterWide: true). Tests about something
# else render the cluster-wide install unless they choose a scope themselves.
CLUSTER_WIDE = "clusterWide=true"


def render(helm: str, *set_args: str) -> list[Manifest]:
    """`helm template` with --set arguments; every non-empty document, CRDs included."""
    if not any(arg.startswith(("watchNamespaces=", "clusterWide=")) for arg in set_args):
        set_args = (CLUSTER_WIDE, *set_args)
    args = ["template", RELEASE, str(CHART_DIR), "--namespace", RELEASE_NAMESPACE, "--include-crds"]
    for assignment in set_args:
        args += ["--set", assignment]
    result = run_helm(helm, *args)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [doc for doc in manifests if doc["kind"] == kind]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = of_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def load_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return values


def find_promtool() -> str:
    """promtool from $SPECDEC_PROMTOOL, PATH, or the cached build of `hack/cluster tools` (never built here)."""
    from localcluster.versions import TOOLS

    (build,) = [tool for tool in TOOLS if tool.name == "promtool"]
    built = binary_dir(build) / "promtool"
    candidate = os.environ.get("SPECDEC_PROMTOOL") or shutil.which("promtool") or (str(built) if built.exists()
                                                                                  else None)
    if not candidate or not os.access(candidate, os.X_OK):
        pytest.skip("promtool not found: run `hack/cluster tools` (hack/test does) or set SPECDEC_PROMTOOL")
    return candidate
