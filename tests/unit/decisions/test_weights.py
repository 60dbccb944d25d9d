"""Weights estimates: the spec's figure first, else the parameter count in the name, and always say which."""

from __future__ import annotations

import pytest

from specdec_operator.decisions.weights import GIB, WeightsEstimate, drafter_weights, params_from_name, target_weights


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", 70e9),
        ("meta-llama/Llama-3.3-70B-Instruct", 70e9),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 56e9),  # every expert is resident
        ("mistralai/Mixtral-8x22B-v0.1", 176e9),
        ("HuggingFaceTB/SmolLM-360M", 360e6),
        ("Qwen/Qwen3-0.6B", 0.6e9),
        ("Qwen/Qwen2.5-1.5B", 1.5e9),
        ("facebook/opt-125m", 125e6),
        ("meta-llama/Llama-2-7b-chat-hf", 7e9),
        ("Qwen/Qwen3-30B-A3B", 30e9),  # total, not active, parameters
        ("Qwen/Qwen2.5-7B-Instruct-1M", 7e9),  # 1M is the context length
        ("amd/Llama-3.1-70B-Instruct-FP8-KV", 70e9),
        ("/models/llama-70b", 70e9),
        ("llama_3_8b", 8e9),
        ("gpt2", None),
        ("deepseek-ai/DeepSeek-V3", None),
        ("microsoft/Phi-3-mini-4k-instruct", None),
        ("", None),
    ],
)
def test_params_from_name(name: str, params: float | None) -> None:
    assert params_from_name(name) == params


@pytest.mark.parametrize(
    ("name", "declared", "gib", "source_fragment"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", None, 70e9 * 2 / GIB, "70B params in name x 2 bytes"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", None, 56e9 * 2 / GIB, "56B params"),
        ("HuggingFaceTB/SmolLM-360M", None, 360e6 * 2 / GIB, "0.36B params"),
        ("my-org/house-model", 42.0, 42.0, "spec.model.weightsGib"),
        ("meta-llama/Llama-3.1-70B-Instruct", 40.0, 40.0, "spec.model.weightsGib"),  # the spec wins
    ],
)
def test_target_weights(name: str, declared: float | None, gib: float, source_fragment: str) -> None:
    estimate = target_weights(name, declared)
    assert estimate is not None
    assert estimate.gib == pytest.approx(gib)
    assert source_fragment in estimate.source


def test_target_without_a_size_in_its_name_is_unknown() -> None:
    assert target_weights("my-org/house-model", None) is None


def test_estimate_prints_its_figure_and_source() -> None:
    assert str(WeightsEstimate(130.385, "70B params in name x 2 bytes")) == "130.4 GiB (70B params in name x 2 bytes)"


TARGET_8B = WeightsEstimate(8e9 * 2 / GIB, "8B params in name x 2 bytes")


@pytest.mark.parametrize(
    ("method", "model", "declared", "gib", "source_fragment"),
    [
        ("ngram", None, None, 0.0, "no weights"),
        ("ngram_gpu", None, None, 0.0, "no weights"),
        ("suffix", None, None, 0.0, "no weights"),
        ("mtp", None, None, 0.0, "inside the target checkpoint"),
        ("eagle", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", None, TARGET_8B.gib * 0.05, "eagle head ~5%"),
        ("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", None, TARGET_8B.gib * 0.05, "eagle3 head ~5%"),
        ("dflash", "z-lab/Qwen3-8B-DFlash", None, TARGET_8B.gib * 0.08, "dflash head ~8%"),
        ("draft_model", "meta-llama/Llama-3.2-1B-Instruct", None, 1e9 * 2 / GIB, "1B params"),
        ("draft_model", "HuggingFaceTB/SmolLM-360M", None, 360e6 * 2 / GIB, "0.36B params"),
        ("draft_model", "Qwen/Qwen3-0.6B", None, 0.6e9 * 2 / GIB, "0.6B params"),
        ("draft_model", "org/tiny-drafter", 0.5, 0.5, "spec.drafters[].weightsGib"),
        ("eagle3", "org/eagle3-head", 2.0, 2.0, "spec.drafters[].weightsGib"),
    ],
)
def test_drafter_weights(
    method: str, model: str | None, declared: float | None, gib: float, source_fragment: str
) -> None:
    estimate = drafter_weights(method, model, declared, TARGET_8B)
    assert estimate is not None
    assert estimate.gib == pytest.approx(gib)
    assert source_fragment in estimate.source


@pytest.mark.parametrize(("method", "model"), [("draft_model", "org/tiny-drafter"), ("custom_class", "org/proposer")])
def test_drafter_of_unknown_size_is_never_guessed(method: str, model: str) -> None:
    assert drafter_weights(method, model, None, TARGET_8B) is None


@pytest.mark.parametrize(("name", "gib"), [
    ("meta-llama/Llama-3.1-70B-Instruct", 130.4),
    ("RedHatAI/Llama-3.1-70B-Instruct-FP8", 65.2),
    ("neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8", 65.2),
    ("Qwen/Qwen2.5-72B-Instruct-AWQ", 33.5),
    ("hugging-quants/Meta-Llama-3.1-70B-Instruct-GPTQ-INT4", 32.6),
])
def test_a_name_that_states_its_precision_is_sized_at_it_and_every_guess_says_so(name: str, gib: float) -> None:
    """An FP8 checkpoint is not reserved twice its memory; a name without a marker stays 16-bit (the safe side)."""
    estimate = target_weights(name, None)
    assert estimate is not None and round(estimate.gib, 1) == gib and estimate.guessed
    declared = target_weights(name, 70.0)
    assert declared is not None and not declared.guessed and declared.gib == 70.0
