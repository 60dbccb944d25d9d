"""Canary analysis: one revision's counters against another's over the same window, as a verdict with numbers.

Pure: the scraper turns counter deltas into `WindowStats`, this module only compares them.
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

    def __post_init__(self) -> None:
        # A negative increase means a counter reset inside the window: the caller must not hand it on.
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, (int, float)) and value < 0:
                raise ValueError(f"WindowStats.{item.name} must not be negative, got {value}")
        if any(count < 0 for _, count in self.tpot_buckets):
            raise ValueError("WindowStats.tpot_buckets counts must not be negative")

    @property
    def decode_steps(self) -> float:
        """(request, step) pairs decoded: drafts with speculation, generated tokens without.

        Without speculation every step emits exactly one token per request, so generated tokens
        count the same unit that drafts count with it; this lets `min_drafts` gate both cases.
        """
        return self.drafts if self.k > 0 else self.generation_tokens

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted_tokens / self.drafts if self.k > 0 and self.drafts > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.k > 0 and self.draft_tokens > 0 else None

    @property
    def tokens_per_second_per_gpu(self) -> float | None:
        if self.seconds <= 0 or self.gpus <= 0:
            return None
        return self.generation_tokens / self.seconds / self.gpus

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests > 0 else None

    def tpot_ms(self, quantile: float) -> float | None:
        seconds = histogram_quantile(quantile, self.tpot_buckets)
        return None if seconds is None else seconds * 1000.0


@dataclass(frozen=True)
class Comparison:
    """One gated metric: canary against stable, and the ratio limit it must respect."""

    metric: str
    canary: float
    stable: float
    limit: float
    higher_is_better: bool
    unit: str = ""
    decimals: int = 2

    @property
    def ratio(self) -> float:
        return self.canary / self.stable

    @property
    def passed(self) -> bool:
        return self.ratio >= self.limit if self.higher_is_better else self.ratio <= self.limit

    def describe(self) -> str:
        relation = {(True, True): ">=", (True, False): "<", (False, True): "<=", (False, False): ">"}[
            (self.higher_is_better, self.passed)
        ]
        return (
            f"{self.metric} {self.canary:.{self.decimals}f}{self.unit} vs stable "
            f"{self.stable:.{self.decimals}f}{self.unit} (ratio {self.ratio:.2f} {relation} {self.limit:.2f})"
        )


@dataclass(frozen=True)
class Verdict:
    """Pass, Fail or Inconclusive, a CamelCase reason for Events, and a message carrying every number."""

    outcome: Outcome
    reason: str
    message: str
    comparisons: tuple[Comparison, ...] = ()
    # When the evidence began (RFC 3339), if later than the step's start: set by a process that took
    # the step over from another, whose window it could not inherit (canary/evidence.py).
    evidence_since: str | None = None


# Evidence an error rate is above its limit must be this strong: the chance that a canary exactly at
# the limit shows at least as many errors. Strict, because the test is repeated on every reconcile.
ERROR_SIGNIFICANCE = 0.01


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


def _compare(
    metric: str,
    canary: float | None,
    stable: float | None,
    limit: float,
    *,
    higher_is_better: bool,
    unit: str = "",
    decimals: int = 2,
) -> Comparison | str:
    """A Comparison, or the reason none is possible (the text lands in an Inconclusive message)."""
    if canary is None:
        return f"no {metric} measured on the canary"
    if stable is None or stable <= 0:
        return f"no {metric} measured on the stable revision"
    return Comparison(metric, canary, stable, limit, higher_is_better, unit, decimals)


def _comparisons(
    canary: WindowStats, stable: WindowStats, thresholds: CanaryAnalysis
) -> tuple[list[Comparison], list[str]]:
    candidates: list[Comparison | str] = []
    if canary.k == stable.k > 0:
        # Accepted length only compares drafters at the same K: a longer K accepts more per step by
        # construction (a tuner change), and with speculation off there is none. Speed and latency
        # still tell whether the change helps.
        candidates.append(
            _compare(
                "accepted length",
                canary.mean_accepted_length,
                stable.mean_accepted_length,
                thresholds.min_accepted_length_ratio,
                higher_is_better=True,
            )
        )
    candidates.append(
        _compare(
            "tokens/s per GPU",
            canary.tokens_per_second_per_gpu,
            stable.tokens_per_second_per_gpu,
            thresholds.min_tokens_per_second_ratio,
            higher_is_better=True,
            decimals=1,
        )
    )
    if canary.tpot_buckets or stable.tpot_buckets:
        # Without TPOT histograms on either side (a vLLM serving no requests of its own) there is no
        # latency to gate; with them on one side only, the comparison is reported as missing.
        candidates.append(_compare(
            "TPOT p90",
            canary.tpot_ms(0.9),
            stable.tpot_ms(0.9),
            thresholds.max_tpot_ratio,
            higher_is_better=False,
            unit=" ms",
            decimals=1,
        ))
    comparisons = [item for item in candidates if isinstance(item, Comparison)]
    missing = [item for item in candidates if isinstance(item, str)]
    return comparisons, missing


def _context(canary: WindowStats, stable: WindowStats) -> list[str]:
    """Ungated figures that help a reader judge the verdict."""
    notes: list[str] = []
    if canary.acceptance_rate is not None and stable.acceptance_rate is not None:
        notes.append(f"acceptance rate {canary.acceptance_rate:.2f} vs stable {stable.acceptance_rate:.2f}")
    canary_p50, stable_p50 = canary.tpot_ms(0.5), stable.tpot_ms(0.5)
    if canary_p50 is not None and stable_p50 is not None:
        notes.append(f"TPOT p50 {canary_p50:.1f} ms vs stable {stable_p50:.1f} ms")
    notes.append(f"K {canary.k} vs {stable.k}")
    notes.append(_samples(canary, stable))
    return notes


def _samples(canary: WindowStats, stable: WindowStats) -> str:
    unit = "drafts" if canary.k > 0 and stable.k > 0 else "decode steps"
    return (
        f"{canary.decode_steps:.0f} canary and {stable.decode_steps:.0f} stable {unit} "
        f"over {max(canary.seconds, stable.seconds):.0f} s"
    )


def analyse(canary: WindowStats, stable: WindowStats, thresholds: CanaryAnalysis) -> Verdict:
    """Judge the canary against the stable revision over the same window."""
    failures = _immediate_failures(canary, thresholds)
    if failures:
        return Verdict("Fail", failures[0][0], "; ".join(text for _, text in failures))

    fewest = min(canary.decode_steps, stable.decode_steps)
    if fewest <= 0 or fewest < thresholds.min_drafts:
        return Verdict(
            "Inconclusive",
            "InsufficientSamples",
            f"{_samples(canary, stable)}; need {thresholds.min_drafts} each",
        )

    error_rate = canary.error_rate
    if error_rate is not None and error_rate > thresholds.max_error_rate:
        # Above the limit, but not yet beyond chance: no step passes on it; more requests decide.
        return Verdict(
            "Inconclusive",
            "ErrorRateUncertain",
            f"{_error_text(canary, thresholds)}, not yet significant; {_samples(canary, stable)}",
        )

    comparisons, missing = _comparisons(canary, stable, thresholds)
    if missing:
        return Verdict("Inconclusive", "MissingMeasurements", "; ".join([*missing, _samples(canary, stable)]))

    # Failed checks lead the message so the reason reads first in `kubectl describe` and Events.
    ordered = sorted(comparisons, key=lambda item: item.passed)
    message = "; ".join([*(item.describe() for item in ordered), *_context(canary, stable)])
    if all(item.passed for item in comparisons):
        return Verdict("Pass", "ThresholdsMet", message, tuple(comparisons))
    return Verdict("Fail", "ThresholdsMissed", message, tuple(comparisons))
