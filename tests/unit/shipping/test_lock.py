"""requirements/operator.lock: the operator's runtime dependencies, pinned and hashed, at the versions the tests
run on, and what the image installs (hack/lock writes it)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.unit.shipping.chart import REPO_ROOT
from tests.unit.shipping.test_dockerfiles import OPERATOR_DOCKERFILE, parse_stages

LOCK = REPO_ROOT / "requirements" / "operator.lock"
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)")


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, number of sha256 hashes), read from the lock's requirement lines."""
    entries: dict[str, tuple[str, int]] = {}
    name = None
    for line in LOCK.read_text().splitlines():
        found = _ENTRY.match(line)
        if found:
            name = canonicalize_name(found.group(1))
            entries[name] = (found.group(2), 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            version, hashes = entries[name]
            entries[name] = (version, hashes + 1)
    return entries


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def test_every_runtime_dependency_and_theirs_is_pinned_with_hashes() -> None:
    entries = locked()
    for requirement in runtime_requirements():
        name = canonicalize_name(requirement.name)
        assert name in entries, f"{requirement.name} is in pyproject.toml but not in the lock: run hack/lock"
        version, hashes = entries[name]
        assert requirement.specifier.contains(version), (requirement, version)
    for name, (version, hashes) in entries.items():
        assert hashes >= 1, f"{name}=={version} has no hash"
        for requirement in metadata.requires(name) or []:
            dependency = Requirement(requirement)
            if dependency.marker is None or dependency.marker.evaluate({"extra": ""}):
                assert canonicalize_name(dependency.name) in entries, f"{name} needs {dependency}, not locked"


def test_the_tests_run_on_the_locked_versions() -> None:
    """hack/setup installs the lock first: the image then holds the versions this suite ran on."""
    for name, (version, _) in locked().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{name} is locked but not installed: run hack/setup")
        assert installed == version, f"{name}: locked {version}, installed {installed}: run hack/setup or hack/lock"


def test_the_image_installs_the_lock_with_hashes_checked_in_both_stages() -> None:
    runs = {stage.name: " ".join(value for name, value in stage.instructions if name == "RUN")
            for stage in parse_stages(OPERATOR_DOCKERFILE)}
    for stage in ("build", "operator"):
        assert "--require-hashes -r" in runs[stage] and "operator.lock" in runs[stage], stage
    assert "--no-deps" in runs["build"] and "--no-deps" in runs["operator"]  # the project adds nothing unlocked
