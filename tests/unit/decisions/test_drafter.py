"""Drafter choice per pool: first supported preference that fits, else ngram; no pool when the target can't fit."""

from __future__ import annotations

import pytest

from specdec_operator.api.spec import Drafter
from specdec_operator.decisions.drafter import MemoryBudget, choose_drafter, unsupported_reason
from specdec_operator.decisions.weights import WeightsEstimate, target_weights

KV_HEADROOM = 0.2
MI300X_TP1 = MemoryBudget(1, 192, KV_HEADROOM)  # 153.6 GiB for weights
W7900_TP1 = MemoryBudget(1, 48, KV_HEADROOM)  # 38.4 GiB for weights
MI250X_TP4 = MemoryBudget(4, 64, KV_HEADROOM)  # 204.8 GiB for weights


def target(name: str) -> WeightsEstimate:
    estimate = target_weights(name, None)
    assert estimate is not None
    return estimate


LLAMA_8B = target("meta-llama/Llama-3.1-8B-Instruct")  # 14.9 GiB
LLAMA_70B = target("meta-llama/Llama-3.3-70B-Instruct")  # 130.4 GiB
DRAFT_14B = Drafter(method="draft_model", model="Qwen/Qwen2.5-14B-Instruct")  # 26.1 GiB
DRAFT_1B = Drafter(method="draft_model", model="meta-llama/Llama-3.2-1B-Instruct")
EAGLE3 = Drafter(method="eagle3", model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
NGRAM = Drafter(method="ngram")


MTP = Drafter(method="mtp", mtp_layers=1)


@pytest.mark.parametrize(
    ("preferences", "gfx", "weights", "budget", "chosen", "fallback"),
    [
        ([DRAFT_14B], "gfx942", LLAMA_8B, MI300X_TP1, DRAFT_14B, False),
        ([DRAFT_14B], "gfx1100", LLAMA_8B, W7900_TP1, NGRAM, True),  # 14.9 + 26.1 > 38.4
        ([DRAFT_14B, EAGLE3], "gfx1100", LLAMA_8B, W7900_TP1, EAGLE3, False),  # second preference fits
        ([EAGLE3, DRAFT_1B], "gfx942", LLAMA_8B, MI300X_TP1, EAGLE3, False),  # order wins, not size
        ([EAGLE3, DRAFT_1B], "gfx950", LLAMA_8B, MI300X_TP1, DRAFT_1B, False),  # eagle3 unsupported on gfx950
        ([Drafter(method="suffix")], "gfx942", LLAMA_8B, MI300X_TP1, NGRAM, True),  # no arctic-inference on ROCm
        ([Drafter(method="draft_model", model="org/tiny")], "gfx942", LLAMA_8B, MI300X_TP1, NGRAM, True),
        ([DRAFT_1B], "gfx90a", LLAMA_70B, MI250X_TP4, DRAFT_1B, False),
        ([MTP], "gfx942", LLAMA_70B, MI300X_TP1, MTP, False),
        ([], "gfx942", LLAMA_8B, MI300X_TP1, NGRAM, True),
    ],
    ids=[
        "draft-fits-mi300x",
        "draft-too-big-w7900-falls-back",
        "second-preference-fits",
        "first-preference-wins",
        "eagle3-unsupported-gfx950",
        "suffix-unsupported-rocm",
        "unknown-draft-size",
        "70b-draft-on-mi250x-tp4",
        "mtp-has-no-extra-weights",
        "no-preferences",
    ],
)
def test_choose_drafter(
    preferences: list[Drafter],
    gfx: str,
    weights: WeightsEstimate,
    budget: MemoryBudget,
    chosen: Drafter,
    fallback: bool,
) -> None:
    decision = choose_drafter(preferences, gfx, weights, budget)
    assert (decision.drafter, decision.fallback) == (chosen, fallback)


def test_fallback_reason_gives_the_numbers() -> None:
    decision = choose_drafter([DRAFT_14B], "gfx1100", LLAMA_8B, W7900_TP1)
    assert decision.reason.startswith("no preferred drafter fits, falling back to ngram")
    assert "drafters[0] draft_model Qwen/Qwen2.5-14B-Instruct" in decision.reason
    assert "target 14.9 + drafter 26.1 GiB (14B params in name x 2 bytes)" in decision.reason
    assert "= 41.0 GiB > 38.4 GiB" in decision.reason


def test_chosen_reason_names_the_skipped_preferences() -> None:
    decision = choose_drafter([EAGLE3, DRAFT_1B], "gfx950", LLAMA_8B, MI300X_TP1)
    assert "drafters[1] draft_model meta-llama/Llama-3.2-1B-Instruct fits" in decision.reason
    assert "skipped drafters[0] eagle3" in decision.reason and "vllm#45538" in decision.reason


@pytest.mark.parametrize(
    ("weights", "budget", "fragments"),
    [
        (LLAMA_70B, W7900_TP1, ["target 130.4 GiB (70B params in name x 2 bytes)", "1 x 48 GiB", "38.4 GiB"]),
        (LLAMA_70B, MemoryBudget(1, 64, KV_HEADROOM), ["1 x 64 GiB", "20% KV headroom", "51.2 GiB for weights"]),
        (WeightsEstimate(160.0, "spec.model.weightsGib"), MI300X_TP1, ["160.0 GiB (spec.model.weightsGib)"]),
    ],
    ids=["70b-on-w7900", "70b-on-one-mi250x-gcd", "declared-160g-on-one-mi300x"],
)
def test_target_that_does_not_fit_gets_no_pool_and_a_reason_with_numbers(
    weights: WeightsEstimate, budget: MemoryBudget, fragments: list[str]
) -> None:
    decision = choose_drafter([NGRAM], "gfx1100", weights, budget)
    assert decision.drafter is None and not decision.fallback
    assert "does not fit on gfx1100" in decision.reason
    for fragment in fragments:
        assert fragment in decision.reason


@pytest.mark.parametrize(
    ("tp", "vram", "headroom", "limit"),
    [(1, 192, 0.2, 153.6), (4, 64, 0.2, 204.8), (8, 192, 0.0, 1536.0), (2, 48, 0.5, 48.0)],
)
def test_weights_limit(tp: int, vram: float, headroom: float, limit: float) -> None:
    assert MemoryBudget(tp, vram, headroom).weights_limit_gib == pytest.approx(limit)


@pytest.mark.parametrize(
    ("method", "gfx", "blocked"),
    [
        ("eagle3", "gfx950", True),
        ("eagle3", "gfx942", False),
        ("eagle", "gfx950", False),
        ("suffix", "gfx942", True),
        ("suffix", "gfx1100", True),
        ("ngram", "gfx90a", False),
        ("draft_model", "gfx1201", False),
    ],
)
def test_unsupported_pairs(method: str, gfx: str, blocked: bool) -> None:
    assert (unsupported_reason(method, gfx) is not None) == blocked
