"""The simulator starts from exactly the args serve_args() renders and refuses what vLLM refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_operator.api.vocabulary import REFUSED_METHODS, SPECULATIVE_METHODS
from specdec_runtime.config import RuntimeConfig, SpeculativeSettings, serve_args
from specdec_runtime.simulator.vllm_cli import EXIT_PARSE_ERROR, EXIT_STARTUP_REFUSED, parse_serve_args


# suffix needs arctic-inference, which vLLM's ROCm images lack: vLLM and the simulator refuse it at start-up.
@pytest.mark.parametrize("method", [m for m in SPECULATIVE_METHODS if m not in (*REFUSED_METHODS, "suffix")])
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
    [("[1]", "must be a JSON object"), ("{oops", "not valid JSON")],
)
def test_a_speculative_config_vllms_parser_refuses_is_one_error_line_and_exit_2(
    config: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_serve_args(["serve", "m", "--profile", "p.yaml", "--speculative-config", config])
    assert exited.value.code == EXIT_PARSE_ERROR
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "--speculative-config" in error and message in error


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The last stderr line of a start-up refusal: `<vLLM's exception class>: <vLLM's message>`, exit 1."""
    with pytest.raises(SystemExit) as exited:
        parse_serve_args(["serve", *argv, "--profile", "p.yaml"])
    assert exited.value.code == EXIT_STARTUP_REFUSED
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    return error.strip()


