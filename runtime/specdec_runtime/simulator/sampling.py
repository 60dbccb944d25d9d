"""Exact binomial sampling without numpy, so the engine can draw the outcome of many drafts at once.

The per-position accepted counts of M drafts form a chain: A_0 ~ Bin(M, a_0), A_i ~ Bin(A_{i-1}, a_i).
That is distributed exactly as stepping M drafts one by one, at the cost of K binomial draws.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

# Below this mean the waiting-time method is cheap (expected n*p iterations); above it BTRS's rejection
# sampler, whose acceptance region is only valid for n*p >= 10, takes over.
_INVERSION_MAX_MEAN = 10.0


def binomial(rng: random.Random, n: int, p: float) -> int:
    """One draw from Binomial(n, p)."""
    if n <= 0 or p <= 0.0:
        return 0
    if p >= 1.0:
        return n
    if p > 0.5:
        return n - binomial(rng, n, 1.0 - p)
    if n * p < _INVERSION_MAX_MEAN:
        return _binomial_waiting_time(rng, n, p)
    return _binomial_btrs(rng, n, p)


def _binomial_waiting_time(rng: random.Random, n: int, p: float) -> int:
    """Devroye's second waiting-time method: count geometric gaps between successes until past n."""
    log_q = math.log1p(-p)
    successes = 0
    position = 0
    while True:
        # 1 - random() lies in (0, 1], so the log is finite.
        position += int(math.log(1.0 - rng.random()) / log_q) + 1
        if position > n:
            return successes
        successes += 1


def _binomial_btrs(rng: random.Random, n: int, p: float) -> int:
    """Hörmann's BTRS transformed rejection sampler (1993), exact for n*p >= 10 and p <= 0.5."""
    q = 1.0 - p
    spq = math.sqrt(n * p * q)
    b = 1.15 + 2.53 * spq
    a = -0.0873 + 0.0248 * b + 0.01 * p
    c = n * p + 0.5
    v_r = 0.92 - 4.2 / b
    alpha = (2.83 + 5.1 / b) * spq
    log_odds = math.log(p / q)
    mode = math.floor((n + 1) * p)
    h = math.lgamma(mode + 1) + math.lgamma(n - mode + 1)
    while True:
        u = rng.random() - 0.5
        v = rng.random()
        us = 0.5 - abs(u)
        if us <= 0.0:
            continue
        k = math.floor((2 * a / us + b) * u + c)
        if k < 0 or k > n:
            continue
        if us >= 0.07 and v <= v_r:
            return k
        if v <= 0.0:
            continue
        log_v = math.log(v * alpha / (a / (us * us) + b))
        if log_v <= h - math.lgamma(k + 1) - math.lgamma(n - k + 1) + (k - mode) * log_odds:
            return k


def rate_at(acceptance: Sequence[float], position: int) -> float:
    """Conditional acceptance at a draft position; positions past the list reuse the last value."""
    return acceptance[min(position, len(acceptance) - 1)]


def accepted_per_position(rng: random.Random, drafts: int, acceptance: Sequence[float], k: int) -> list[int]:
    """How many of `drafts` drafts of length k accepted at least i+1 tokens, for i in 0..k-1.

    `acceptance[i]` is the conditional acceptance at position i; positions past the list reuse the last.
    """
    counts: list[int] = []
    surviving = drafts
    for position in range(k):
        surviving = binomial(rng, surviving, rate_at(acceptance, position))
        counts.append(surviving)
    return counts
