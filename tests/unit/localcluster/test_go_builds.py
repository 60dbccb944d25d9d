"""Each wrapper module's binaries land under the names the cache looks them up by."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from localcluster import build
from localcluster.versions import AUTOSCALING_TOOLS, BUILDS, GATEWAY_TOOLS, TOOLS, GoBuild


@pytest.fixture(autouse=True)
def _fake_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "go_binary", lambda: "go")


@pytest.mark.parametrize("go_build", [*BUILDS, *TOOLS, *GATEWAY_TOOLS, *AUTOSCALING_TOOLS], ids=lambda b: b.name)
def test_every_binary_is_written_under_its_own_name(go_build: GoBuild) -> None:
    out = Path("/out")
    written: set[str] = set()
    for command in build._go_build_commands(go_build, out):
        target = command[command.index("-o") + 1]
        packages = command[command.index("-o") + 2:]
        if target.endswith("/"):
            written |= {package.rsplit("/", 1)[-1] for package in packages}
        else:
            assert len(packages) == 1
            written.add(Path(target).name)
    assert written == set(go_build.packages)


def test_kubernetes_builds_in_one_go_command_and_keda_in_one_per_binary() -> None:
    (kubernetes,) = [b for b in BUILDS if b.name == "kubernetes"]
    (keda,) = [b for b in AUTOSCALING_TOOLS if b.name == "keda"]
    assert len(build._go_build_commands(kubernetes, Path("/out"))) == 1
    assert [c[c.index("-o") + 1] for c in build._go_build_commands(keda, Path("/out"))] == ["/out/keda",
                                                                                           "/out/keda-adapter"]


def test_wrapper_modules_exist_for_every_build() -> None:
    for go_build in (*BUILDS, *TOOLS, *GATEWAY_TOOLS, *AUTOSCALING_TOOLS):
        assert (go_build.module_dir / "go.mod").is_file(), go_build.name
        assert (go_build.module_dir / "tools.go").is_file(), go_build.name


def test_processes_that_need_one_build_at_once_build_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hack/test brings up two clusters side by side; cold, each used to compile kubernetes on its own.
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    (promtool,) = [b for b in TOOLS if b.name == "promtool"]
    building, release = threading.Event(), threading.Event()
    builds: list[Path] = []

    def fake_go_build(go_build: GoBuild, out_dir: Path, log_path: Path, log: build.Log) -> None:
        builds.append(out_dir)
        building.set()
        assert release.wait(30)  # the second caller arrives while this build runs
        for name in go_build.packages:
            (out_dir / name).write_text("binary")

    monkeypatch.setattr(build, "_run_go_build", fake_go_build)
    lines: list[str] = []
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(build.ensure_build(promtool, lines.append)))
    first.start()
    assert building.wait(30)
    second = threading.Thread(target=lambda: results.append(build.ensure_build(promtool, lines.append)))
    second.start()
    for _ in range(600):  # the second caller logs that it waits, then blocks on the lock
        if any(line.startswith("waiting for another process building promtool") for line in lines):
            break
        time.sleep(0.05)
    release.set()
    first.join(30)
    second.join(30)
    assert len(builds) == 1, builds
    assert results == [build.binary_dir(promtool)] * 2 and (results[0] / "promtool").read_text() == "binary"
    assert any(line.startswith("waiting for another process building promtool") for line in lines), lines
