"""The runtime image's entrypoint: read the config the operator rendered and exec vLLM or the simulator.

The command comes from `serve_args`, the renderer the operator uses too, so the pod runs exactly the
flags the operator validated.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from specdec_runtime import contract
from specdec_runtime.config import RuntimeConfig, serve_args
from specdec_runtime.simulator.profile import DEFAULT_PROFILE, PACKAGED_PROFILES_DIR, resolve_profile

logger = logging.getLogger(__name__)

DEFAULT_CONFIG_PATH = Path(contract.CONFIG_MOUNT_PATH) / contract.CONFIG_KEY
VLLM_EXECUTABLE = "vllm"
# A directory of local checkpoints laid out by model name (a baked image, a volume): `--models-dir`, else this.
MODELS_DIR_ENV = "SPECDEC_MODELS_DIR"


class LaunchError(ValueError):
    """A config the launcher cannot run. The message is one line naming the file and the field."""


def load_runtime_config(path: Path) -> RuntimeConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise LaunchError(f"runtime config {path}: cannot read: {err.strerror or err}") from err
    try:
        return RuntimeConfig.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top level)"
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise LaunchError(f"runtime config {path}: field {field}: {first['msg']}{more}") from err


def with_local_models(config: RuntimeConfig, models_dir: Path | None) -> RuntimeConfig:
    """The target and the drafter model named N are served from models_dir/N where that directory exists, so an
    image or volume that carries the checkpoints serves them without a hub; other names are left as they are (vLLM
    resolves them). The served model name stays the spec's, so clients and metrics see no difference."""
    if models_dir is None:
        return config

    def local(name: str | None) -> str | None:
        if not name or Path(name).is_absolute():
            return name
        candidate = models_dir / name
        return str(candidate) if candidate.is_dir() else name

    update: dict[str, object] = {"model": local(config.model)}
    if config.speculative is not None and config.speculative.model:
        update["speculative"] = config.speculative.model_copy(update={"model": local(config.speculative.model)})
    return config.model_copy(update=update)


def models_dir_from_env(environ: dict[str, str] | None = None) -> Path | None:
    value = (os.environ if environ is None else environ).get(MODELS_DIR_ENV, "")
    return Path(value) if value else None


def build_command(
    config: RuntimeConfig, *, profiles_dir: Path = PACKAGED_PROFILES_DIR, profile: str | None = None,
    models_dir: Path | None = None,
) -> list[str]:
    """argv for the engine: `vllm serve ...`, or the simulator with the same args plus its profile.

    `profile` (a name in profiles_dir or a path) overrides config.simulator_profile; `models_dir` serves the models it
    holds from local paths (`with_local_models`).
    """
    config = with_local_models(config, models_dir)
    if config.engine == "vllm":
        return [VLLM_EXECUTABLE, *serve_args(config)]
    chosen = profile or config.simulator_profile or DEFAULT_PROFILE
    try:
        profile_path = resolve_profile(chosen, profiles_dir)
    except ValueError as err:
        raise LaunchError(f"simulator_profile: {err}") from err
    return [sys.executable, "-m", "specdec_runtime.simulator", *serve_args(config), "--profile", str(profile_path)]


def launch(config_path: Path, profiles_dir: Path = PACKAGED_PROFILES_DIR, models_dir: Path | None = None) -> NoReturn:
    """Replace this process with the engine, so it receives the kubelet's signals directly. The pod's pause
    container, not the engine, is PID 1 and reaps orphaned processes (render/pool.py, shareProcessNamespace)."""
    command = build_command(load_runtime_config(config_path), profiles_dir=profiles_dir,
                            models_dir=models_dir or models_dir_from_env())
    logger.info("exec %s", shlex.join(command))
    try:
        os.execvp(command[0], command)
    except OSError as err:
        raise LaunchError(f"cannot exec {command[0]}: {err.strerror or err}") from err
