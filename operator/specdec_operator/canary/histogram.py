"""Cumulative histograms as vLLM exposes them (Prometheus `le` buckets): counts and quantiles between bounds.

vLLM's TPOT buckets are coarse (10, 25, 50, 75, 100 ms ...): a bucket can be 2.5x wide, and a canary's gates
compare quantiles and shares that fall inside one. Linear interpolation (PromQL's `histogram_quantile`)
spreads a bucket's requests evenly, while latencies crowd at a bucket's lower end above the mode and thin
out towards its upper end. Linear interpolation therefore reads a tail that crosses a bound too long (a pod
5% slower read as a p90 1.2-1.4x longer) and a tail that stretches over several buckets too short (a p99
three times longer read as 2x). Between bounds this module follows a monotone cubic (PCHIP, Fritsch and
Carlson) through the cumulative counts over log(bound): the density inside a bucket follows its neighbours',
the counts at the bounds are kept exactly, and the curve never decreases. Below the first bound, where log
has no lower end, it stays linear. docs/canary.md shows what each reads on vLLM's buckets.

A second reading, `POWER_LAW`, lets the share of requests above a value fall as a power of the value between
two bounds (straight in log-log) in the tail: buckets above the median. A steep tail, crowded at a bucket's
low end, is read there; the cubic cannot crowd it (monotonicity caps its slope at three times the bucket's
average). Where nothing lies above a bucket, its upper bound counts half a request above it. The canary's p99
must be within its limit under both readings before it passes: nothing between two bounds is known, and a
tail is not given the benefit of that doubt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

# (upper bound, cumulative count), as in Prometheus `le` buckets; the last bound is +Inf.
Buckets = tuple[tuple[float, float], ...]
# How counts are read between bounds (module docstring).
Reading = Literal["cubic", "power-law"]
CUBIC: Reading = "cubic"
POWER_LAW: Reading = "power-law"
# Requests counted above a bound that has none above it, for the power-law reading: its log has no zero.
_EMPTY_SURVIVAL = 0.5
# The power law reads the tail only: buckets with at most this share of the requests above their lower bound
# (above the median, where latencies crowd at a bucket's low end). A bucket holding the body of a distribution
# (all of a narrow one, say) is no tail: read as a power law, a uniform spread over 17-25 ms put its p99 at 16 ms.
TAIL_SHARE = 0.5

_BISECTIONS = 60  # halvings of a bucket's log-width: far below any bound's precision


def monotone_points(buckets: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted (bound, cumulative) made monotone: deltas of two scrapes taken while requests finish can dip by
    a count between buckets; a running maximum restores the order every interpolation relies on."""
    ordered = buckets if all(buckets[i][0] < buckets[i + 1][0] for i in range(len(buckets) - 1)) \
        else sorted(buckets)
    monotone: list[tuple[float, float]] = []
    highest = 0.0
    for bound, count in ordered:
        if count > highest:
            highest = count
        monotone.append((bound, highest))
    return monotone


def histogram_total(buckets: Buckets) -> float:
    return max((count for _, count in buckets), default=0.0)


