"""Runs tests/contract/vllm_driver.py in the vLLM venv that hack/vllm-env builds (and caches).

vLLM's answers are a deterministic function of the installed vLLM (and its dependencies), the driver's source
and the request, so each answer is cached under a key made of exactly those; a changed case, driver or vLLM
asks vLLM again. `pytest --fresh` (hack/test --thorough or --fresh) ignores the cache and refreshes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("vllm_driver.py")
# Generous: the first run of a command pays vLLM's imports and model inspection (tens of seconds).
DRIVER_TIMEOUT_S = 1800
CACHE_DIR = Path(os.environ.get("SPECDEC_CONTRACT_CACHE",
                                Path.home() / ".cache" / "specdec-operator" / "contract-verdicts"))
# Commands whose effect is files under the models directory as well as their answer (`models` writes the config
# directories): their cache entry holds those files too, and a hit writes them back.
WRITES_MODEL_FILES = frozenset({"models"})
# The per-session models directory is a temporary path; keys and cached answers carry this placeholder instead.
MODELS_DIR_MARK = "@MODELS_DIR@"


class VllmDriverError(RuntimeError):
    pass


def vllm_python() -> Path:
    """The vLLM venv's interpreter; hack/vllm-env is a no-op once it is installed."""
    result = subprocess.run(
        [str(REPO / "hack" / "vllm-env")], capture_output=True, text=True, check=False, timeout=3600
    )
    if result.returncode != 0:
        raise VllmDriverError(f"hack/vllm-env failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def environment_fingerprint(python: Path) -> str:
    """Every distribution installed in the vLLM venv (name and version, from the dist-info directory names)
    plus the driver's source: what vLLM's answers depend on besides the request."""
    venv = python.parent.parent
    installed = sorted(path.name for path in venv.glob("lib/python*/site-packages/*.dist-info"))
    if not any(name.startswith("vllm-") for name in installed):
        raise VllmDriverError(f"no vllm distribution in {venv}; run hack/vllm-env")
    digest = hashlib.sha256()
    digest.update("\n".join(installed).encode())
    digest.update(DRIVER.read_bytes())
    return digest.hexdigest()


class VllmDriver:
    def __init__(self, python: Path, models_dir: Path, *, fresh: bool = False, cache_dir: Path = CACHE_DIR) -> None:
        self.python = python
        self.models_dir = models_dir
        self.fresh = fresh
        self.cache_dir = cache_dir
        self.fingerprint = environment_fingerprint(python)
        self.hits = 0
        self.misses = 0

    def _cache_path(self, command: str, request: dict[str, Any]) -> Path:
        canonical = json.dumps(request, sort_keys=True).replace(str(self.models_dir), MODELS_DIR_MARK)
        key = hashlib.sha256(f"{self.fingerprint}\n{command}\n{canonical}".encode()).hexdigest()
        return self.cache_dir / f"{command}-{key}.json"

    def run(self, command: str, request: dict[str, Any]) -> Any:
        cache = self._cache_path(command, request)
        writes_files = command in WRITES_MODEL_FILES
        if not self.fresh and cache.is_file():
            self.hits += 1
            stored = cache.read_text().replace(MODELS_DIR_MARK, str(self.models_dir))
            if not writes_files:
                return json.loads(stored)
            entry = json.loads(stored)
            for relative, text in entry["files"].items():
                (self.models_dir / relative).parent.mkdir(parents=True, exist_ok=True)
                (self.models_dir / relative).write_text(text)
            return entry["answer"]
        self.misses += 1
        before = set(self._model_files())
        answer_text = self._ask_vllm(command, request)
        answer = json.loads(answer_text)
        stored = answer_text
        if writes_files:
            files = {relative: (self.models_dir / relative).read_text()
                     for relative in sorted(set(self._model_files()) - before)}
            stored = json.dumps({"answer": answer, "files": files})
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(stored.replace(str(self.models_dir), MODELS_DIR_MARK))
        partial.replace(cache)  # atomic: a concurrent reader sees the whole answer or none
        return answer

    def _model_files(self) -> list[str]:
        return [str(path.relative_to(self.models_dir)) for path in self.models_dir.rglob("*") if path.is_file()]

    def _ask_vllm(self, command: str, request: dict[str, Any]) -> str:
        env = {
            **os.environ,
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        result = subprocess.run(
            [str(self.python), str(DRIVER), command],
            input=json.dumps({**request, "models_dir": str(self.models_dir)}),
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=DRIVER_TIMEOUT_S,
        )
        if result.returncode != 0:
            raise VllmDriverError(f"vllm_driver.py {command} exited {result.returncode}:\n{result.stderr[-6000:]}")
        return result.stdout
