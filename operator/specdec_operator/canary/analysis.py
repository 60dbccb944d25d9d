"""Canary analysis: one revision's counters against another's over the same window, as a verdict with numbers.

Pure: the scraper turns counter deltas into `WindowStats`, this module only compares them. The method
(docs/canary.md) in short:

- samples are finished requests: no verdict before each side finished `minRequests`;
- every figure that is compared is normalised by per-pod load, so a lightly loaded canary (10% of an
  HTTPRoute's traffic on one pod beside a full stable set) is judged like a loaded one: speed is goodput
  per running sequence (generated tokens per request-second of decoding), not tokens/s per GPU;
- a difference fails a canary only when it is beyond its tolerance AND significant (TPOT: a one-sided
  Mann-Whitney rank test on the request histograms, as Kayenta does; goodput: a z-test whose spread comes
  from the same histogram; acceptance: a two-proportion test per draft position; errors: a binomial test);
  beyond the tolerance but not yet significant is Inconclusive: more requests decide;
- a K change is judged on what K changes: acceptance per draft position on the positions both sides draft
  must hold, and goodput must reach what the tuner predicted (within the tolerance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

from specdec_operator.api.spec import CanaryAnalysis

Outcome = Literal["Pass", "Fail", "Inconclusive"]

# (upper bound in seconds, cumulative count), as in Prometheus `le` buckets; the last bound is +Inf.
Buckets = tuple[tuple[float, float], ...]


def histogram_quantile(quantile: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The `quantile` of a cumulative histogram, interpolated linearly inside a bucket as PromQL's
    histogram_quantile does, so the numbers in a verdict match what a dashboard shows.

    None when the histogram is empty, has no +Inf bucket or has fewer than two buckets.
    """
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must lie strictly between 0 and 1, got {quantile}")
    ordered = sorted(buckets)
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return None
    # Deltas of two scrapes taken while requests finish can dip by a count between buckets; a
    # running maximum restores the monotonicity interpolation relies on.
    monotone: list[tuple[float, float]] = []
    highest = 0.0
    for bound, count in ordered:
        highest = max(highest, count)
        monotone.append((bound, highest))
    total = monotone[-1][1]
    if total <= 0:
        return None
    rank = quantile * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in monotone:
        if count >= rank:
            if bound == math.inf:
                # Nothing is known above the highest finite bound; report that bound.
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return None


@dataclass(frozen=True)
class WindowStats:
    """Increases of one revision's counters over an analysis window; canary and stable share the window.

    TPOT comes from vllm:request_time_per_output_token_seconds, not inter-token latency: under
    speculation one step emits several tokens, so inter-token latency is time per step and would
    flatter or punish a side merely for running a different K.

    `busy_seconds` is request-seconds of decoding (vllm:inter_token_latency_seconds' sum: one step time
    per running request per step; the running-requests gauge times the interval as a fallback). Divided
    by `seconds` (pod-seconds) it is the mean running batch per pod: the per-pod load.
    """

    seconds: float
    gpus: int
    k: int
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    generation_tokens: float = 0.0
    tpot_buckets: Buckets = field(default=())
    requests: float = 0.0
    errors: float = 0.0
    health_failures: int = 0
    restarts: int = 0
    busy_seconds: float = 0.0
    accepted_per_position: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        # A negative increase means a counter reset inside the window: the caller must not hand it on.
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, (int, float)) and value < 0:
                raise ValueError(f"WindowStats.{item.name} must not be negative, got {value}")
        if any(count < 0 for _, count in self.tpot_buckets):
            raise ValueError("WindowStats.tpot_buckets counts must not be negative")
        if any(count < 0 for count in self.accepted_per_position):
            raise ValueError("WindowStats.accepted_per_position counts must not be negative")

    @property
    def decode_steps(self) -> float:
        """(request, step) pairs decoded: drafts with speculation, generated tokens without."""
        return self.drafts if self.k > 0 else self.generation_tokens

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted_tokens / self.drafts if self.k > 0 and self.drafts > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.k > 0 and self.draft_tokens > 0 else None

    def position_acceptance(self, position: int) -> float | None:
        """Share of drafts whose first `position + 1` tokens were accepted."""
        if self.k <= position or self.drafts <= 0 or position >= len(self.accepted_per_position):
            return None
        return self.accepted_per_position[position] / self.drafts

    @property
    def tokens_per_second_per_gpu(self) -> float | None:
        """Ungated context: it follows offered load (a canary pod given less traffic makes fewer tokens)."""
        if self.seconds <= 0 or self.gpus <= 0:
            return None
        return self.generation_tokens / self.seconds / self.gpus

    @property
    def load_per_pod(self) -> float | None:
        """Mean running requests per pod over the window."""
        return self.busy_seconds / self.seconds if self.seconds > 0 and self.busy_seconds > 0 else None

    @property
    def goodput_per_sequence(self) -> float | None:
        """Generated tokens per request-second of decoding: speed normalised by load (1 / mean TPOT)."""
        return self.generation_tokens / self.busy_seconds if self.busy_seconds > 0 and self.generation_tokens > 0 \
            else None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests > 0 else None

    def tpot_ms(self, quantile: float) -> float | None:
        seconds = histogram_quantile(quantile, self.tpot_buckets)
        return None if seconds is None else seconds * 1000.0

    @property
    def tpot_requests(self) -> float:
        return _bucket_counts(self.tpot_buckets)[1] if self.tpot_buckets else 0.0


