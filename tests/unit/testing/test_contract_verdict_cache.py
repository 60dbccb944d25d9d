"""The contract suite's verdict cache (tests/contract/vllm_env.py) against a stand-in for the vLLM venv: a
script that answers like vllm_driver.py and counts how often it was asked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.contract import vllm_env
from tests.contract.vllm_env import MODELS_DIR_MARK, VllmDriver, VllmDriverError

STAND_IN = """\
import json, pathlib, sys
calls = pathlib.Path(__file__).with_name("calls")
calls.write_text(calls.read_text() + sys.argv[-1] + "\\n" if calls.exists() else sys.argv[-1] + "\\n")
request = json.load(sys.stdin)
if sys.argv[-1] == "models":
    target = pathlib.Path(request["models_dir"]) / "target-llama"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps({"at": request["models_dir"]}))
json.dump({"command": sys.argv[-1], "path": request["models_dir"] + "/target-llama",
           "echo": request.get("cases")}, sys.stdout)
"""


def venv(root: Path, packages: list[str]) -> Path:
    """A directory shaped like a venv: bin/python runs the stand-in; site-packages lists `packages`."""
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for package in packages:
        (site / f"{package}.dist-info").mkdir()
    (root / "bin").mkdir()
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {root / 'stand_in.py'} \"$@\"\n")
    python.chmod(0o755)
    (root / "stand_in.py").write_text(STAND_IN)
    return python


def calls(python: Path) -> list[str]:
    path = python.parent.parent / "calls"
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def driver_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The stand-in ignores the driver path it is given; the driver's source is part of the key.
    source = tmp_path / "vllm_driver.py"
    source.write_text("# driver v1\n")
    monkeypatch.setattr(vllm_env, "DRIVER", source)
    return source


def test_a_repeated_request_is_answered_from_the_cache_with_this_sessions_paths(
    tmp_path: Path, driver_file: Path
) -> None:
    python = venv(tmp_path / "venv", ["vllm-0.33.0", "torch-2.9.0"])
    cache = tmp_path / "cache"
    first = VllmDriver(python, tmp_path / "models-1", cache_dir=cache)
    answer = first.run("serve", {"cases": [{"id": "a", "argv": ["--model", str(tmp_path / "models-1")]}]})
    assert answer["path"] == f"{tmp_path / 'models-1'}/target-llama"
    assert calls(python) == ["serve"] and (first.hits, first.misses) == (0, 1)
    stored = next(cache.iterdir()).read_text()
    assert MODELS_DIR_MARK in stored and str(tmp_path / "models-1") not in stored

    # The next session's models directory differs: same key, and the answer carries the new path.
    second = VllmDriver(python, tmp_path / "models-2", cache_dir=cache)
    again = second.run("serve", {"cases": [{"id": "a", "argv": ["--model", str(tmp_path / "models-2")]}]})
    assert again["path"] == f"{tmp_path / 'models-2'}/target-llama"
    assert again["echo"] == [{"id": "a", "argv": ["--model", str(tmp_path / "models-2")]}]
    assert calls(python) == ["serve"] and (second.hits, second.misses) == (1, 0)


def test_a_new_case_a_changed_driver_or_another_vllm_asks_vllm_again(tmp_path: Path, driver_file: Path) -> None:
    cache = tmp_path / "cache"
    python = venv(tmp_path / "venv", ["vllm-0.33.0", "torch-2.9.0"])
    VllmDriver(python, tmp_path / "m", cache_dir=cache).run("serve", {"cases": [{"id": "a", "argv": []}]})
    VllmDriver(python, tmp_path / "m", cache_dir=cache).run("serve", {"cases": [{"id": "b", "argv": []}]})
    assert calls(python) == ["serve", "serve"]
    driver_file.write_text("# driver v2\n")
    VllmDriver(python, tmp_path / "m", cache_dir=cache).run("serve", {"cases": [{"id": "a", "argv": []}]})
    assert calls(python) == ["serve"] * 3
    other = venv(tmp_path / "other-venv", ["vllm-0.34.0", "torch-2.9.0"])
    VllmDriver(other, tmp_path / "m", cache_dir=cache).run("serve", {"cases": [{"id": "a", "argv": []}]})
    assert calls(other) == ["serve"]


def test_fresh_asks_vllm_and_refreshes_the_cache(tmp_path: Path, driver_file: Path) -> None:
    cache = tmp_path / "cache"
    python = venv(tmp_path / "venv", ["vllm-0.33.0"])
    VllmDriver(python, tmp_path / "m", cache_dir=cache).run("options", {})
    fresh = VllmDriver(python, tmp_path / "m", cache_dir=cache, fresh=True)
    fresh.run("options", {})
    assert calls(python) == ["options", "options"] and (fresh.hits, fresh.misses) == (0, 1)


def test_the_model_directories_are_cached_with_their_files_and_written_into_each_session(
    tmp_path: Path, driver_file: Path
) -> None:
    cache = tmp_path / "cache"
    python = venv(tmp_path / "venv", ["vllm-0.33.0"])
    first_dir = tmp_path / "models-1"
    first_dir.mkdir()
    first = VllmDriver(python, first_dir, cache_dir=cache).run("models", {"dir": str(first_dir)})
    assert first["path"] == f"{first_dir}/target-llama"
    second_dir = tmp_path / "models-2"
    second_dir.mkdir()
    second = VllmDriver(python, second_dir, cache_dir=cache)
    answer = second.run("models", {"dir": str(second_dir)})
    assert calls(python) == ["models"] and (second.hits, second.misses) == (1, 0)
    # The files are this session's, with this session's paths in them, as the driver would have written them.
    assert answer["path"] == f"{second_dir}/target-llama"
    assert (second_dir / "target-llama" / "config.json").read_text() == f'{{"at": "{second_dir}"}}'


def test_a_venv_without_vllm_is_refused_by_name(tmp_path: Path, driver_file: Path) -> None:
    python = venv(tmp_path / "venv", ["torch-2.9.0"])
    with pytest.raises(VllmDriverError, match="no vllm distribution"):
        VllmDriver(python, tmp_path / "m", cache_dir=tmp_path / "cache")


def test_vllm_driver_errors_are_not_cached(tmp_path: Path, driver_file: Path) -> None:
    python = venv(tmp_path / "venv", ["vllm-0.33.0"])
    (tmp_path / "venv" / "stand_in.py").write_text("import sys\nsys.exit('refused')\n")
    driver = VllmDriver(python, tmp_path / "m", cache_dir=tmp_path / "cache")
    with pytest.raises(VllmDriverError, match="exited 1"):
        driver.run("serve", {"cases": []})
    assert not (tmp_path / "cache").exists()
