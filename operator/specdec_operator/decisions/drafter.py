"""Which drafter a pool runs: the first preference that is supported on its gfx target and fits in memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec_operator.api.spec import Drafter
from specdec_operator.decisions.weights import WeightsEstimate, drafter_weights

# Method/gfx pairs known not to work in vLLM 0.33 on ROCm, with the reason users will see.
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("eagle3", "gfx950"): "EAGLE-3 fails to start on MI350-class GPUs in vLLM 0.33 (vllm#45538)",
}
UNSUPPORTED_ON_ROCM: dict[str, str] = {
    "suffix": "suffix decoding needs arctic-inference, which ROCm images do not ship",
}
FALLBACK = Drafter(method="ngram")


@dataclass(frozen=True)
class MemoryBudget:
    tensor_parallel_size: int
    vram_gib_per_gpu: float
    kv_headroom_fraction: float

    @property
    def weights_limit_gib(self) -> float:
        """Memory weights may take; the rest stays for the KV cache and activations."""
        return self.tensor_parallel_size * self.vram_gib_per_gpu * (1.0 - self.kv_headroom_fraction)


@dataclass(frozen=True)
class DrafterDecision:
    drafter: Drafter | None  # None: not even the target fits, so no pool
    fallback: bool
    reason: str


def unsupported_reason(method: str, gfx: str) -> str | None:
    return UNSUPPORTED_ON_ROCM.get(method) or UNSUPPORTED.get((method, gfx))


def choose_drafter(
    preferences: Sequence[Drafter], gfx: str, target: WeightsEstimate, budget: MemoryBudget
) -> DrafterDecision:
    limit = budget.weights_limit_gib
    memory = (
        f"{budget.tensor_parallel_size} x {budget.vram_gib_per_gpu:.0f} GiB with "
        f"{budget.kv_headroom_fraction:.0%} KV headroom = {limit:.1f} GiB for weights"
    )
    if target.gib > limit:
        return DrafterDecision(None, False, f"target {target} does not fit on {gfx}: {memory}")
    skipped: list[str] = []
    for index, drafter in enumerate(preferences):
        label = f"drafters[{index}] {drafter.method}{f' {drafter.model}' if drafter.model else ''}"
        blocked = unsupported_reason(drafter.method, gfx)
        if blocked:
            skipped.append(f"{label}: {blocked}")
            continue
        weights = drafter_weights(drafter.method, drafter.model, drafter.weights_gib, target)
        if weights is None:
            skipped.append(f"{label}: size unknown (set weightsGib)")
            continue
        total = target.gib + weights.gib
        if total > limit:
            skipped.append(f"{label}: target {target.gib:.1f} + drafter {weights} = {total:.1f} GiB > {limit:.1f} GiB")
            continue
        reason = f"{label} fits: target {target.gib:.1f} + drafter {weights} <= {memory}"
        if skipped:
            reason += "; skipped " + "; ".join(skipped)
        return DrafterDecision(drafter, False, reason)
    return DrafterDecision(
        FALLBACK, True, "no preferred drafter fits, falling back to ngram (no weights): " + "; ".join(skipped)
    )