@dataclass(frozen=True)
class KChange:
    """What the tuner's decision record says about the K change under test (status.speculation.lastDecision)."""

    predicted_gain: float  # relative goodput gain the tuner predicted at equal load


@dataclass(frozen=True)
class Comparison:
    """One gated metric: canary against stable, the ratio limit it must respect, and how sure the test is.

    `p_value`: the chance of a difference at least this large in the bad direction if the canary were
    exactly at the limit (or equal, for the rank test); None where no test applies.
    """

    metric: str
    canary: float
    stable: float
    limit: float
    higher_is_better: bool
    unit: str = ""
    decimals: int = 2
    p_value: float | None = None

    @property
    def ratio(self) -> float:
        return self.canary / self.stable

    @property
    def within_limit(self) -> bool:
        return self.ratio >= self.limit if self.higher_is_better else self.ratio <= self.limit

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < SIGNIFICANCE

    @property
    def passed(self) -> bool:
        """Fails only beyond the limit with significance; `uncertain` covers beyond-but-not-yet-significant."""
        return self.within_limit

    @property
    def failed(self) -> bool:
        return not self.within_limit and self.significant

    @property
    def uncertain(self) -> bool:
        return not self.within_limit and not self.significant

    def describe(self) -> str:
        relation = {(True, True): ">=", (True, False): "<", (False, True): "<=", (False, False): ">"}[
            (self.higher_is_better, self.within_limit)
        ]
        text = (
            f"{self.metric} {self.canary:.{self.decimals}f}{self.unit} vs stable "
            f"{self.stable:.{self.decimals}f}{self.unit} (ratio {self.ratio:.2f} {relation} {self.limit:.2f}"
        )
        if self.p_value is not None:
            text += f", p={self.p_value:.2g}"
        return text + ")"


@dataclass(frozen=True)
class Verdict:
    """Pass, Fail or Inconclusive, a CamelCase reason for Events, and a message carrying every number.

    `canary_requests` / `stable_requests`: finished requests each side had (the sample size).
    """

    outcome: Outcome
    reason: str
    message: str
    comparisons: tuple[Comparison, ...] = ()
    # When the evidence began (RFC 3339), if later than the step's start: set by a process that took
    # the step over from another, whose window it could not inherit (canary/evidence.py).
    evidence_since: str | None = None
    canary_requests: int = 0
    stable_requests: int = 0


# Evidence an error rate is above its limit must be this strong: the chance that a canary exactly at
# the limit shows at least as many errors. Strict, because the test is repeated on every reconcile.
ERROR_SIGNIFICANCE = 0.01
# The same for every other gated difference (TPOT, goodput, per-position acceptance): a one-sided p-value
# below this, on top of a ratio beyond its tolerance, fails a canary. The verdict is recomputed on a
# growing window every reconcile, so the level is strict; `specdec-operator bench canary` measures the
# false-rollback rate this gives.
SIGNIFICANCE = 0.001


def errors_exceed(errors: float, requests: float, limit: float) -> bool:
    """Whether `errors` of `requests` show, beyond chance, a true error rate above `limit`.

    One-sided binomial test: P(X >= errors | requests, limit) < ERROR_SIGNIFICANCE. One error in a
    handful of requests is not proof that a 1% limit is broken; five in a hundred is.
    """
    n, k = round(requests), round(errors)
    if k <= 0 or n <= 0 or k <= limit * n:
        return False
    if limit <= 0:
        return True
    if limit >= 1:
        return False
    # P(X < k), summed in log space so large request counts neither overflow nor underflow.
    log_p, log_q = math.log(limit), math.log1p(-limit)
    below = sum(
        math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q)
        for i in range(min(k, n + 1))
    )
    return 1.0 - below < ERROR_SIGNIFICANCE


