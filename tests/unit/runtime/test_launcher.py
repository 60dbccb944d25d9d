"""The launcher: config loading, the rendered command for every method, and the image entrypoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from specdec_operator.api.vocabulary import SPECULATIVE_METHODS
from specdec_runtime import launcher
from specdec_runtime.cli import main
from specdec_runtime.config import RuntimeConfig, SpeculativeSettings
from specdec_runtime.launcher import LaunchError, build_command, load_runtime_config
from specdec_runtime.simulator.profile import PACKAGED_PROFILES_DIR

GOLDEN_CONFIG = RuntimeConfig(
    model="amd/Llama-3.1-70B-Instruct-FP8-KV",
    served_model_name="llama-70b",
    tensor_parallel_size=8,
    max_model_len=16384,
    speculative=SpeculativeSettings(method="eagle3", model="amd/Llama-3.1-70B-eagle3", num_speculative_tokens=4),
    attention_backend="ROCM_AITER_FA",
    extra_args=["--gpu-memory-utilization", "0.92"],
)
GOLDEN_COMMAND = (
    "vllm serve amd/Llama-3.1-70B-Instruct-FP8-KV --served-model-name llama-70b --tensor-parallel-size 8"
    " --host 0.0.0.0 --port 8000 --max-model-len 16384 --speculative-config"
    ' \'{"method":"eagle3","model":"amd/Llama-3.1-70B-eagle3","num_speculative_tokens":4}\''
    " --attention-backend ROCM_AITER_FA --gpu-memory-utilization 0.92"
)


def write_config(tmp_path: Path, config: RuntimeConfig | dict[str, Any]) -> Path:
    path = tmp_path / "runtime.json"
    path.write_text(config.to_json() if isinstance(config, RuntimeConfig) else json.dumps(config))
    return path


def test_golden_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--config", str(write_config(tmp_path, GOLDEN_CONFIG))]) == 0
    assert capsys.readouterr().out.strip() == GOLDEN_COMMAND


@pytest.mark.parametrize("method", SPECULATIVE_METHODS)
def test_every_method_renders_its_speculative_config(method: str) -> None:
    spec = SpeculativeSettings(method=method, num_speculative_tokens=3)
    command = build_command(GOLDEN_CONFIG.model_copy(update={"speculative": spec}))
    assert command[:3] == ["vllm", "serve", GOLDEN_CONFIG.model]
    rendered = json.loads(command[command.index("--speculative-config") + 1])
    assert rendered == {"method": method, "num_speculative_tokens": 3}


def test_without_speculation_no_speculative_config_is_rendered() -> None:
    assert "--speculative-config" not in build_command(GOLDEN_CONFIG.model_copy(update={"speculative": None}))


def test_simulator_engine_runs_the_simulator_with_the_same_args_and_a_profile(tmp_path: Path) -> None:
    config = GOLDEN_CONFIG.model_copy(update={"engine": "simulator"})
    command = build_command(config)
    assert command[:3] == [sys.executable, "-m", "specdec_runtime.simulator"]
    assert command[3:-2] == build_command(GOLDEN_CONFIG)[1:]
    assert command[-2:] == ["--profile", str(PACKAGED_PROFILES_DIR / "default.yaml")]
    assert build_command(config, profile="quick")[-1] == str(PACKAGED_PROFILES_DIR / "quick.yaml")
    own = tmp_path / "mine.json"
    own.write_text("{}")
    assert build_command(config.model_copy(update={"simulator_profile": str(own)}))[-1] == str(own)
    with pytest.raises(LaunchError, match="simulator_profile: profile 'nope': not found"):
        build_command(config, profile="nope")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"model": "m", "served_model_name": "m", "port": 0}, "field port: Input should be greater than or equal to 1"),
        ({"served_model_name": "m"}, "field model: Field required"),
        ({"model": "m", "served_model_name": "m", "speculative": {"method": "eagle", "num_speculative_tokens": 2,
                                                                 "num_spec": 1}}, "field speculative.num_spec"),
        ("{not json", "field (top level): Invalid JSON"),
    ],
)
def test_bad_config_is_one_line_naming_file_and_field(
    tmp_path: Path, content: dict[str, Any] | str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runtime.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["launch", "--config", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert f"runtime config {path}: {message}" in error


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=f"runtime config {tmp_path}/absent.json: cannot read"):
        load_runtime_config(tmp_path / "absent.json")


def test_launch_execs_the_rendered_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str]]] = []

    def fake_exec(file: str, args: list[str]) -> None:
        calls.append((file, args))
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(os, "execvp", fake_exec)
    with pytest.raises(LaunchError, match="cannot exec vllm: No such file or directory"):
        launcher.launch(write_config(tmp_path, GOLDEN_CONFIG))
    assert calls == [("vllm", build_command(GOLDEN_CONFIG))]


def free_loopback_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def test_entrypoint_execs_the_simulator_which_serves_on_loopback(tmp_path: Path) -> None:
    host = "127.0.0.1"
    port = free_loopback_port(host)
    profile = tmp_path / "fast.yaml"
    profile.write_text((PACKAGED_PROFILES_DIR / "quick.yaml").read_text().replace("restart_s: 2", "restart_s: 0.2"))
    config = GOLDEN_CONFIG.model_copy(
        update={"engine": "simulator", "host": host, "port": port, "simulator_profile": str(profile)}
    )
    entrypoint = Path(sys.executable).parent / "specdec-runtime"
    process = subprocess.Popen(
        [str(entrypoint), "launch", "--config", str(write_config(tmp_path, config))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None
    started: list[str] = []
    try:
        # Start-up (the launcher's exec, the simulator's imports) takes what a busy machine gives it: wait for the
        # simulator's own "serving" line, not a clock (the suite's timeout bounds a start that never comes).
        for raw in iter(process.stdout.readline, b""):
            started.append(raw.decode())
            if "serving " in started[-1]:
                break
        else:
            raise AssertionError(f"the simulator exited before serving: {''.join(started)}")
        body = ""
        deadline = time.monotonic() + 30  # from the serving line: 0.2 s of loading, then the first scrape
        while time.monotonic() < deadline and "num_accepted_tokens_per_pos" not in body:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as response:
                    body = response.read().decode()
            except OSError:
                time.sleep(0.2)
        assert 'position="3"' in body and 'model_name="llama-70b"' in body
    finally:
        process.terminate()
        output = "".join(started) + process.communicate(timeout=10)[0].decode()
    assert process.returncode == 0, output
    # The console script may name the venv interpreter python or python3; both are this interpreter.
    assert " -m specdec_runtime.simulator serve" in output and f"exec {Path(sys.executable).parent}/python" in output


def test_simulate_subcommand_hands_every_argument_to_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "serve", "m", "--profile", str(tmp_path / "absent.yaml")]) == 2
    assert f"profile {tmp_path}/absent.yaml: cannot read" in capsys.readouterr().err


def test_a_models_dir_serves_the_target_and_the_drafter_it_holds_from_local_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baked image or a volume laid out by model name: the checkpoints it has are served from it, the others
    (here none for a second drafter name) stay hub ids for vLLM to resolve; the served name stays the spec's."""
    models = tmp_path / "models"
    (models / "amd/Llama-3.1-70B-Instruct-FP8-KV").mkdir(parents=True)
    (models / "amd/Llama-3.1-70B-eagle3").mkdir(parents=True)
    command = build_command(GOLDEN_CONFIG, models_dir=models)
    assert command[2] == str(models / "amd/Llama-3.1-70B-Instruct-FP8-KV")
    speculative = json.loads(command[command.index("--speculative-config") + 1])
    assert speculative["model"] == str(models / "amd/Llama-3.1-70B-eagle3")
    assert command[command.index("--served-model-name") + 1] == "llama-70b"
    elsewhere = GOLDEN_CONFIG.model_copy(update={"model": "org/not-baked"})
    assert build_command(elsewhere, models_dir=models)[2] == "org/not-baked"
    ngram = GOLDEN_CONFIG.model_copy(
        update={"speculative": SpeculativeSettings(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4)})
    ngram_command = build_command(ngram, models_dir=models)
    assert "model" not in json.loads(ngram_command[ngram_command.index("--speculative-config") + 1])
    # The same through the environment, as a pod would set it, and on `render`.
    monkeypatch.setenv(launcher.MODELS_DIR_ENV, str(models))
    assert main(["render", "--config", str(write_config(tmp_path, GOLDEN_CONFIG))]) == 0
    assert str(models / "amd/Llama-3.1-70B-eagle3") in capsys.readouterr().out
