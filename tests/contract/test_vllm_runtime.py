"""vLLM 0.33.0 itself judges what the operator renders: its `vllm serve` parser, validate_parsed_serve_args,
EngineArgs.create_speculative_config and create_engine_config, its ROCm attention-backend selection per gfx
target, and the proposer classes it starts. Runs in the venv hack/vllm-env builds (see docs/vllm-contract.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdec_operator.api.spec import Runtime
from specdec_operator.api.vocabulary import (
    GPU_SIZING_VLLM_FLAGS,
    OWNED_VLLM_FLAGS,
    REFUSED_METHODS,
    gpu_sizing_flag_reached,
    owned_config_key_reached,
    refused_flag_reached,
    vllm_accepts_k,
)
from specdec_operator.decisions.drafter import UNSUPPORTED_ON_ROCM
from specdec_operator.decisions.runtime_env import attention_backend, mla_attention_backend
from specdec_runtime.config import serve_args
from tests.contract import cases as rendered
from tests.contract.conftest import AITER_OFF, Verdicts

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]

EXAMPLE_CASES = rendered.example_cases()
METHOD_CASES = rendered.method_cases()


def assert_vllm_starts_as_rendered(case: rendered.Case, verdict: dict[str, Any]) -> None:
    assert verdict["stage"] is None, f"vLLM refused at {verdict['stage']}: {verdict['error']}: {verdict['message']}"
    config = case.config
    assert verdict["served_model_name"] == config.served_model_name
    assert verdict["tensor_parallel_size"] == config.tensor_parallel_size
    assert (verdict["host"], verdict["port"]) == (config.host, config.port)
    assert verdict["shutdown_timeout"] == config.shutdown_timeout
    assert verdict["attention_backend"] == config.attention_backend
    expected_per_kind = {} if config.mla_attention_backend is None else {"mla_attention": config.mla_attention_backend}
    assert verdict["backend_per_kind"] == expected_per_kind
    assert not verdict["disable_log_stats"], "the tuner needs vLLM's stats logging on"
    if config.max_model_len is not None:
        assert verdict["max_model_len"] == config.max_model_len
    speculative = config.speculative
    if speculative is None:
        assert "speculative" not in verdict
        return
    seen = verdict["speculative"]
    assert (seen["method"], seen["num_speculative_tokens"]) == (speculative.method, speculative.num_speculative_tokens)
    for key in ("prompt_lookup_min", "prompt_lookup_max", "draft_tensor_parallel_size"):
        if getattr(speculative, key) is not None:
            assert seen[key] == getattr(speculative, key), key


@pytest.mark.parametrize("case", EXAMPLE_CASES, ids=[case.id for case in EXAMPLE_CASES])
def test_every_example_renders_what_vllm_starts(
    case: rendered.Case, models: dict[str, str], vllm_serve: Verdicts
) -> None:
    assert_vllm_starts_as_rendered(case, vllm_serve[case.argv(models)])


def test_a_pool_on_the_upstream_vllm_image_runs_that_images_vllm_with_arguments_vllm_starts(
    models: dict[str, str], vllm_serve: Verdicts
) -> None:
    """spec.runtime.image names the upstream vllm/vllm-openai-rocm image as it is: the pod's container runs its
    `vllm` with the rendered arguments, and vLLM 0.33 starts with them (issue 32, item 1)."""
    case, container = rendered.upstream_image_case()
    assert container["image"] == rendered.UPSTREAM_IMAGE and container["command"] == ["vllm"]
    assert list(case.args) == serve_args(case.config)
    assert_vllm_starts_as_rendered(case, vllm_serve[case.argv(models)])


@pytest.mark.parametrize("case", METHOD_CASES, ids=[case.id for case in METHOD_CASES])
def test_every_method_gfx_target_and_k_bound_renders_what_vllm_starts(
    case: rendered.Case, models: dict[str, str], vllm_serve: Verdicts
) -> None:
    assert_vllm_starts_as_rendered(case, vllm_serve[case.argv(models)])


def test_a_users_mla_backend_in_extra_args_would_win_so_admission_refuses_it(
    models: dict[str, str], vllm_serve: Verdicts
) -> None:
    """vLLM takes the later per-kind backend over the one the operator renders per gfx target, so one value
    in extraArgs would override it on every pool: admission refuses it (vocabulary.OWNED_CONFIG_KEYS)."""
    with pytest.raises(ValueError, match="nor backend_per_kind"):
        Runtime.model_validate({"extraArgs": rendered.MLA_OVERRIDE})
    argv = rendered.mla_override_argv(models)
    assert "--attention-config.backend_per_kind.mla_attention=ROCM_AITER_MLA" in argv  # rendered for gfx942
    verdict = vllm_serve[argv]
    assert verdict["stage"] is None, verdict
    assert verdict["backend_per_kind"] == {"mla_attention": "TRITON_MLA"}
    assert verdict["attention_backend"] == "ROCM_AITER_FA"


MTP_K = rendered.mtp_k_cases()


@pytest.mark.parametrize(("layers", "k"), [(layers, k) for layers, k, _ in MTP_K])
def test_the_mtp_ks_the_operator_allows_are_exactly_the_ones_vllm_accepts(
    layers: int, k: int, models: dict[str, str], vllm_serve: Verdicts
) -> None:
    argv = next(argv for n, kk, argv in rendered.mtp_k_argvs(models) if (n, kk) == (layers, k))
    verdict = vllm_serve[argv]
    if vllm_accepts_k("mtp", k, layers):
        assert verdict["stage"] is None, verdict
        assert verdict["speculative"]["num_speculative_tokens"] == k
    else:
        assert verdict["stage"] == "speculative"
        assert verdict["message"] == f"num_speculative_tokens:{k} must be divisible by n_predict={layers}"


def test_mtp_on_a_target_without_mtp_layers_is_refused_by_vllm(models: dict[str, str], vllm_serve: Verdicts) -> None:
    """Why admission requires spec.drafters[].mtpLayers: the operator cannot read the checkpoint."""
    argv = rendered.with_speculative(rendered.base_case(models), method="mtp", num_speculative_tokens=1)
    verdict = vllm_serve[argv]
    assert (verdict["stage"], verdict["message"]) == ("speculative", "Unsupported speculative method: 'mtp'")


def test_suffix_needs_arctic_inference_so_rocm_pools_fall_back(models: dict[str, str], vllm_serve: Verdicts) -> None:
    """decisions.drafter never renders suffix on ROCm; vLLM says why."""
    assert "arctic" in UNSUPPORTED_ON_ROCM["suffix"]
    verdict = vllm_serve[rendered.base_case(models, "suffix")]
    assert verdict["stage"] == "speculative"
    assert verdict["message"].startswith("Arctic Inference is required for suffix decoding")


@pytest.mark.parametrize("extra", rendered.ATTENTION_CONFIG_BACKEND_SPELLINGS, ids=" ".join)
def test_attention_config_backend_in_extra_args_is_refused_by_vllm_and_by_admission(
    extra: list[str], models: dict[str, str], vllm_serve: Verdicts
) -> None:
    verdict = vllm_serve[[*rendered.base_case(models), *extra]]
    assert verdict["stage"] is not None
    if verdict["stage"] == "engine":
        assert verdict["message"] == "attention_backend and attention_config.backend are mutually exclusive"
    with pytest.raises(ValueError, match="may not set --attention-config as a whole nor its backend key"):
        Runtime.model_validate({"extraArgs": extra})


@pytest.mark.parametrize("extra", rendered.ATTENTION_CONFIG_OTHER_KEYS, ids=" ".join)
def test_other_attention_config_keys_are_admitted_and_vllm_starts(
    extra: list[str], models: dict[str, str], vllm_serve: Verdicts
) -> None:
    assert Runtime.model_validate({"extraArgs": extra}).extra_args == extra
    verdict = vllm_serve[[*rendered.base_case(models), *extra]]
    assert verdict["stage"] is None, verdict


def test_every_vllm_option_that_sets_a_rendered_setting_is_refused_in_extra_args(
    vllm_options: list[dict[str, Any]],
) -> None:
    """The class, not the examples: any option string vLLM 0.33's serve parser has for a destination the
    operator owns (or an unambiguous abbreviation of it) is refused; attention_config may not carry backend."""
    option_dests = {entry["option"]: entry["dest"] for entry in vllm_options}
    owned_dests = {option_dests[flag] for flag in OWNED_VLLM_FLAGS if flag in option_dests}
    assert {"speculative_config", "attention_backend", "port", "tensor_parallel_size"} <= owned_dests
    for option, dest in option_dests.items():
        if dest in owned_dests:
            assert refused_flag_reached(option) is not None, option
            abbreviations = [option[:cut] for cut in range(3, len(option)) if option.startswith("--")]
            for prefix in abbreviations:
                if [o for o in option_dests if o.startswith(prefix)] == [option]:  # argparse would expand it
                    assert refused_flag_reached(prefix) is not None, prefix
        elif dest == "attention_config":
            assert owned_config_key_reached(f"{option}.backend=X") is not None, option
            assert owned_config_key_reached(option) is not None, option
        else:
            assert refused_flag_reached(option) is None or option == "--config", (option, dest)


def test_every_option_that_sizes_an_engines_gpus_or_nodes_is_refused_in_extra_args_and_nothing_else(
    vllm_options: list[dict[str, Any]],
) -> None:
    """Each flag the API refuses for sizing GPUs or nodes is one vLLM 0.33's serve parser has (a rename upstream is
    noticed here), every option string of the same destinations is refused too, and no other option is, in any
    abbreviation argparse would expand. A `--no-` negation only sets the default: it passes."""
    option_dests = {entry["option"]: entry["dest"] for entry in vllm_options}
    assert set(GPU_SIZING_VLLM_FLAGS) <= option_dests.keys(), set(GPU_SIZING_VLLM_FLAGS) - option_dests.keys()
    sizing_dests = {option_dests[flag] for flag in GPU_SIZING_VLLM_FLAGS}
    assert {"pipeline_parallel_size", "data_parallel_size", "nnodes", "device_ids"} <= sizing_dests
    for option, dest in option_dests.items():
        sizing = dest in sizing_dests and not option.startswith("--no-")
        assert (gpu_sizing_flag_reached(option) is not None) == sizing, (option, dest)
        for cut in range(3, len(option)) if option.startswith("--") else ():
            prefix = option[:cut]
            if [o for o in option_dests if o.startswith(prefix)] == [option]:  # argparse would expand it
                assert (gpu_sizing_flag_reached(prefix) is not None) == sizing, (prefix, dest)


def proposer_verdicts(models: dict[str, str], vllm_proposers: Verdicts) -> dict[str, dict[str, Any]]:
    found = {}
    for argv in rendered.proposer_argvs(models):
        speculative = json.loads(argv[argv.index("--speculative-config") + 1])
        found[f"{speculative['method']}/k{speculative['num_speculative_tokens']}"] = vllm_proposers[argv]
    return found


# What each admitted method's drafter does when started on CPU by the runner vLLM picks on ROCm (V2: the
# images ship Triton). Starting the n-gram speculators needs Triton itself, which this machine lacks.
PROPOSERS_ON_CPU = {
    "ngram/k2": ("proposer", "ngram_gpu speculative decoding requires Triton."),
    "ngram_gpu/k2": ("proposer", "ngram_gpu speculative decoding requires Triton."),
    "draft_model/k2": "StandaloneARSpeculator",
    "eagle/k2": "EagleSpeculator",
    "eagle3/k2": "EagleSpeculator",
    "dflash/k2": "DFlashSpeculator",
    "dspark/k2": "DSparkSpeculator",
    "mtp/k2": "MultiModuleMTPSpeculator",
    "custom_class/k2": "ContractProposer",
    "suffix/k2": ("speculative", "Arctic Inference is required for suffix decoding. "
                  "Install via `pip install arctic-inference==0.1.1`."),
}


@pytest.mark.parametrize("key", sorted(PROPOSERS_ON_CPU))
def test_each_methods_proposer_starts_as_vllm_builds_it(
    key: str, models: dict[str, str], vllm_proposers: Verdicts
) -> None:
    verdict = proposer_verdicts(models, vllm_proposers)[key]
    expected = PROPOSERS_ON_CPU[key]
    if isinstance(expected, str):
        assert verdict["stage"] is None, verdict
        assert verdict["proposer"] == expected
    else:
        assert (verdict["stage"], verdict["message"]) == expected


@pytest.mark.parametrize("k", [1, 2])
def test_extract_hidden_states_which_admission_refuses_cannot_serve(
    k: int, models: dict[str, str], vllm_proposers: Verdicts
) -> None:
    assert "extract_hidden_states" in REFUSED_METHODS
    verdict = proposer_verdicts(models, vllm_proposers)[f"extract_hidden_states/k{k}"]
    assert verdict["stage"] == "proposer"
    assert verdict["message"] == (
        "extract_hidden_states requires num_speculative_tokens to be 1" if k != 1 else
        "eagle_aux_hidden_state_layer_ids must be set in the draft model config for extract_hidden_states method"
    )


BACKEND_CLASSES = {
    "ROCM_AITER_FA": "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend",
    "TRITON_ATTN": "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend",
    "ROCM_AITER_MLA": "vllm.v1.attention.backends.mla.rocm_aiter_mla.AiterMLABackend",
    "TRITON_MLA": "vllm.v1.attention.backends.mla.triton_mla.TritonMLABackend",
}


@pytest.mark.parametrize("gfx", rendered.GFX_TARGETS)
def test_rocm_platform_takes_the_attention_backend_rendered_for_each_gfx_target(
    gfx: str, vllm_attention: dict[str, list[dict[str, Any]]]
) -> None:
    answers = {answer["id"]: answer for answer in vllm_attention[gfx]}
    for answer in answers.values():
        assert answer["gcn_arch"].startswith(gfx)
    for head in ("head64", "head128"):
        assert answers[head].get("backend_class") == BACKEND_CLASSES[attention_backend(gfx)], answers[head]


def test_rocm_platform_takes_the_backends_rendered_when_the_spec_turns_aiter_off(
    vllm_attention: dict[str, list[dict[str, Any]]]
) -> None:
    answers = {answer["id"]: answer for answer in vllm_attention[AITER_OFF]}
    for head in ("head64", "head128"):
        assert answers[head].get("backend_class") == BACKEND_CLASSES["TRITON_ATTN"], answers[head]
    assert answers["mla"].get("backend_class") == BACKEND_CLASSES["TRITON_MLA"], answers["mla"]


@pytest.mark.parametrize("gfx", rendered.GFX_TARGETS)
def test_rocm_platform_takes_the_mla_backend_rendered_for_each_gfx_target(
    gfx: str, vllm_attention: dict[str, list[dict[str, Any]]]
) -> None:
    answers = {answer["id"]: answer for answer in vllm_attention[gfx]}
    assert answers["mla"].get("backend_class") == BACKEND_CLASSES[mla_attention_backend(gfx)], answers["mla"]
    # Why MLA layers need their own backend: the global one is refused for them on every target.
    assert answers["mla-global"].get("error") == "ValueError", answers["mla-global"]
    assert "MLA not supported" in answers["mla-global"]["message"]
    # ...and why the global backend stays: the MLA one is refused for standard layers (a drafter's).
    standard = answers["standard-on-mla-backend"]
    assert standard.get("error") == "ValueError", standard
    assert "non-MLA not supported" in standard["message"]
    # Left to itself (no AITER installed here, as on any image without it) vLLM picks TRITON_MLA everywhere;
    # with AITER MLA enabled on gfx942/gfx950 it puts ROCM_AITER_MLA first (rocm.py _get_backend_priorities).
    assert answers["mla-auto"].get("backend_class") == BACKEND_CLASSES["TRITON_MLA"], answers["mla-auto"]