def _normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _bucket_counts(buckets: Buckets) -> tuple[list[tuple[float, float]], float]:
    """Per-bucket (upper bound, count) from cumulative buckets, made monotone, and the total."""
    ordered = sorted(buckets)
    counts: list[tuple[float, float]] = []
    highest = previous = 0.0
    for bound, cumulative in ordered:
        highest = max(highest, cumulative)
        counts.append((bound, highest - previous))
        previous = highest
    return counts, highest


def rank_test_slower(canary: Buckets, stable: Buckets) -> float | None:
    """One-sided Mann-Whitney U test on two histograms with the same bounds: the p-value of the canary's
    observations being stochastically larger (slower) than the stable's. None without observations.

    Every observation in one bucket ties with the others there (mid-ranks); the normal approximation
    carries the tie correction and a continuity correction, as scipy's `mannwhitneyu` does.
    """
    canary_counts, n_c = _bucket_counts(canary)
    stable_counts, n_s = _bucket_counts(stable)
    if n_c <= 0 or n_s <= 0:
        return None
    stable_by_bound = dict(stable_counts)
    canary_by_bound = dict(canary_counts)
    bounds = sorted(set(stable_by_bound) | set(canary_by_bound))
    u = 0.0
    stable_below = 0.0
    ties = 0.0
    for bound in bounds:
        c, s = canary_by_bound.get(bound, 0.0), stable_by_bound.get(bound, 0.0)
        u += c * (stable_below + 0.5 * s)
        stable_below += s
        t = c + s
        ties += t**3 - t
    n = n_c + n_s
    variance = n_c * n_s / 12.0 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return 1.0
    z = (u - n_c * n_s / 2.0 - 0.5) / math.sqrt(variance)
    return _normal_sf(z)


def _log_spread(buckets: Buckets) -> float | None:
    """Standard deviation of log(TPOT) across requests, from bucket midpoints (geometric for finite
    buckets; the last finite bound for +Inf). It sizes the noise of a window's mean TPOT."""
    counts, total = _bucket_counts(buckets)
    if total < 2:
        return None
    points: list[tuple[float, float]] = []
    lower = 0.0
    for bound, count in counts:
        if count > 0:
            if math.isinf(bound):
                middle = lower
            elif lower > 0:
                middle = math.sqrt(lower * bound)
            else:
                middle = bound / 2
            if middle > 0:
                points.append((math.log(middle), count))
        if not math.isinf(bound):
            lower = bound
    weight = sum(count for _, count in points)
    if weight < 2:
        return None
    mean = sum(value * count for value, count in points) / weight
    variance = sum(count * (value - mean) ** 2 for value, count in points) / (weight - 1)
    return math.sqrt(variance)


# When a histogram cannot size the spread (fewer than two requests in it), assume this log-sd per request:
# a conservative figure for per-request TPOT across prompt and output lengths.
DEFAULT_LOG_SPREAD = 0.3
# The spread a bucket's width alone adds (a uniform spread over one vLLM TPOT bucket, roughly x1.5 wide).
MIN_LOG_SPREAD = 0.12


def _goodput_p_value(canary: WindowStats, stable: WindowStats, limit: float) -> float | None:
    """One-sided p-value of the canary's goodput per sequence being below `limit` x the stable's.

    Goodput per sequence is 1 / mean TPOT over the window's requests; its log has a standard error of
    about spread / sqrt(requests) per side, the spread read from the TPOT histogram.
    """
    c, s = canary.goodput_per_sequence, stable.goodput_per_sequence
    if c is None or s is None or canary.requests < 1 or stable.requests < 1:
        return None

    def spread(window: WindowStats) -> float:
        measured = _log_spread(window.tpot_buckets)
        return max(measured if measured is not None else DEFAULT_LOG_SPREAD, MIN_LOG_SPREAD)

    se = math.sqrt(spread(canary) ** 2 / canary.requests + spread(stable) ** 2 / stable.requests)
    z = (math.log(limit) - math.log(c / s)) / se
    return _normal_sf(z)


def _proportion_p_value(canary_hits: float, canary_n: float, stable_hits: float, stable_n: float,
                        limit: float) -> float | None:
    """One-sided p-value of the canary's proportion being below `limit` x the stable's (a z-test, Wald form)."""
    if canary_n <= 0 or stable_n <= 0:
        return None
    pc, ps = canary_hits / canary_n, stable_hits / stable_n
    target = limit * ps
    variance = pc * (1 - pc) / canary_n + limit**2 * ps * (1 - ps) / stable_n
    if variance <= 0:
        return 0.0 if pc < target else 1.0
    return _normal_sf((target - pc) / math.sqrt(variance))


