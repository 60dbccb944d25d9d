"""How a mix of requests shows in per-position acceptance rates, and what the same requests give at another K.

vLLM's per-position counters are means over drafts, and a request drafts once per engine step. A request that
accepts little takes more steps per token, so it holds more of the drafts, and how many more depends on K: at a
higher K the well-accepted requests finish in fewer steps and their share of the drafts falls. The same requests
therefore show lower rates at a higher K and a mean accepted length that is not the chain of the rates read at
another K (Simpson's paradox): half code at 0.9 and half chat at 0.35, read at K 5, put E(1) 6% low.

The mix is the simplest one that gives the rates read at one K, each request accepting every draft token with
its own probability a (its draft rates are a, a^2, ...). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# (per-token acceptance, share of the drafts at the K the rates were read at) per kind of request.
Mix = tuple[tuple[float, float], ...]

# The positions read to fit a mix: three rates determine two kinds of request (and fewer positions, less).
FITTED_POSITIONS = 3


def acceptance_mix(rates: Sequence[float]) -> Mix:
    """(acceptance, share of drafts) of the simplest mix of requests that gives per-position rates read at one K,
    so that rates[i] is the drafts' mean of a^(i+1). From three rates, two kinds of request (the two-node Gauss
    quadrature whose moments they are); from two, or where three fit no such mix, two kinds equally common at
    the mean plus and minus the spread; one kind where the rates show no spread between requests (acceptance
    that falls with depth within every request looks like that, and rightly gets no correction)."""
    # A draft accepted at a position was accepted at every one before: rates that rise are noise, not a mix.
    rates = [rate for index, rate in enumerate(rates) if all(rate <= earlier for earlier in rates[:index])]
    if not rates:
        return ()
    mean = rates[0]
    spread = rates[1] - mean * mean if len(rates) >= 2 else 0.0
    if mean <= 0 or spread <= 1e-9:
        return ((mean, 1.0),)
    if len(rates) >= 3:
        second, third = rates[1], rates[2]
        # The nodes are the roots of x^2 + slope x + offset, orthogonal to 1 and x under the rates.
        offset = (mean * third - second * second) / spread
        slope = (mean * second - third) / spread
        discriminant = slope * slope - 4 * offset
        if discriminant > 0:
            low = (-slope - math.sqrt(discriminant)) / 2
            high = (-slope + math.sqrt(discriminant)) / 2
            if 0.0 <= low < high <= 1.0:
                share_high = (mean - low) / (high - low)
                return ((low, 1.0 - share_high), (high, share_high))
    deviation = math.sqrt(spread)
    return ((max(mean - deviation, 0.0), 0.5), (min(mean + deviation, 1.0), 0.5))


def geometric_length(acceptance: float, k: int) -> float:
    """Tokens one draft step yields at K for a request accepting each draft token with this probability."""
    return 1.0 + sum(acceptance ** (i + 1) for i in range(k))


def draft_shares_at(mix: Mix, read_at: int, k: int) -> list[float]:
    """Each kind's share of the drafts at K, from its share at `read_at`: a request drafts once per step, and
    takes 1 / its accepted length steps per token."""
    weights = [share * geometric_length(a, read_at) / geometric_length(a, k) for a, share in mix]
    total = sum(weights)
    return [weight / total for weight in weights] if total > 0 else [share for _, share in mix]


def rates_at(mix: Mix, read_at: int, k: int, positions: int) -> list[float]:
    """The per-position rates the same requests show at K (the first `positions`)."""
    shares = draft_shares_at(mix, read_at, k)
    return [sum(share * a ** (position + 1) for share, (a, _) in zip(shares, mix, strict=True))
            for position in range(positions)]


def length_factor(mix: Mix, read_at: int, k: int) -> float:
    """E(K) of the same requests over the chain of the rates read at `read_at` carried to K: what a mean accepted
    length built from another K's rates must be multiplied by. Above 1 for K below `read_at`, below 1 above it,
    1 for one kind of request."""
    if len(mix) < 2:
        return 1.0
    read = draft_shares_at(mix, read_at, read_at)
    chained = sum(share * geometric_length(a, k) for share, (a, _) in zip(read, mix, strict=True))
    at_k = draft_shares_at(mix, read_at, k)
    true = sum(share * geometric_length(a, k) for share, (a, _) in zip(at_k, mix, strict=True))
    return true / chained if chained > 0 else 1.0