# (speculative config, tensor-parallel size, the line vLLM 0.33's start-up ends with); tests/contract checks
# each against vLLM itself.
START_UP_REFUSALS: list[tuple[dict[str, object], int, str]] = [
    ({"method": "eagle", "num_speculative_tokens": 3, "speculative_model": "x"}, 1,
     "ValidationError: Unexpected keyword argument"),
    ({"method": "ngram", "num_speculative_tokens": "three"}, 1,
     "ValidationError: Input should be a valid integer, unable to parse string as an integer"),
    ({"method": "medusa", "model": "org/m", "num_speculative_tokens": 3}, 1,
     "ValidationError: Input should be 'ngram', 'draft_model', 'suffix'"),
    ({"method": "eagle3", "model": "org/m", "num_speculative_tokens": 0}, 1,
     "ValidationError: Input should be greater than 0"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}, 1,
     "ValidationError: Input should be greater than or equal to 1"),
    ({"method": "ngram"}, 1, "ValidationError: num_speculative_tokens must be provided with speculative model unless "
     "the draft model config contains an n_predict parameter."),
    ({"num_speculative_tokens": 3}, 1,
     "ValidationError: num_speculative_tokens was provided but without speculative model."),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 6, "prompt_lookup_max": 2}, 1,
     "ValidationError: prompt_lookup_min=6 must be <= prompt_lookup_max=2"),
    ({"method": "suffix", "num_speculative_tokens": 3}, 1,
     "ImportError: Arctic Inference is required for suffix decoding. Install via `pip install "
     "arctic-inference==0.1.1`."),
    ({"method": "eagle3", "model": "org/m", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2}, 4,
     "ValidationError: speculative_draft_tensor_parallel_size=2 cannot be other value than 1 or target model "
     "tensor_parallel_size"),
    ({"method": "ngram", "num_speculative_tokens": 3, "tensor_parallel_size": 2}, 1,
     "ValidationError: 'tensor_parallel_size' is not a valid argument in the speculative_config. Please pass "
     "'draft_tensor_parallel_size' instead."),
    ({"method": "ngram", "num_speculative_tokens": 3, "draft_lm_head_quantization": "fp8"}, 1,
     "ValidationError: draft_lm_head_quantization is not supported for method 'ngram'."),
    ({"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 2.0}, 1,
     "ValidationError: synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
     "rejection_sample_method='synthetic'."),
    ({"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
      "synthetic_acceptance_rates": [0.5, 0.6]}, 1,
     "ValidationError: synthetic_acceptance_rates must be non-increasing, got [0.5, 0.6]."),
    ({"method": "ngram", "num_speculative_tokens": 1, "rejection_sample_method": "fly"}, 1,
     "ValidationError: FLy requires num_speculative_tokens to be at least 2."),
    ({"method": "eagle3", "model": "org/m", "num_speculative_tokens": 3, "use_heterogeneous_vocab": True}, 1,
     "ValidationError: use_heterogeneous_vocab only works with method='draft_model'"),
    ({"method": "ngram", "num_speculative_tokens": 3, "index_share_for_mtp_iteration": True}, 1,
     "ValidationError: index_share_for_mtp_iteration is only supported with method='mtp'"),
    ({"method": "extract_hidden_states", "num_speculative_tokens": 1, "draft_sample_method": "probabilistic",
      "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1]}}}, 1,
     "ValueError: extract_hidden_states only supports draft_sample_method='greedy'"),
    ({"method": "extract_hidden_states"}, 1,
     "ValidationError: num_speculative_tokens must be provided with speculative model"),
    ({"method": "extract_hidden_states", "num_speculative_tokens": 2}, 1,
     "ValueError: extract_hidden_states requires num_speculative_tokens to be 1"),
]


@pytest.mark.parametrize(("config", "tp", "line"), START_UP_REFUSALS, ids=lambda v: str(v)[:60])
def test_a_config_vllm_refuses_at_start_up_exits_1_with_vllms_message(
    config: dict[str, object], tp: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refusal(["m", "-tp", str(tp), *spec_config(**config)], capsys).startswith(line)


def test_integers_are_read_as_pydantic_reads_them() -> None:
    argv = ["serve", "m", "--profile", "p.yaml", *spec_config(method="ngram", num_speculative_tokens="3")]
    speculation = parse_serve_args(argv).speculation()
    assert speculation is not None and speculation.num_speculative_tokens == 3


def test_the_method_list_in_the_refusal_is_vllms(capsys: pytest.CaptureFixture[str]) -> None:
    line = refusal(["m", *spec_config(method="medusa", num_speculative_tokens=3)], capsys)
    assert line.endswith("'glm5_next_mtp', 'dflash', 'ngram_gpu' or 'dspark'")


def test_legacy_mtp_names_read_as_mtp_and_k_is_the_checkpoints_when_absent(tmp_path: Path) -> None:
    deepseek = hf_dir(tmp_path, model_type="deepseek_v3", num_nextn_predict_layers=2)
    options = parse_serve_args(["serve", deepseek, "--profile", "p.yaml", *spec_config(method="deepseek_mtp")])
    speculation = options.speculation()
    assert speculation is not None and speculation.num_speculative_tokens == 2


def hf_dir(tmp_path: Path, **config: object) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


ATTENTION_CLASH = "ValueError: attention_backend and attention_config.backend are mutually exclusive"


@pytest.mark.parametrize(
    "extra",
    [
        ["--attention-config", '{"backend":"TRITON_ATTN"}'],
        ["-ac", '{"backend":"TRITON_ATTN"}'],
        ["--attention-config.backend", "TRITON_ATTN"],
        ["--attention_config.backend=TRITON_ATTN"],
        ["-ac.backend=TRITON_ATTN"],
        ["--attention-conf.backend=TRITON_ATTN"],
    ],
)
def test_attention_backend_with_attention_config_backend_is_refused_as_vllm_refuses_it(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert refusal(["m", "--attention-backend", "ROCM_AITER_FA", *extra], capsys) == ATTENTION_CLASH


def test_other_attention_config_keys_start(capsys: pytest.CaptureFixture[str]) -> None:
    options = parse_serve_args(
        ["serve", "m", "--profile", "p.yaml", "--attention-backend", "X", "--attention-config.flash_attn_version=3"]
    )
    assert options.model == "m"


def spec_config(**config: object) -> list[str]:
    return ["--speculative-config", json.dumps(config)]


def test_mtp_on_a_target_without_mtp_layers_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    llama = hf_dir(tmp_path, model_type="llama", num_hidden_layers=2)
    message = refusal([llama, *spec_config(method="mtp", num_speculative_tokens=1)], capsys)
    assert message == "NotImplementedError: Unsupported speculative method: 'mtp'"


@pytest.mark.parametrize(("k", "starts"), [(1, True), (2, True), (3, False), (4, True), (5, False), (6, True)])
def test_mtp_k_above_the_layer_count_must_be_a_multiple_of_it(
    k: int, starts: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deepseek = hf_dir(tmp_path, model_type="deepseek_v3", num_nextn_predict_layers=2)
    argv = [deepseek, *spec_config(method="mtp", num_speculative_tokens=k)]
    if starts:
        options = parse_serve_args(["serve", *argv, "--profile", "p.yaml"])
        assert options.speculative_config == {"method": "mtp", "num_speculative_tokens": k}
    else:
        assert refusal(argv, capsys) == f"ValidationError: num_speculative_tokens:{k} must be divisible by n_predict=2"


def test_extract_hidden_states_runs_only_at_k_1_with_its_layer_ids(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(["m", *spec_config(method="extract_hidden_states", num_speculative_tokens=2)], capsys) == (
        "ValueError: extract_hidden_states requires num_speculative_tokens to be 1"
    )
    assert refusal(["m", *spec_config(method="extract_hidden_states", num_speculative_tokens=1)], capsys) == (
        "ValueError: eagle_aux_hidden_state_layer_ids must be set in the draft model config for "
        "extract_hidden_states method"
    )
    layers = {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1]}}
    argv = ["serve", "m", "--profile", "p.yaml",
            *spec_config(method="extract_hidden_states", num_speculative_tokens=1, draft_model_config=layers)]
    assert parse_serve_args(argv).speculative_config is not None


def test_spec_aliases_merge_into_the_speculative_config_and_clash_like_vllms(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = parse_serve_args(["serve", "m", "--profile", "p.yaml", "--spec-method", "ngram", "--spec-tokens", "3"])
    assert options.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    message = refusal(["m", *spec_config(method="ngram", num_speculative_tokens=3), "--spec-tokens", "2"], capsys)
    assert message == (
        "ValueError: --spec-tokens and --speculative-config['num_speculative_tokens'] are mutually exclusive"
    )