def _error_text(canary: WindowStats, thresholds: CanaryAnalysis) -> str:
    return (
        f"canary error rate {canary.error_rate or 0.0:.2%} ({canary.errors:.0f} of {canary.requests:.0f} requests) "
        f"> {thresholds.max_error_rate:.2%}"
    )


def _immediate_failures(canary: WindowStats, thresholds: CanaryAnalysis) -> list[tuple[str, str]]:
    """Engine-health failures: each alone proves the canary is broken, whatever the sample size."""
    failures: list[tuple[str, str]] = []
    if canary.health_failures > 0:
        failures.append(("HealthCheckFailed", f"canary /health failed {canary.health_failures} times"))
    if canary.restarts > 0:
        failures.append(("ContainerRestarts", f"canary containers restarted {canary.restarts} times"))
    if errors_exceed(canary.errors, canary.requests, thresholds.max_error_rate):
        failures.append(("ErrorRateExceeded", _error_text(canary, thresholds)))
    return failures


def _goodput(canary: WindowStats, stable: WindowStats, thresholds: CanaryAnalysis,
             change: KChange | None) -> Comparison | str:
    c, s = canary.goodput_per_sequence, stable.goodput_per_sequence
    if c is None:
        return "no goodput per sequence measured on the canary"
    if s is None:
        return "no goodput per sequence measured on the stable revision"
    # A K change must deliver what the tuner predicted, within the tolerance; a loss it did not predict
    # is never expected.
    expected = 1.0 + max(change.predicted_gain, 0.0) if change is not None else 1.0
    limit = thresholds.min_tokens_per_second_ratio * expected
    metric = "goodput per sequence" if change is None else f"goodput per sequence (tuner predicted {expected:.2f}x)"
    return Comparison(metric, c, s, limit, True, " tok/s", 1, _goodput_p_value(canary, stable, limit))


def _tpot(canary: WindowStats, stable: WindowStats, thresholds: CanaryAnalysis) -> Comparison | str:
    c, s = canary.tpot_ms(0.9), stable.tpot_ms(0.9)
    if c is None:
        return "no TPOT p90 measured on the canary"
    if s is None or s <= 0:
        return "no TPOT p90 measured on the stable revision"
    return Comparison("TPOT p90", c, s, thresholds.max_tpot_ratio, False, " ms", 1,
                      rank_test_slower(canary.tpot_buckets, stable.tpot_buckets))


def _acceptance(canary: WindowStats, stable: WindowStats, thresholds: CanaryAnalysis) -> list[Comparison | str]:
    """Acceptance per draft position, on the positions both sides draft: a K change must not move it."""
    shared = min(canary.k, stable.k)
    if shared <= 0:
        return []
    if min(canary.drafts, stable.drafts) < thresholds.min_drafts:
        return [f"{min(canary.drafts, stable.drafts):.0f} drafts on the smaller side; acceptance needs "
                f"{thresholds.min_drafts} each"]
    if not canary.accepted_per_position or not stable.accepted_per_position:
        # A vLLM without per-position counters: accepted length, when both sides draft the same K. At
        # different K there is nothing like for like; goodput (against the tuner's prediction) still gates.
        if canary.k != stable.k:
            return []
        c, s = canary.mean_accepted_length, stable.mean_accepted_length
        if c is None or s is None:
            return ["no accepted length measured"]
        return [Comparison("accepted length", c, s, thresholds.min_accepted_length_ratio, True)]
    found: list[Comparison | str] = []
    for position in range(shared):
        c, s = canary.position_acceptance(position), stable.position_acceptance(position)
        if c is None or s is None:
            return [f"no acceptance measured at draft position {position + 1}"]
        if s <= 0:
            continue
        p_value = _proportion_p_value(c * canary.drafts, canary.drafts, s * stable.drafts, stable.drafts,
                                      thresholds.min_accepted_length_ratio)
        found.append(Comparison(f"acceptance at position {position + 1}", c, s,
                                thresholds.min_accepted_length_ratio, True, p_value=p_value))
    return found


