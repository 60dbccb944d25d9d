"""Where the real engine's environment lives on a development machine: the venv with vLLM's CPU build that
`hack/vllm-cpu-env` installs and the tiny checkpoints `hack/tiny-models` makes, both in the user's cache so that every
clone (CI's included) shares them. The fleet driver (`--engine vllm`), the real-engine tests and
`bench tuner --engine vllm` find them here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"  # keep equal to hack/vllm-cpu-env
TINY_MODELS_NAME = "tiny-models-v1"  # keep equal to hack/tiny-models (and tiny_model.FORMAT_VERSION)


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(base) / "specdec-operator"


def vllm_cpu_venv(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("SPECDEC_VLLM_CPU_VENV") or cache_dir(env) / f"venv-vllm-cpu-{VLLM_CPU_VERSION}")


def tiny_models_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("SPECDEC_TINY_MODELS") or cache_dir(env) / TINY_MODELS_NAME)


def missing(environ: Mapping[str, str] | None = None) -> list[str]:
    """What is not installed yet, each with the command that installs it."""
    problems = []
    venv = vllm_cpu_venv(environ)
    if not (venv / "bin" / "vllm").exists() or not (venv / ".specdec-installed").exists():
        problems.append(f"no vLLM CPU venv at {venv}: run hack/vllm-cpu-env")
    tiny = tiny_models_dir(environ)
    if not (tiny / "manifest.json").exists():
        problems.append(f"no tiny models at {tiny}: run hack/tiny-models")
    return problems
