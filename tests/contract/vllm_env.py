"""Runs tests/contract/vllm_driver.py in the vLLM venv that hack/vllm-env builds (and caches)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("vllm_driver.py")
# Generous: the first run of a command pays vLLM's imports and model inspection (tens of seconds).
DRIVER_TIMEOUT_S = 1800


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


class VllmDriver:
    def __init__(self, python: Path, models_dir: Path) -> None:
        self.python = python
        self.models_dir = models_dir

    def run(self, command: str, request: dict[str, Any]) -> Any:
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
        return json.loads(result.stdout)
