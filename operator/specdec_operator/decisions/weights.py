"""How much GPU memory model weights take, from the spec's estimate or a parameter-count heuristic."""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1024**3
BYTES_PER_PARAM = 2.0  # bf16/fp16 checkpoints, the common case on ROCm
# Quantised checkpoints say so in their names (Llama-3.1-70B-Instruct-FP8, Qwen2.5-72B-Instruct-AWQ): bytes per
# parameter of the weights, checked in this order. A name without a marker is taken as 16-bit, the safe side.
_PRECISION_IN_NAME: tuple[tuple[re.Pattern[str], float, str], ...] = (
    (re.compile(r"(?i)(?<![a-z0-9])(awq|gptq|int4|w4a16|w4a8|4bit|4-bit|nf4|mxfp4)(?![a-z0-9])"), 0.5, "4-bit"),
    (re.compile(r"(?i)(?<![a-z0-9])(fp8|int8|w8a8|w8a16|8bit|8-bit)(?![a-z0-9])"), 1.0, "8-bit"),
)
_PARAMS_IN_NAME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*([bBmM])(?![a-zA-Z])")
# Mixture-of-experts names such as 8x7B hold all experts in memory.
_EXPERTS_IN_NAME = re.compile(r"(\d+)x(\d+(?:\.\d+)?)[bB]")
# Head-only drafters are a few decoder layers on top of the target's embeddings.
HEAD_DRAFTER_FRACTION = {"eagle": 0.05, "eagle3": 0.05, "dflash": 0.08, "dspark": 0.08}


@dataclass(frozen=True)
class WeightsEstimate:
    gib: float
    source: str  # explains the figure, for conditions and events
    guessed: bool = False  # from the model's name, not declared: Ready's message says so

    def __str__(self) -> str:
        return f"{self.gib:.1f} GiB ({self.source})"


def _from_name(params: float, name: str) -> WeightsEstimate:
    """The weights of `params` parameters at the precision the name states (16-bit when it states none)."""
    tail = name.rsplit("/", 1)[-1]
    for pattern, per_param, precision in _PRECISION_IN_NAME:
        if pattern.search(tail):
            return WeightsEstimate(params * per_param / GIB, f"{params / 1e9:g}B params in name x {per_param:g} "
                                   f"bytes, {precision} as its name says", guessed=True)
    return WeightsEstimate(params * BYTES_PER_PARAM / GIB, f"{params / 1e9:g}B params in name x 2 bytes", guessed=True)


def params_from_name(name: str) -> float | None:
    """Parameter count from names like Llama-3.1-70B, Qwen3-0.6B, Mixtral-8x7B or SmolLM-360M."""
    tail = name.rsplit("/", 1)[-1]
    experts = _EXPERTS_IN_NAME.search(tail)
    if experts:
        return int(experts.group(1)) * float(experts.group(2)) * 1e9
    matches = _PARAMS_IN_NAME.findall(tail.replace("_", "-"))
    if not matches:
        return None
    # Names may carry other counts too, such as the 1M-token context of Qwen2.5-7B-Instruct-1M: the
    # largest is the parameter count, and over-estimating memory is the safe side.
    return max(float(number) * (1e9 if unit.lower() == "b" else 1e6) for number, unit in matches)


def target_weights(name: str, declared_gib: float | None) -> WeightsEstimate | None:
    if declared_gib is not None:
        return WeightsEstimate(declared_gib, "spec.model.weightsGib")
    params = params_from_name(name)
    if params is None:
        return None
    return _from_name(params, name)


def drafter_weights(
    method: str, model: str | None, declared_gib: float | None, target: WeightsEstimate
) -> WeightsEstimate | None:
    """None when the size cannot be known; the caller then refuses to guess it fits."""
    if declared_gib is not None:
        return WeightsEstimate(declared_gib, "spec.drafters[].weightsGib")
    if method in ("ngram", "ngram_gpu", "suffix"):
        return WeightsEstimate(0.0, f"{method} drafts from token history and has no weights")
    if method == "mtp":
        return WeightsEstimate(0.0, "MTP heads ship inside the target checkpoint")
    if method in HEAD_DRAFTER_FRACTION:
        fraction = HEAD_DRAFTER_FRACTION[method]
        return WeightsEstimate(target.gib * fraction, f"{method} head ~{fraction:.0%} of the target")
    params = params_from_name(model or "")
    if params is None:
        return None
    return _from_name(params, model or "")