def _context(canary: WindowStats, stable: WindowStats) -> list[str]:
    """Ungated figures that help a reader judge the verdict."""
    notes: list[str] = []
    if canary.mean_accepted_length is not None and stable.mean_accepted_length is not None:
        notes.append(f"accepted length {canary.mean_accepted_length:.2f} vs stable {stable.mean_accepted_length:.2f}")
    canary_p50, stable_p50 = canary.tpot_ms(0.5), stable.tpot_ms(0.5)
    if canary_p50 is not None and stable_p50 is not None:
        notes.append(f"TPOT p50 {canary_p50:.1f} ms vs stable {stable_p50:.1f} ms")
    canary_load, stable_load = canary.load_per_pod, stable.load_per_pod
    if canary_load is not None and stable_load is not None:
        notes.append(f"load {canary_load:.1f} vs {stable_load:.1f} running requests per pod")
    c_tps, s_tps = canary.tokens_per_second_per_gpu, stable.tokens_per_second_per_gpu
    if c_tps is not None and s_tps is not None:
        notes.append(f"tokens/s per GPU {c_tps:.1f} vs {s_tps:.1f} (follows load; not gated)")
    notes.append(f"K {canary.k} vs {stable.k}")
    notes.append(_samples(canary, stable))
    return notes


def _samples(canary: WindowStats, stable: WindowStats | None) -> str:
    seconds = max(canary.seconds, stable.seconds) if stable is not None else canary.seconds
    if stable is None:
        return f"{canary.requests:.0f} canary requests over {seconds:.0f} s"
    return f"{canary.requests:.0f} canary and {stable.requests:.0f} stable requests over {seconds:.0f} s"


def _verdict(outcome: Outcome, reason: str, message: str, canary: WindowStats, stable: WindowStats | None,
             comparisons: tuple[Comparison, ...] = ()) -> Verdict:
    return Verdict(outcome, reason, message, comparisons, canary_requests=round(canary.requests),
                   stable_requests=round(stable.requests) if stable is not None else 0)


def analyse(
    canary: WindowStats,
    stable: WindowStats | None,
    thresholds: CanaryAnalysis,
    change: KChange | None = None,
) -> Verdict:
    """Judge the canary against the stable revision over the same window.

    `stable` None: no stable replica serves during this step (a one-replica pool whose canary took its
    only replica in place); the canary is then judged on what needs no baseline: health, restarts and the
    error rate over at least `minRequests` finished requests.
    `change`: the tuner's K change under test, if that is all the canary changes.
    """
    failures = _immediate_failures(canary, thresholds)
    if failures:
        return _verdict("Fail", failures[0][0], "; ".join(text for _, text in failures), canary, stable)

    fewest = min(canary.requests, stable.requests) if stable is not None else canary.requests
    if fewest <= 0 or fewest < thresholds.min_requests:
        return _verdict("Inconclusive", "InsufficientSamples",
                        f"{_samples(canary, stable)}; need {thresholds.min_requests} finished requests each",
                        canary, stable)

    error_rate = canary.error_rate
    if error_rate is not None and error_rate > thresholds.max_error_rate:
        # Above the limit, but not yet beyond chance: no step passes on it; more requests decide.
        return _verdict("Inconclusive", "ErrorRateUncertain",
                        f"{_error_text(canary, thresholds)}, not yet significant; {_samples(canary, stable)}",
                        canary, stable)

    if stable is None:
        return _verdict("Pass", "NoBaselineHealthy",
                        f"no stable replica serves in this step (one-replica pool replaced in place): judged on "
                        f"health, restarts and errors only; error rate {error_rate or 0.0:.2%}; "
                        f"{_samples(canary, None)}", canary, None)

    candidates: list[Comparison | str] = [*_acceptance(canary, stable, thresholds),
                                          _goodput(canary, stable, thresholds, change)]
    if canary.tpot_buckets or stable.tpot_buckets:
        candidates.append(_tpot(canary, stable, thresholds))
    comparisons = tuple(item for item in candidates if isinstance(item, Comparison))
    missing = [item for item in candidates if isinstance(item, str)]
    # Failed checks lead the message so the reason reads first in `kubectl describe` and Events.
    ordered = sorted(comparisons, key=lambda item: (not item.failed, not item.uncertain))
    message = "; ".join([*(item.describe() for item in ordered), *missing, *_context(canary, stable)])
    if any(item.failed for item in comparisons):
        failed = next(item for item in ordered if item.failed)
        reason = "TPOTExceeded" if failed.metric.startswith("TPOT") else (
            "AcceptanceDropped" if failed.metric.startswith("accept") else "GoodputBelowExpected")
        return _verdict("Fail", reason, message, canary, stable, comparisons)
    if missing:
        return _verdict("Inconclusive", "MissingMeasurements", message, canary, stable, comparisons)
    if any(item.uncertain for item in comparisons):
        return _verdict("Inconclusive", "DifferenceUncertain", message, canary, stable, comparisons)
    return _verdict("Pass", "ThresholdsMet", message, canary, stable, comparisons)
