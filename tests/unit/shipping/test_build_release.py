"""hack/build-release: what it would build, checked with stand-in `docker` and `helm` that record their calls."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
RECORDER = '#!/usr/bin/env bash\necho "$(basename "$0") $*" >> "$CALLS"\n'


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the files the script reads, so pinning and building never touch the repository."""
    root = tmp_path / "repo"
    for path in ("hack/build-release", "hack/release/bases.env", "pyproject.toml",
                 "charts/specdec-operator/Chart.yaml"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, root / path)
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("docker", "helm"):
        (tools / name).write_text(RECORDER)
        (tools / name).chmod(0o755)
    return root


def _run(root: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = root.parent / "calls.txt"
    env = {**os.environ, "PATH": f"{root.parent / 'bin'}{os.pathsep}{os.environ['PATH']}", "CALLS": str(calls)}
    result = subprocess.run([str(root / "hack" / "build-release"), *args], capture_output=True, text=True,
                            env=env, timeout=60, check=False)
    return result, calls.read_text().splitlines() if calls.exists() else []


def _pin(root: Path) -> None:
    bases = root / "hack" / "release" / "bases.env"
    text = bases.read_text().replace("PYTHON_IMAGE_DIGEST=\n", f"PYTHON_IMAGE_DIGEST={DIGEST_A}\n")
    bases.write_text(text.replace("VLLM_ROCM_IMAGE_DIGEST=\n", f"VLLM_ROCM_IMAGE_DIGEST={DIGEST_B}\n"))


def test_refuses_to_build_from_unpinned_bases(tree: Path) -> None:
    result, calls = _run(tree)
    assert result.returncode == 1
    assert "PYTHON_IMAGE_DIGEST is empty" in result.stderr
    assert calls == []


def test_builds_every_image_from_digests_then_lints_and_packages_the_chart(tree: Path) -> None:
    _pin(tree)
    result, calls = _run(tree, "--registry", "registry.example/specdec")
    assert result.returncode == 0, result.stderr
    builds = [call for call in calls if call.startswith("docker buildx build")]
    tags = [call.split("--tag ")[1].split()[0] for call in builds]
    assert tags == ["registry.example/specdec/specdec-operator:0.1.0",
                    "registry.example/specdec/specdec-runtime:0.1.0-simulator",
                    "registry.example/specdec/specdec-runtime:0.1.0-vllm0.33.0-cdna"]
    assert all(f"PYTHON_IMAGE=python:3.11.14-slim-bookworm@{DIGEST_A}" in call for call in builds)
    assert f"VLLM_ROCM_IMAGE=vllm/vllm-openai-rocm:v0.33.0@{DIGEST_B}" in builds[2]
    assert "skipping the rdna3 runtime image" in result.stdout
    assert calls[-2:] == ["helm lint --strict charts/specdec-operator",
                          "helm package charts/specdec-operator --version 0.1.0 --app-version 0.1.0 "
                          "--destination dist/release"]


def test_the_committed_dockerfiles_take_the_pinned_base_arguments() -> None:
    for dockerfile, args in (("Dockerfile", ["PYTHON_IMAGE"]), ("runtime/Dockerfile", ["PYTHON_IMAGE",
                                                                                       "VLLM_ROCM_IMAGE"])):
        text = (REPO / dockerfile).read_text()
        for arg in args:
            assert f"ARG {arg}=" in text and f"FROM ${{{arg}}}" in text, (dockerfile, arg)
