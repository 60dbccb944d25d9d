"""Which proposal lengths K a pool may run: the spec's bounds, narrowed to what vLLM 0.33 starts its drafter with.

The tuner ranks, explores and snaps only within `legal_ks`, so it never proposes a K that vLLM would refuse
(an mtp K above the checkpoint's MTP layer count that is not a multiple of it). Pure: no I/O, no client.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec_operator.api.vocabulary import vllm_accepts_k


def legal_ks(method: str, mtp_layers: int | None, min_k: int, max_k: int) -> tuple[int, ...]:
    """Every K in [min_k, max_k] vLLM starts `method` with, ascending."""
    return tuple(k for k in range(min_k, max_k + 1) if vllm_accepts_k(method, k, mtp_layers))


def nearest_legal_k(k: int, legal: Sequence[int]) -> int | None:
    """The legal K closest to `k` (the smaller on a tie: fewer wasted draft tokens); None if there is none."""
    return min(legal, key=lambda candidate: (abs(candidate - k), candidate), default=None)


def next_legal_k(k: int, legal: Sequence[int], upwards: bool) -> int | None:
    """The first legal K beyond `k` in the given direction, or None."""
    beyond = [candidate for candidate in legal if (candidate > k if upwards else candidate < k)]
    if not beyond:
        return None
    return min(beyond) if upwards else max(beyond)