class _Curve:
    """The cumulative count as a function of the value: linear from (0, 0) to the first positive bound, then
    a monotone cubic in log(value) through every finite bound; flat above the last finite bound (what lies
    in the +Inf bucket is above any finite value)."""

    def __init__(self, points: list[tuple[float, float]]) -> None:
        finite = [(bound, count) for bound, count in points if math.isfinite(bound)]
        # Bounds at or below 0 (none in vLLM's layouts) fold into the linear first piece.
        self.floor = max((count for bound, count in finite if bound <= 0), default=0.0)
        self.nodes = [(bound, count) for bound, count in finite if bound > 0]
        self.xs = [math.log(bound) for bound, _ in self.nodes]
        self.ys = [count for _, count in self.nodes]
        self.slopes = _pchip_slopes(self.xs, self.ys)

    def count_at_or_below(self, value: float) -> float:
        if not self.nodes:
            return self.floor
        first_bound, first_count = self.nodes[0]
        if value <= 0:
            return self.floor
        if value <= first_bound:
            return self.floor + (first_count - self.floor) * value / first_bound
        if value >= self.nodes[-1][0]:
            return self.ys[-1]
        x = math.log(value)
        index = _segment(self.xs, x)
        return self._hermite(index, x)

    def _hermite(self, index: int, x: float) -> float:
        x0, x1 = self.xs[index], self.xs[index + 1]
        y0, y1 = self.ys[index], self.ys[index + 1]
        if y1 <= y0:
            return y0
        width = x1 - x0
        t = (x - x0) / width
        h00, h10 = 2 * t ** 3 - 3 * t ** 2 + 1, t ** 3 - 2 * t ** 2 + t
        h01, h11 = -2 * t ** 3 + 3 * t ** 2, t ** 3 - t ** 2
        value = h00 * y0 + h10 * width * self.slopes[index] + h01 * y1 + h11 * width * self.slopes[index + 1]
        return min(y1, max(y0, value))  # rounding only: the slopes keep the cubic inside [y0, y1]

    def value_at_count(self, rank: float) -> float:
        """The smallest value whose count reaches `rank` (0 < rank <= the last finite count)."""
        first_bound, first_count = self.nodes[0]
        if rank <= first_count:
            span = first_count - self.floor
            return first_bound if span <= 0 else first_bound * max(0.0, rank - self.floor) / span
        index = next(i for i in range(len(self.ys) - 1) if self.ys[i + 1] >= rank)
        low, high = self.xs[index], self.xs[index + 1]
        for _ in range(_BISECTIONS):  # the cubic is monotone on the segment: bisection finds the one crossing
            middle = 0.5 * (low + high)
            if self._hermite(index, middle) >= rank:
                high = middle
            else:
                low = middle
        return math.exp(high)


class _PowerLawCurve:
    """The cumulative count with the share above a value falling as a power of the value between two positive
    bounds, in the tail: a bucket with at most TAIL_SHARE of the requests above its lower bound. Elsewhere (the
    body, below the first bound, above the last finite one) it reads as the cubic does."""

    def __init__(self, points: list[tuple[float, float]]) -> None:
        self.cubic = _Curve(points)
        self.total = points[-1][1] if points else 0.0
        self.nodes, self.xs, self.ys = self.cubic.nodes, self.cubic.xs, self.cubic.ys

    def _in_tail(self, index: int) -> bool:
        return self.total - self.ys[index] <= TAIL_SHARE * self.total

    def _survivals(self, index: int) -> tuple[float, float]:
        """Requests above the segment's lower and upper bound; an empty upper one counts as part of a request."""
        above_low = self.total - self.ys[index]
        above_high = self.total - self.ys[index + 1]
        return above_low, above_high if above_high > 0 else min(_EMPTY_SURVIVAL, above_low / 2)

    def count_at_or_below(self, value: float) -> float:
        if not self.nodes or value <= self.nodes[0][0] or value >= self.nodes[-1][0]:
            return self.cubic.count_at_or_below(value)
        x = math.log(value)
        index = _segment(self.xs, x)
        if not self._in_tail(index):
            return self.cubic.count_at_or_below(value)
        if self.ys[index + 1] <= self.ys[index]:
            return self.ys[index]
        t = (x - self.xs[index]) / (self.xs[index + 1] - self.xs[index])
        if t >= 1:
            return self.ys[index + 1]  # exact at a bound, whatever counts as above an empty one
        above_low, above_high = self._survivals(index)
        above = above_low * math.exp(t * math.log(above_high / above_low))
        return min(self.ys[index + 1], self.total - above)

    def value_at_count(self, rank: float) -> float:
        if rank <= self.nodes[0][1]:
            return self.cubic.value_at_count(rank)
        index = next(i for i in range(len(self.ys) - 1) if self.ys[i + 1] >= rank)
        if not self._in_tail(index):
            return self.cubic.value_at_count(rank)
        above_low, above_high = self._survivals(index)
        above = max(self.total - rank, above_high)
        t = math.log(above / above_low) / math.log(above_high / above_low)
        return math.exp(self.xs[index] + min(1.0, max(0.0, t)) * (self.xs[index + 1] - self.xs[index]))


def _curve(points: list[tuple[float, float]], reading: Reading) -> _Curve | _PowerLawCurve:
    return _PowerLawCurve(points) if reading == POWER_LAW else _Curve(points)


