"""The simulator starts from exactly the args serve_args() renders and refuses what vLLM refuses."""

from __future__ import annotations

import json

import pytest

from specdec_operator.api.vocabulary import SPECULATIVE_METHODS
from specdec_runtime.config import RuntimeConfig, SpeculativeSettings, serve_args
from specdec_runtime.simulator.vllm_cli import parse_serve_args


@pytest.mark.parametrize("method", SPECULATIVE_METHODS)
def test_rendered_args_start_the_simulator_for_every_method(method: str) -> None:
    spec = SpeculativeSettings(method=method, model="org/drafter", num_speculative_tokens=4)
    config = RuntimeConfig(
        model="org/target", served_model_name="target", tensor_parallel_size=2, max_model_len=8192,
        port=8123, host="127.0.0.9", speculative=spec, attention_backend="TRITON_ATTN",
        extra_args=["--gpu-memory-utilization", "0.9", "--enable-prefix-caching"],
    )
    options = parse_serve_args([*serve_args(config), "--profile", "p.yaml"])
    assert (options.model, options.served_model_name, options.host, options.port) == (
        "org/target", "target", "127.0.0.9", 8123,
    )
    assert (options.tensor_parallel_size, options.max_model_len) == (2, 8192)
    assert options.speculative_config == spec.model_dump(exclude_none=True)
    assert options.ignored_args == ("--gpu-memory-utilization", "0.9", "--enable-prefix-caching")
    speculation = options.speculation()
    assert speculation is not None and speculation.num_speculative_tokens == 4


def test_without_speculative_config_there_is_no_speculation() -> None:
    options = parse_serve_args(["serve", "org/target", "--profile", "p.yaml", "-tp", "4"])
    assert (options.speculation(), options.served_model_name, options.tensor_parallel_size) == (
        None, "org/target", 4,
    )


def test_batch_size_table_only_behind_the_switch() -> None:
    config = json.dumps({"method": "mtp", "num_speculative_tokens": 3,
                         "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 64, 1]]})
    base = ["serve", "m", "--profile", "p.yaml", "-sc", config]
    plain = parse_serve_args(base).speculation()
    switched = parse_serve_args([*base, "--simulate-dynamic-k"]).speculation()
    assert plain is not None and plain.per_batch_size is None
    assert switched is not None and switched.k_for_batch(20) == 1


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"method":"eagle","num_speculative_tokens":3,"speculative_model":"x"}',
         "extra inputs are not permitted: speculative_model"),
        ('{"method":"eagle"}', "num_speculative_tokens must be an integer > 0"),
        ('{"method":"eagle","num_speculative_tokens":0}', "num_speculative_tokens must be an integer > 0"),
        ("[1]", "must be a JSON object"),
        ("{oops", "not valid JSON"),
        ('{"num_speculative_tokens":2,"num_speculative_tokens_per_batch_size":[[2,4,1]]}', "must start at 1"),
    ],
)
def test_bad_speculative_config_is_one_error_line_and_exit_2(
    config: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_serve_args(["serve", "m", "--profile", "p.yaml", "--speculative-config", config])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "--speculative-config" in error and message in error