def _segment(xs: list[float], x: float) -> int:
    """The index i with xs[i] < x <= xs[i + 1] (x strictly inside the nodes' range)."""
    low, high = 0, len(xs) - 1
    while high - low > 1:
        middle = (low + high) // 2
        if xs[middle] < x:
            low = middle
        else:
            high = middle
    return low


def _pchip_slopes(xs: list[float], ys: list[float]) -> list[float]:
    """Fritsch-Carlson derivatives at the nodes: a weighted harmonic mean of the neighbouring secants inside,
    a shape-preserving three-point estimate at the ends, zero where a secant is flat (an empty bucket stays
    empty between its bounds)."""
    n = len(xs)
    if n < 2:
        return [0.0] * n
    widths = [xs[i + 1] - xs[i] for i in range(n - 1)]
    secants = [(ys[i + 1] - ys[i]) / widths[i] for i in range(n - 1)]
    if n == 2:
        return [secants[0], secants[0]]
    slopes = [0.0] * n
    for i in range(1, n - 1):
        before, after = secants[i - 1], secants[i]
        if before <= 0 or after <= 0:
            continue
        w1, w2 = 2 * widths[i] + widths[i - 1], widths[i] + 2 * widths[i - 1]
        slopes[i] = (w1 + w2) / (w1 / before + w2 / after)
    slopes[0] = _end_slope(widths[0], widths[1], secants[0], secants[1])
    slopes[-1] = _end_slope(widths[-1], widths[-2], secants[-1], secants[-2])
    return slopes


def _end_slope(width: float, next_width: float, secant: float, next_secant: float) -> float:
    slope = ((2 * width + next_width) * secant - width * next_secant) / (width + next_width)
    if secant <= 0 or slope <= 0:
        return 0.0
    return min(slope, 3 * secant)  # beyond 3x its secant the cubic would overshoot the next count


def count_at_or_below(buckets: Buckets, value: float, reading: Reading = CUBIC) -> float:
    """Observations at or below `value`: exact at a bound, interpolated between bounds (module docstring)."""
    return _curve(monotone_points(buckets), reading).count_at_or_below(value)


def quantile_of(q: float, buckets: Sequence[tuple[float, float]], reading: Reading = CUBIC) -> float | None:
    """The `q` quantile of a cumulative histogram, interpolated as `count_at_or_below` counts.

    None when the histogram is empty, has no +Inf bucket or has fewer than two buckets. A quantile in the
    +Inf bucket reads as the highest finite bound: nothing is known above it.
    """
    if not 0 < q < 1:
        raise ValueError(f"quantile must lie strictly between 0 and 1, got {q}")
    points = monotone_points(buckets)
    if len(points) < 2 or points[-1][0] != math.inf:
        return None
    total = points[-1][1]
    if total <= 0:
        return None
    curve = _curve(points, reading)
    rank = q * total
    if not curve.nodes:
        return None
    if rank > curve.ys[-1]:
        return curve.nodes[-1][0]
    return curve.value_at_count(rank)


def rebin(buckets: Buckets, bounds: Sequence[float]) -> Buckets:
    """The histogram re-expressed on other bucket bounds (ending at +Inf), interpolating between bounds."""
    total = histogram_total(buckets)
    curve = _Curve(monotone_points(buckets))
    return tuple((bound, total if math.isinf(bound) else curve.count_at_or_below(bound)) for bound in bounds)


def merge_histograms(histograms: Sequence[Buckets]) -> Buckets:
    """The sum of cumulative histograms; layouts that differ (vLLM versions, a pod set up otherwise) are
    first rebinned onto the union of their bounds, so no side is judged on a layout artefact."""
    present = [item for item in histograms if item]
    if not present:
        return ()
    layouts = {tuple(bound for bound, _ in sorted(item)) for item in present}
    if len(layouts) == 1:
        bounds = next(iter(layouts))
        sums = [0.0] * len(bounds)
        for item in present:
            for index, (_, count) in enumerate(monotone_points(item)):
                sums[index] += count
        return tuple(zip(bounds, sums, strict=True))
    union = sorted({bound for layout in layouts for bound in layout} | {math.inf})
    sums = [0.0] * len(union)
    for item in present:
        for index, (_, count) in enumerate(rebin(item, union)):
            sums[index] += count
    return tuple(zip(union, sums, strict=True))
