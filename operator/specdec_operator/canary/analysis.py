"""Canary analysis: one revision's counters against another's over the same window, as a verdict with numbers.

Pure: the canary evidence turns counter deltas into `WindowStats` (with per pod and scrape interval cells),
this module only compares them. The method (docs/canary.md) in short:

- samples are finished requests: no verdict but a failure before each side finished `minRequests`;
- nothing is compared at unequal per-pod load or on different traffic (request shares against the weights,
  prompt and output lengths): such a window is Inconclusive (TrafficMismatch), never failed;
- standard errors come from what is independent, pods and scrape intervals (ratio estimators with a
  cluster-robust variance), never from requests or drafts counted as independent trials;
- a difference fails a canary only beyond its tolerance AND on an always-valid p-value (a mixture
  sequential probability ratio test), so recomputing the verdict at every reconcile keeps its level;
- a step passes on evidence: the error rate's upper confidence bound below the limit, a known tail, and
  every other figure within its limit or within the noise of one look;
- a K change is judged on what K changes: acceptance per draft position on the positions both sides draft
  must hold (the stable's re-weighted to the canary's K: the same requests show other rates at another K),
  and goodput must reach what the tuner predicted (within the tolerance).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from specdec_operator.api.spec import CanaryAnalysis
from specdec_operator.canary.histogram import (
    CUBIC,
    POWER_LAW,
    Buckets,
    Reading,
    count_at_or_below,
    histogram_total,
    merge_histograms,
    monotone_points,
    quantile_of,
    rebin,
)
from specdec_operator.tuner.composition import FITTED_POSITIONS, acceptance_mix, rates_at

Outcome = Literal["Pass", "Fail", "Inconclusive"]


@dataclass(frozen=True)
class Cell:
    """The increases of one pod over one scrape interval (or a few adjacent ones merged): the unit whose
    spread sizes every standard error. Requests on one pod share its batch and the drafts of one request
    share its content, so neither requests nor drafts are independent samples; pods and intervals are."""

    pod: str
    seconds: float
    generation_tokens: float = 0.0
    busy_seconds: float = 0.0
    requests: float = 0.0
    errors: float = 0.0
    drafts: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: tuple[float, ...] = ()
    tpot_buckets: Buckets = ()
    # When the interval began, on the clock of the scrapes (None: unknown). Orders the cells in time, so
    # the error test can look at the window from any interval on (`error_p`).
    start: float | None = None

    def plus(self, other: Cell) -> Cell:
        size = max(len(self.accepted_per_position), len(other.accepted_per_position))
        left = self.accepted_per_position + (0.0,) * (size - len(self.accepted_per_position))
        right = other.accepted_per_position + (0.0,) * (size - len(other.accepted_per_position))
        return Cell(
            pod=self.pod,
            seconds=self.seconds + other.seconds,
            generation_tokens=self.generation_tokens + other.generation_tokens,
            busy_seconds=self.busy_seconds + other.busy_seconds,
            requests=self.requests + other.requests,
            errors=self.errors + other.errors,
            drafts=self.drafts + other.drafts,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
            accepted_per_position=tuple(a + b for a, b in zip(left, right, strict=True)),
            tpot_buckets=merge_histograms([self.tpot_buckets, other.tpot_buckets]),
            start=min((at for at in (self.start, other.start) if at is not None), default=None),
        )


@dataclass(frozen=True)
class WindowStats:
    """Increases of one revision's counters over an analysis window; canary and stable share the window.

    TPOT comes from vllm:request_time_per_output_token_seconds, not inter-token latency: under
    speculation one step emits several tokens, so inter-token latency is time per step and would
    flatter or punish a side merely for running a different K.

    `busy_seconds` is request-seconds of decoding (vllm:inter_token_latency_seconds' sum: one step time
    per running request per step; the running-requests gauge times the interval as a fallback). Divided
    by `seconds` (pod-seconds) it is the mean running batch per pod.

    `cells`: the same increases per pod and scrape interval, for standard errors (empty: the analysis
    falls back to per-request spreads). `prompt_buckets` / `output_buckets`: increases of vLLM's
    request_prompt_tokens / request_generation_tokens histograms, to check both sides saw the same traffic.
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
    cells: tuple[Cell, ...] = ()
    prompt_buckets: Buckets = ()
    output_buckets: Buckets = ()
    pods: int = 0

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
    def requests_per_pod_second(self) -> float | None:
        """Offered load per pod: finished requests per pod-second. Unlike the running batch it does not
        grow when a side is slower, so it says whether both sides were offered the same load."""
        return self.requests / self.seconds if self.seconds > 0 else None

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
    def tokens_per_pod_second(self) -> float | None:
        """Generated tokens per pod-second: the decode work each pod was offered (open-loop clients' rate times
        their output lengths), which sets the batch a pod runs and so its step time."""
        return self.generation_tokens / self.seconds if self.seconds > 0 else None

    @property
    def tokens_per_second_per_gpu(self) -> float | None:
        """Ungated context: it follows offered load (a canary pod given less traffic makes fewer tokens)."""
        per_pod = self.tokens_per_pod_second
        return per_pod / self.gpus if per_pod is not None and self.gpus > 0 else None

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
        seconds = quantile_of(quantile, self.tpot_buckets)
        return None if seconds is None else seconds * 1000.0

    @property
    def tpot_requests(self) -> float:
        return _bucket_counts(self.tpot_buckets)[1] if self.tpot_buckets else 0.0


@dataclass(frozen=True)
class KChange:
    """What the tuner's decision record says about the K change under test (status.speculation.lastDecision)."""

    predicted_gain: float  # relative goodput gain the tuner predicted at equal load


def _figure(value: float, decimals: int) -> str:
    """`value` to `decimals` places, or to two significant digits where those places would show a nonzero value as
    zero: a drafter whose later positions are all but never accepted read "0.00 vs stable 0.00 (ratio 4.69", which
    tells a reader nothing of what the ratio compares."""
    if value != 0 and abs(value) < 0.5 * 10.0**-decimals:
        return f"{value:.2g}"
    return f"{value:.{decimals}f}"


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
    # For a tail: the upper confidence bound of the canary's excess share beyond the limit, from the requests
    # and intervals seen; the tail is within its limit only once this bound is below TAIL_PASS_MARGIN (a p99
    # needs requests to be known).
    excess_bound: float | None = None
    # How far beyond the limit the estimate lies, in standard errors of one look (negative: within). A
    # point estimate beyond the limit by less than DOUBT_Z standard errors is noise: it passes.
    beyond_z: float | None = None
    # For a tail: the point estimate of that excess share, the largest over the readings between bounds. More
    # requests tighten the bound onto it: below TAIL_PASS_MARGIN the tail will pass once known, at or above it
    # never will.
    excess_estimate: float | None = None
    # For goodput and acceptance: the standard error of one look from the requests and intervals within each pod
    # (what more requests shrink; how pods differ is left out, as no wait shrinks it), and the size of regression
    # the gate's sequential test looks for, both on the statistic's scale (log ratio).
    noise: float | None = None
    scale: float | None = None

    @property
    def ratio(self) -> float:
        return self.canary / self.stable

    @property
    def tail_known(self) -> bool:
        return self.excess_bound is None or self.excess_bound < TAIL_PASS_MARGIN

    @property
    def estimate_within_limit(self) -> bool:
        """The point estimate is within the limit (a tail may still be unknown)."""
        return self.ratio >= self.limit if self.higher_is_better else self.ratio <= self.limit

    @property
    def within_limit(self) -> bool:
        return self.estimate_within_limit and self.tail_known

    @property
    def passes_with_more_requests(self) -> bool:
        """Within the limit by its estimates, so that more requests would pass it: for a tail, its excess share
        too, under every reading. A p99 read 1.9x against a limit of 2 whose requests put 2% beyond the limit
        is not waiting for requests: it is beyond it, however long the step runs."""
        return self.estimate_within_limit and (
            self.excess_estimate is None or self.excess_estimate < TAIL_PASS_MARGIN)

    @property
    def wants_requests(self) -> bool:
        """Beyond its limit by an estimate too noisy to weigh: at one look's standard error the sequential test
        would not find even the regression it looks for (`scale` beyond the limit) significant (`detectable`),
        so more requests, not this window, must tell a canary at its limit from one that far beyond. A quiet
        model's window (0.2 requests/s on one pod: about 180 requests
        by a 900 s timeout, a few long ones deciding goodput and acceptance) reads so; more requests shrink the
        noise and decide. An estimate beyond its limit by more than NOISE_HOLD_Z of those standard errors is
        evidence however wide they are (a drafter that broke read 0.13 of the stable's acceptance from 9 requests,
        p=1 under the sequential test): a suspect regression, not a want of requests. TPOT carries no `noise`: a
        p99 has its own rule (`passes_with_more_requests`), and a p90 share's spread is not split between pods and
        intervals."""
        return (self.excess_bound is None and self.noise is not None and self.scale is not None
                and not detectable(self.noise, self.scale)
                and self.beyond_z is not None and self.beyond_z <= NOISE_HOLD_Z)

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < SIGNIFICANCE

    @property
    def passed(self) -> bool:
        """Within the limit, or beyond it by less than the noise of one look (the benefit of the doubt);
        a tail must be known and within its limit: a p99 rests on a handful of requests, so the noise of one
        look is as large as the regression (3% of requests stalled 5x read 2.05-2.2x against a limit of 2 and
        passed as noise). Fails only beyond the limit with always-valid significance; the rest is `uncertain`:
        more requests decide."""
        if self.within_limit:
            return True
        if self.excess_bound is not None:
            return False
        return self.beyond_z is not None and self.beyond_z < DOUBT_Z

    @property
    def failed(self) -> bool:
        return not self.within_limit and self.significant

    @property
    def uncertain(self) -> bool:
        return not self.passed and not self.failed

    def describe(self) -> str:
        relation = {(True, True): ">=", (True, False): "<", (False, True): "<=", (False, False): ">"}[
            (self.higher_is_better, self.estimate_within_limit)
        ]
        text = (
            f"{self.metric} {_figure(self.canary, self.decimals)}{self.unit} vs stable "
            f"{_figure(self.stable, self.decimals)}{self.unit} (ratio {self.ratio:.2f} {relation} {self.limit:.2f}"
        )
        if self.p_value is not None:
            text += f", p={self.p_value:.2g}"
        if not self.within_limit and self.passed:
            text += ", within noise"
        elif not self.passed and not self.failed and self.wants_requests:
            text += ", too few requests to weigh"
        if self.excess_bound is not None and self.excess_bound >= TAIL_PASS_MARGIN:
            text += f"; not yet known within: the canary's share of requests beyond the limit may exceed the " \
                    f"stable's beyond its quantile by up to {self.excess_bound:.1%} (95%)"
        return text + ")"


@dataclass(frozen=True)
class Verdict:
    """Pass, Fail or Inconclusive, a CamelCase reason for Events, and a message carrying every number.

    `canary_requests` / `stable_requests`: finished requests each side had (the sample size).
    `canary_load` / `stable_load`: offered load per pod (finished requests per pod-second) of each side,
    recorded in every verdict: a comparison is only as fair as these are equal.
    `stable_tokens_per_pod_second`: the stable's generated tokens per pod-second, what the 100% step's TPOT
    reference is valid under (`load_beyond_reference`).
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
    canary_load: float | None = None
    stable_load: float | None = None
    stable_tokens_per_pod_second: float | None = None
    # The 95% upper confidence bound of the canary's error rate (overdispersion-corrected).
    error_rate_bound: float | None = None
    # Failed requests on the canary side: a quiet model's hold promotes at its end only with none.
    canary_errors: int = 0
    # Canary pods that served in the window: one pod's hardware cannot be told from its revision's code.
    canary_pods: int = 0


# Always-valid level of every gated difference (goodput, TPOT p90, TPOT p99, acceptance; a Bonferroni
# share per draft position): the chance that a canary exactly at a limit EVER shows a p-value this small,
# however often the verdict is recomputed on the growing window (a mixture sequential probability ratio
# test, Johari, Pekelis and Walsh, "Always valid inference"). docs/canary.md adds the gates up per canary.
SIGNIFICANCE = 0.001
# The same for the error rate (a mixture of binomial SPRTs): proof the rate is above its limit.
ERROR_SIGNIFICANCE = 0.001
# A step passes the error gate only when the upper bound of this one-sided confidence is below the limit.
ERROR_PASS_CONFIDENCE = 0.95
# Request shares off the weights by more than this (relative), at p < MIX_SIGNIFICANCE, or prompt or
# output lengths whose medians differ by more than LENGTH_TOLERANCE at that p: the sides did not see the
# same traffic (a sample-ratio or a mix mismatch). Inconclusive, never failed.
SHARE_TOLERANCE = 0.2
LENGTH_TOLERANCE = 1.25
MIX_SIGNIFICANCE = 0.001
# The p99 passes only once the canary's share of requests beyond the limit exceeds the stable's share
# beyond its p99 by less than this, at 95% confidence from the requests and intervals seen: a tail is not
# known from a handful of requests (the pods' spread, which no wait shrinks, sizes only the failing test).
# Half a point: the p99 passes while at most 1.5% of the canary may lie beyond the limit (its p98.5 known
# within it), known from about 120 stable requests with none of the canary's beyond. At a whole point (about
# 70 requests) a canary with 2% of its requests stalled beyond a limit of 2x passed as within it: its p98 was,
# not its p99. At zero (the p99 itself) it takes about 300, and how soon the bound crosses depends on how the
# stable's tail falls into pods x intervals: a replay whose scrapes fell at other moments than the operator's
# ended steps at other moments, and disagreed with it in two of three CI runs (the e2e replay tests, 2026-12-06).
TAIL_PASS_MARGIN = 0.005
# The readings (stable's, canary's) under which a p99 must also be known within its limit before it passes,
# besides the cubic for both: every pairing of the two (histogram.py).
READING_PAIRS = ((POWER_LAW, POWER_LAW), (POWER_LAW, CUBIC), (CUBIC, POWER_LAW))
# A point estimate beyond its limit by less than this many standard errors (one-sided p > 0.2 at one look)
# is not evidence of a regression: it passes. More than this and not yet proven: Inconclusive.
DOUBT_Z = 0.8416212335729143
# A comparison beyond its limit too noisy to weigh waits for requests (`Comparison.wants_requests`: its one-look
# standard error so wide that the sequential test would not find even the regression it looks for significant,
# `detectable`); a step left so at its timeout is a quiet model's, held, not rolled back. But only while its
# estimate lies within this many of those standard errors beyond the limit, the one-sided normal quantile of
# SIGNIFICANCE: farther out, one look alone would be significant at the gates' level, and the window is evidence
# of a regression however few its requests. (At 2, identical revisions on one pod at 0.2 requests/s, whose
# standard errors rest on a few long requests, were read as evidence in 3 of 40 trials.)
NOISE_HOLD_Z = 3.090232306167813
TAIL_PASS_Z = 1.6448536269514722
# How much pods of one revision differ in speed (log-sd per pod) when too few pods say: hardware of one SKU is
# not equal (8% average performance variation, outliers 1.5x slower, across same-SKU GPUs in five clusters,
# AMD MI60 included: Sinha et al., "Not All GPUs Are Created Equal", SC22), and nodes differ besides. One canary
# pod against one stable pod compares two draws of it: taking their difference for the revision's, the
# equality tests at 5% rejected identical revisions in a third of such windows (the canary bench). A prior of
# POD_SPREAD_FREEDOM degree of freedom, as much as two pods a side: it yields to pods as soon as they measure
# their spread (eight a side weigh fourteen times more). Four degrees slowed the bench's detection of a 10%
# goodput loss (median 910 s against 670 s, default steps) for no gain in calibration: one pod a side decides it.
POD_SPREAD = 0.03
POD_SPREAD_FREEDOM = 1
# Mixture scales of the sequential tests: the size of a regression the test is most sensitive to, on the
# scale of each statistic (log ratio; share of requests above a tail threshold).
LOG_RATIO_SCALE = 0.1
P90_SHARE_SCALE = 0.05
P99_SHARE_SCALE = 0.02
# Error-rate alternatives the binomial mixture spreads its weight over, as multiples of the limit.
ERROR_ALTERNATIVES = (1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
# Errors that begin mid-window (a canary that starts failing once it has every request, a dependency that
# breaks) must not hide behind the clean intervals before them: the error test gives this share of its
# weight to the window's tails, each from one interval boundary on (`error_p`). The whole window keeps the rest.
ERROR_ONSET_SHARE = 0.1
# Up to this many errors the binomial tail is summed exactly; beyond, a normal or Chernoff tail: the
# work is bounded whatever a pod's counters say.
EXACT_TAIL_TERMS = 2000


def _normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _log_normal_cdf(z: float) -> float:
    """log P(Z <= z), accurate far into the lower tail."""
    if z > -30:
        return math.log(max(0.5 * math.erfc(-z / math.sqrt(2.0)), 1e-300))
    return -0.5 * z * z - math.log(-z) - 0.5 * math.log(2 * math.pi)


def _binomial_log_pmf(i: int, n: int, log_p: float, log_q: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q


def binomial_tail(errors: float, requests: float, limit: float) -> float:
    """P(X >= errors) for X ~ Binomial(requests, limit), with work bounded whatever the counts: exact up to
    EXACT_TAIL_TERMS errors, then the normal tail (continuity-corrected) where the variance is large, else
    the Chernoff bound exp(-n KL(k/n || p)), which never understates the tail."""
    n, k = round(requests), round(errors)
    if k <= 0:
        return 1.0
    if n <= 0 or k > n:
        return 0.0 if n > 0 else 1.0
    if limit <= 0:
        return 0.0
    if limit >= 1:
        return 1.0
    if k <= EXACT_TAIL_TERMS:
        log_p, log_q = math.log(limit), math.log1p(-limit)
        # P(X >= k) = 1 - P(X < k); summed in log space so large n neither overflows nor underflows.
        below = math.fsum(math.exp(_binomial_log_pmf(i, n, log_p, log_q)) for i in range(k))
        return max(0.0, 1.0 - below)
    variance = n * limit * (1 - limit)
    if variance >= 25:
        return _normal_sf((k - 0.5 - n * limit) / math.sqrt(variance))
    share = k / n
    if share <= limit:
        return 1.0
    divergence = share * math.log(share / limit) + (
        (1 - share) * math.log((1 - share) / (1 - limit)) if share < 1 else 0.0)
    return math.exp(-n * divergence)


def errors_exceed(errors: float, requests: float, limit: float, significance: float = 0.01) -> bool:
    """Whether `errors` of `requests` show, beyond chance, a true error rate above `limit`: the fixed-sample
    one-sided binomial test P(X >= errors | requests, limit) < `significance`. O(1) in the counts."""
    if errors <= 0 or requests <= 0 or errors <= limit * requests:
        return False
    if limit <= 0:
        return True
    if limit >= 1:
        return False
    return binomial_tail(errors, requests, limit) < significance


def error_sequential_p(errors: float, requests: float, limit: float) -> float:
    """Always-valid p-value of the error rate being above `limit`: 1 / the mean of binomial likelihood ratios
    against alternatives above the limit (ERROR_ALTERNATIVES). Each ratio, and so their mean, is a
    supermartingale for any rate at or below the limit, so P(ever below alpha) <= alpha (Ville)."""
    if errors <= 0 or requests <= 0:
        return 1.0
    errors = min(errors, requests)
    if limit <= 0:
        return 0.0
    if limit >= 1:
        return 1.0
    logs = []
    for multiple in ERROR_ALTERNATIVES:
        alternative = min(limit * multiple, (1 + limit) / 2)
        logs.append(errors * math.log(alternative / limit)
                    + (requests - errors) * (math.log1p(-alternative) - math.log1p(-limit)))
    top = max(logs)
    log_mean = top + math.log(math.fsum(math.exp(value - top) for value in logs) / len(logs))
    return 1.0 if log_mean <= 0 else math.exp(-log_mean)


@dataclass(frozen=True)
class ErrorEvidence:
    """The error test's always-valid p-value, and the part of the window that carries most of its evidence:
    the whole window (`since_s` 0) or its tail from `since_s` seconds after the window's first interval."""

    p_value: float
    errors: float
    requests: float
    since_s: float


def _error_e_value(errors: float, requests: float, limit: float) -> float:
    p_value = error_sequential_p(errors, requests, limit)
    return math.inf if p_value <= 0 else 1.0 / p_value


def _overdispersed(errors: float, requests: float, squares: tuple[float, float, float], units: int) -> float:
    """`_error_overdispersion` from sums over the cells: (sum errors^2, sum errors*requests, sum requests^2)."""
    if requests <= 0 or units < 2:
        return 1.0
    share = errors / requests
    errors_sq, cross, requests_sq = squares
    residuals = max(0.0, errors_sq - 2 * share * cross + share * share * requests_sq)
    return _dispersion_factor(share, units / (units - 1) * residuals / requests**2, requests)


def error_p(window: WindowStats, limit: float) -> ErrorEvidence:
    """Always-valid p-value of the canary's error rate being above `limit`, over the whole window or from any
    interval boundary on (errors that begin mid-window).

    The boundaries are the cells' starts, in order, those less than half a median interval apart taken as one.
    Each tail's binomial mixture (`error_sequential_p`, on counts divided by the tail's own overdispersion) is
    an e-process from its boundary on; the j-th boundary gets weight ERROR_ONSET_SHARE / (j (j + 1)) and the
    whole window the rest. Fixed weights summing to one keep the mixture a test martingale under any rate at or
    below the limit, so the chance of ever failing a canary at the limit stays at most the level (Ville); the
    price for an onset at the j-th boundary is a factor j (j + 1) / ERROR_ONSET_SHARE on its p-value."""
    errors, requests = error_counts(window)
    whole = _error_e_value(errors, requests, limit)
    best = ErrorEvidence(1.0 / whole if whole > 0 else 1.0, window.errors, window.requests, 0.0)
    if window.errors <= 0:
        return best
    timed = sorted((cell for cell in _cells(window) if cell.start is not None and (cell.requests or cell.errors)),
                   key=lambda cell: cell.start or 0.0)
    if len(timed) < 2:
        return best
    lengths = sorted(cell.seconds for cell in timed)
    tolerance = lengths[len(lengths) // 2] / 2
    first = timed[0].start or 0.0
    # Suffix sums from each cell on: errors, requests, the three sums of squares, and the cells.
    sums: list[tuple[float, float, float, float, float, int]] = [(0.0, 0.0, 0.0, 0.0, 0.0, 0)]
    for cell in reversed(timed):
        e, r, ee, er, rr, n = sums[-1]
        sums.append((e + cell.errors, r + cell.requests, ee + cell.errors**2, er + cell.errors * cell.requests,
                     rr + cell.requests**2, n + 1))
    sums.reverse()
    total = (1.0 - ERROR_ONSET_SHARE) * whole
    strongest = total
    boundary = first
    rank = 0
    for index, cell in enumerate(timed):
        start = cell.start or 0.0
        if start <= boundary + tolerance:
            continue
        boundary, rank = start, rank + 1
        tail_errors, tail_requests, ee, er, rr, units = sums[index]
        if tail_errors <= 0 or units < 2:
            break  # no later tail has an error, or two cells to tell a lasting rate from one burst
        factor = _overdispersed(tail_errors, tail_requests, (ee, er, rr), units)
        weighted = ERROR_ONSET_SHARE / (rank * (rank + 1)) * _error_e_value(
            tail_errors / factor, tail_requests / factor, limit)
        total += weighted
        if weighted > strongest:
            strongest = weighted
            best = ErrorEvidence(0.0, tail_errors, tail_requests, start - first)
    p_value = 0.0 if math.isinf(total) else min(1.0, 1.0 / total) if total > 0 else 1.0
    return replace(best, p_value=p_value)


def wilson_bounds(hits: float, trials: float, confidence: float) -> tuple[float, float]:
    """The one-sided Wilson score bounds (lower, upper) of a proportion at `confidence`; (0, 1) without trials."""
    if trials <= 0:
        return 0.0, 1.0
    z = -_normal_quantile_low(1 - confidence)
    share = min(max(hits / trials, 0.0), 1.0)
    denominator = 1 + z * z / trials
    centre = (share + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def _normal_quantile_low(probability: float) -> float:
    """The standard normal quantile for a small probability (bisection on erfc: bounded, exact enough)."""
    low, high = -40.0, 40.0
    for _ in range(100):
        middle = (low + high) / 2
        if 0.5 * math.erfc(-middle / math.sqrt(2.0)) < probability:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def sequential_p(shortfall: float, variance: float, scale: float) -> float:
    """Always-valid one-sided p-value from a normal mixture SPRT (mSPRT).

    `shortfall`: how far the estimate lies on the bad side of the limit (negative: the good side);
    `variance`: its squared standard error; `scale`: the mixture's spread (a half-normal prior on the true
    shortfall). The mixture likelihood ratio is a martingale at the limit, so the chance that 1/ratio is ever
    below alpha, over any number of looks at a growing window, is at most alpha.
    """
    if not math.isfinite(shortfall) or not math.isfinite(variance):
        return 1.0
    if variance <= 0:
        return 0.0 if shortfall > 0 else 1.0
    total = variance + scale * scale
    log_ratio = (math.log(2.0) + 0.5 * math.log(variance / total)
                 + shortfall * shortfall * scale * scale / (2 * variance * total)
                 + _log_normal_cdf(shortfall * scale / math.sqrt(variance * total)))
    return 1.0 if log_ratio <= 0 else math.exp(-log_ratio)


def detectable(noise: float, scale: float) -> bool:
    """Whether the sequential test, at one look with standard error `noise`, would find a regression of the size
    it looks for (`scale` beyond the limit) significant."""
    return sequential_p(scale, noise * noise, scale) < SIGNIFICANCE


# One-sided Student t quantiles for 1-10 degrees of freedom, at the gates' SIGNIFICANCE (0.001) and at the 5%
# of the bench's fixed-sample calibration; past 10 the Cornish-Fisher expansion is within 1%.
_T_ONE_SIDED = {
    0.001: (318.31, 22.327, 10.215, 7.173, 5.893, 5.208, 4.785, 4.501, 4.297, 4.144),
    0.05: (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812),
}


@functools.cache
def _z_one_sided(level: float) -> float:
    return -_normal_quantile_low(level)


def _t_one_sided(level: float, freedom: int) -> float:
    table = _T_ONE_SIDED[level]
    if freedom <= len(table):
        return table[max(freedom, 1) - 1]
    z = _z_one_sided(level)
    return z + (z**3 + z) / (4 * freedom) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * freedom**2)


def few_units_penalty(canary: WindowStats, stable: WindowStats, level: float = SIGNIFICANCE) -> float:
    """What a significance test multiplies its variance by when the variance was estimated from few units.

    Standard errors come from the spread between cells (pods x intervals); one canary pod over four scrape
    intervals is four cells, and a variance estimated from four values is itself so uncertain that a normal
    test on it fails healthy canaries far more often than its level (a K change failed on acceptance after
    40 s, p=0.0007 from 4 cells). As a t test would, the variance is scaled by (t / z)^2 at the test's level
    with the smaller side's cells less one as degrees of freedom: at SIGNIFICANCE x10.9 from 4 cells, x1.8 from
    11, x1.2 from 31. Only the tests for failing take it; the benefit of the doubt (`Comparison.beyond_z`)
    does not need it."""
    units = min(_units_with_data(side) for side in (canary, stable))
    if units <= 1:
        return 1.0  # no spread measured: the per-request or per-draft floors alone size the variance
    return (_t_one_sided(level, units - 1) / _z_one_sided(level)) ** 2


def _ratio(pairs: Sequence[tuple[float, float]]) -> tuple[float | None, float | None]:
    """Ratio estimator sum(y) / sum(x) over independent units (y, x), and its cluster-robust variance
    (None with fewer than two units that carry data)."""
    total_x = math.fsum(x for _, x in pairs)
    if total_x <= 0:
        return None, None
    ratio = math.fsum(y for y, _ in pairs) / total_x
    used = [(y, x) for y, x in pairs if x > 0 or y > 0]
    if len(used) < 2:
        return ratio, None
    residuals = math.fsum((y - ratio * x) ** 2 for y, x in used)
    return ratio, len(used) / (len(used) - 1) * residuals / total_x**2


def _with_floor(estimated: float | None, floor: float) -> float:
    return floor if estimated is None else max(estimated, floor)


def _within_pods_log_variance(window: WindowStats, pair: Callable[[Cell], tuple[float, float] | None],
                              floor: float) -> float:
    """Variance of a side's log(sum y / sum x) over its cells' (y, x) from the intervals within each pod only, never
    below `floor`: the noise more requests shrink. How pods differ (one GPU faster than another) is left out, as
    no wait shrinks it; a pod seen over one cell measures nothing and leaves the floor to speak."""
    by_pod: dict[str, list[tuple[float, float]]] = {}
    for cell in _cells(window):
        values = pair(cell)
        if values is not None:
            by_pod.setdefault(cell.pod, []).append(values)
    total_y = math.fsum(y for pairs in by_pod.values() for y, _ in pairs)
    if total_y <= 0:
        return floor
    # Each pod's ratio-estimator variance times its own x squared is its residuals about its own ratio.
    squares = 0.0
    for pairs in by_pod.values():
        _, variance = _ratio(pairs)
        if variance is not None:
            squares += variance * math.fsum(x for _, x in pairs) ** 2
    variance = (math.sqrt(squares) / total_y) ** 2
    return max(variance, floor) if math.isfinite(variance) else floor


def _bucket_counts(buckets: Buckets) -> tuple[list[tuple[float, float]], float]:
    """Per-bucket (upper bound, count) from cumulative buckets, made monotone, and the total."""
    counts: list[tuple[float, float]] = []
    previous = 0.0
    for bound, cumulative in monotone_points(buckets):
        counts.append((bound, cumulative - previous))
        previous = cumulative
    return counts, previous


def rank_test_shifted(first: Buckets, second: Buckets) -> float | None:
    """Two-sided Mann-Whitney p-value of two histograms (rebinned onto shared bounds first). Valid for
    checking that both sides saw the same requests: each request's side is drawn at random by the split, so
    its rank among all requests is exchangeable whatever the requests have in common."""
    if not first or not second:
        return None
    merged = merge_histograms([first, second])
    bounds = [bound for bound, _ in merged]
    first_counts, n_1 = _bucket_counts(rebin(first, bounds))
    second_counts, n_2 = _bucket_counts(rebin(second, bounds))
    if n_1 < 1 or n_2 < 1:
        return None
    u = below = ties = 0.0
    for (_, a), (_, b) in zip(first_counts, second_counts, strict=True):
        u += a * (below + 0.5 * b)
        below += b
        ties += (a + b) ** 3 - (a + b)
    n = n_1 + n_2
    variance = n_1 * n_2 / 12.0 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return 1.0
    z = abs(u - n_1 * n_2 / 2.0) / math.sqrt(variance)
    return min(1.0, 2 * _normal_sf(max(0.0, z - 0.5 / math.sqrt(variance))))


def _cells(window: WindowStats) -> tuple[Cell, ...]:
    return window.cells


def _error_overdispersion(window: WindowStats) -> float:
    """How much more errors vary between pods and intervals than independent requests would (>= 1): bursts
    of errors count as fewer independent events."""
    share, variance = _ratio([(cell.errors, cell.requests) for cell in _cells(window)])
    if share is None or variance is None or window.requests <= 0:
        return 1.0
    return _dispersion_factor(share, variance, window.requests)


def _dispersion_factor(share: float, variance: float, requests: float) -> float:
    """A measured error share's variance over what independent requests would give it (>= 1)."""
    binomial = max(share * (1 - share), 1.0 / requests) / requests
    return max(1.0, variance / binomial)


def error_counts(window: WindowStats) -> tuple[float, float]:
    """(errors, requests) as independent events: divided by the overdispersion."""
    factor = _error_overdispersion(window)
    return window.errors / factor, window.requests / factor


def error_rate_bound(window: WindowStats) -> tuple[float, float]:
    """The (lower, upper) one-sided ERROR_PASS_CONFIDENCE bounds of a side's error rate."""
    errors, requests = error_counts(window)
    return wilson_bounds(errors, requests, ERROR_PASS_CONFIDENCE)


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


def _goodput_request_floor(window: WindowStats) -> float:
    """What independent requests with the TPOT histogram's spread give as the variance of log goodput."""
    measured = _log_spread(window.tpot_buckets)
    spread = max(measured if measured is not None else DEFAULT_LOG_SPREAD, MIN_LOG_SPREAD)
    return spread**2 / max(window.requests, 1.0)


def goodput_request_noise(canary: WindowStats, stable: WindowStats) -> float:
    """Variance of log(canary / stable goodput per sequence) from the requests and intervals within each pod."""
    return sum(_within_pods_log_variance(side, lambda cell: (cell.generation_tokens, cell.busy_seconds),
                                         _goodput_request_floor(side)) for side in (canary, stable))


def _goodput_sampling_variance(window: WindowStats) -> float:
    """Variance of a side's log goodput per sequence from the requests and intervals it saw: the spread between
    its cells (pods x intervals), never below what independent requests with the TPOT histogram's spread give."""
    floor = _goodput_request_floor(window)
    ratio, variance = _ratio([(cell.generation_tokens, cell.busy_seconds) for cell in _cells(window)])
    if ratio is None or ratio <= 0 or variance is None:
        return floor
    return max(variance / ratio**2, floor)


def _pod_log_goodputs(window: WindowStats) -> list[float]:
    per_pod: dict[str, list[float]] = {}
    for cell in window.cells:
        sums = per_pod.setdefault(cell.pod, [0.0, 0.0])
        sums[0] += cell.generation_tokens
        sums[1] += cell.busy_seconds
    return [math.log(tokens / busy) for tokens, busy in per_pod.values() if tokens > 0 and busy > 0]


def goodput_log_variances(canary: WindowStats, stable: WindowStats) -> tuple[float, float]:
    """Variance of log(canary / stable goodput per sequence), with POD_SPREAD assumed where too few pods measure
    their spread and without it (what the window measured). Each side's is what its pods say (the spread of
    their means over their count: a pod's hardware stays as fast or slow all window, so its intervals are
    not independent), never below what its requests and intervals say."""
    sides = [(_pod_log_goodputs(window), _goodput_sampling_variance(window)) for window in (canary, stable)]

    def total(prior: float) -> float:
        per_pod = _pod_variance([(values, sampling, prior) for values, sampling in sides])
        return sum(max(sampling, per_pod / max(len(values), 1)) for values, sampling in sides)

    return total(POD_SPREAD**2), total(0.0)


def _pod_variance(sides: Sequence[tuple[Sequence[float], float, float]]) -> float:
    """The variance of one pod's figure over a window, from each side's (per-pod figures, sampling variance of
    the side's figure, prior): the spread between the pods of each side, pooled over the sides, and never below
    what the prior says once moderated by the pods. A side's prior is POD_SPREAD on the figure's scale (how much
    pods of one revision differ); a pod's own requests and intervals add to it. One pod a side measures no
    spread at all, and two measure it from one degree of freedom, as often a tenth of the truth as twice it:
    the prior, worth POD_SPREAD_FREEDOM degrees of freedom, is what the comparison assumes until pods say
    otherwise, and only ever makes it more careful than the pods alone."""
    squares, freedom, assumed = 0.0, 0, []
    for values, sampling, prior in sides:
        if values:
            assumed.append(prior + sampling * len(values))
        if len(values) >= 2:
            mean = sum(values) / len(values)
            squares += sum((value - mean) ** 2 for value in values)
            freedom += len(values) - 1
    measured = squares / freedom if freedom else 0.0
    if not assumed:
        return measured
    moderated = (POD_SPREAD_FREEDOM * sum(assumed) / len(assumed) + squares) / (POD_SPREAD_FREEDOM + freedom)
    return max(measured, moderated)


def _pod_share_prior(window: WindowStats, threshold: float) -> float:
    """POD_SPREAD on the scale of a side's share of requests above `threshold`: a pod POD_SPREAD slower moves
    every request's TPOT by that factor, and the share above the threshold by the requests that lie within it
    (half the side's share between threshold / e^spread and threshold x e^spread), squared."""
    buckets = window.tpot_buckets
    total = histogram_total(buckets)
    if total <= 0:
        return 0.0
    spread = math.exp(POD_SPREAD)
    within = (count_at_or_below(buckets, threshold * spread) - count_at_or_below(buckets, threshold / spread)) / total
    return (within / 2) ** 2


def goodput_z(canary: WindowStats, stable: WindowStats) -> float | None:
    """log(canary / stable goodput per sequence) over its standard error: the fixed-sample statistic of
    equality, for calibration."""
    c, s = canary.goodput_per_sequence, stable.goodput_per_sequence
    if c is None or s is None:
        return None
    return math.log(c / s) / math.sqrt(goodput_log_variances(canary, stable)[0])


@dataclass(frozen=True)
class _Share:
    """One side's share of requests with TPOT above a threshold: over all its requests, its variance from the
    cells (pods x intervals, never below the binomial variance of that many requests), and per pod."""

    share: float
    variance: float
    per_pod: tuple[float, ...]


def _share_above(window: WindowStats, threshold: float, reading: Reading = CUBIC) -> _Share | None:
    """The window's share of requests above `threshold`, read between bounds as `reading` says; its variance from
    the cells, always read by the cubic: the power law counts half a request above an empty bound, a
    twentieth of a ten-request cell, which would be read as spread between cells."""
    total = histogram_total(window.tpot_buckets)
    if total <= 0:
        return None
    share = (total - count_at_or_below(window.tpot_buckets, threshold, reading)) / total
    floor = max(share * (1 - share), 0.25 / total) / total
    pairs = []
    per_pod: dict[str, list[float]] = {}
    for cell in _cells(window):
        if cell.tpot_buckets:
            cell_total = histogram_total(cell.tpot_buckets)
            above = cell_total - count_at_or_below(cell.tpot_buckets, threshold)
            pairs.append((above, cell_total))
            sums = per_pod.setdefault(cell.pod, [0.0, 0.0])
            sums[0] += above
            sums[1] += cell_total
    _, variance = _ratio(pairs)
    shares = tuple(above / requests for above, requests in per_pod.values() if requests > 0)
    return _Share(share, _with_floor(variance, floor), shares)


def _pod_floored_variance(side: _Share, pods: float) -> float:
    """A side's share variance, never below the spread between its revision's pods (`pods`, per pod) over its
    pods: a pod's hardware keeps it as fast or slow all window, so its intervals are not independent."""
    return max(side.variance, pods / max(len(side.per_pod), 1))


@dataclass(frozen=True)
class TailShortfall:
    """The canary's share of requests slower than a multiple of the stable's quantile, minus the stable's share
    above that quantile (`excess`), with three variances. `variance` is floored by the spread between the
    revisions' pods, assumed (POD_SPREAD) where too few pods measure it: which pods a side drew stays with it
    all window, so a canary is only failed on a difference larger than that. `measured_variance` is floored
    only by the spread the pods show: it sizes the benefit of the doubt, which an assumed spread is no
    evidence for (one pod a side would pass a 20% slower canary whose pod drew 4% faster).
    `sampling_variance` counts only the requests and intervals seen (pod x interval cells, never below the
    binomial): it shrinks as requests come, and says whether a tail is known yet. Pods whose tails genuinely
    differ (a hot pod) would otherwise keep a p99 unknown however long the step ran."""

    excess: float
    variance: float
    measured_variance: float
    sampling_variance: float


def tail_shortfall(canary: WindowStats, stable: WindowStats, quantile: float, limit: float,
                   stable_reading: Reading = CUBIC, canary_reading: Reading = CUBIC) -> TailShortfall | None:
    """The share of canary requests slower than `limit` x the stable's quantile, minus the stable's share above
    that quantile. At most 0 when the canary's quantile is within `limit` x the stable's, whatever the shapes:
    the quantile comparison as a comparison of shares, with standard errors from pods and intervals (each
    side's never below the spread between its revision's pods over its pods, as for goodput). Works across
    bucket layouts (each side interpolates its own). The readings: how each side's counts are read between
    bounds (histogram.py)."""
    q = quantile_of(quantile, stable.tpot_buckets, stable_reading)
    if q is None or q <= 0:
        return None
    canary_share = _share_above(canary, limit * q, canary_reading)
    stable_share = _share_above(stable, q, stable_reading)
    if canary_share is None or stable_share is None:
        return None
    # A pod's speed moves the canary's share above limit x q whichever side it serves: the canary's requests
    # directly, the stable's through q.
    prior = _pod_share_prior(canary, limit * q)
    sides = (canary_share, stable_share)
    pods = _pod_variance([(side.per_pod, side.variance, prior) for side in sides])
    measured = _pod_variance([(side.per_pod, side.variance, 0.0) for side in sides])
    # The stable has 1 - quantile of its requests above its quantile by definition; its share read back from
    # the counts says the same except where the quantile is read at a bound (the power law's with an empty
    # bucket above it: none there). Its variance still comes from the cells.
    return TailShortfall(
        excess=canary_share.share - (1 - quantile),
        variance=sum(_pod_floored_variance(side, pods) for side in sides),
        measured_variance=sum(_pod_floored_variance(side, measured) for side in sides),
        sampling_variance=canary_share.variance + stable_share.variance,
    )


# The stable's share of requests above its own p90: what the 100% step compares the canary's share with.
P90_TAIL_SHARE = 0.10
# The most decode work per pod (generated tokens per pod-second), relative to the stable's when its p90 was
# recorded, under which the 100% step still compares TPOT with that p90: an engine step grows with its batch, and
# the batch with the requests' rate times their output lengths, so more work per pod makes every revision slower.
# The same tolerance as lengths (LENGTH_TOLERANCE): beyond it the traffic is not the same.
REFERENCE_LOAD_TOLERANCE = 1.25


def load_beyond_reference(canary: WindowStats, reference_load: float | None) -> float | None:
    """The canary's generated tokens per pod-second as a multiple of the reference's, when beyond
    REFERENCE_LOAD_TOLERANCE; None when the two are comparable or either is unknown. Tokens, not requests:
    twice the requests at half the output length keep the batch, and the same requests at twice the length
    double it. Only more work excuses a slower p90: under less a slower canary is all the more its own (and
    under closed-loop clients a slower canary generates fewer tokens per second, so a lower reading is no excuse
    either)."""
    load = canary.tokens_per_pod_second
    if not load or not reference_load or reference_load <= 0:
        return None
    ratio = load / reference_load
    return ratio if ratio > REFERENCE_LOAD_TOLERANCE else None


def tpot_against_reference(canary: WindowStats, reference_ms: float, reference_requests: int | None,
                           limit: float) -> Comparison | None:
    """The 100% step's TPOT p90, where the stable serves nothing: the canary against the stable's p90 recorded
    at the previous step, by the rules every other step's p90 follows (`tail_shortfall`, `Comparison`). The
    canary's share of requests slower than `limit` x that p90 is compared with the 10% the stable had above
    it; its variance adds the reference's own sampling noise (a binomial share over the `reference_requests`
    it was read from; 0 when unknown), and an estimate beyond the limit by less than the noise of one look
    passes. None without a canary p90."""
    p90 = canary.tpot_ms(0.9)
    threshold = limit * reference_ms / 1000.0
    share = _share_above(canary, threshold)
    if p90 is None or share is None or reference_ms <= 0:
        return None
    # No pod prior: every pod of the pool serves the canary here, against a figure the stable recorded, and
    # a canary whose requests all lie in the bucket that holds the limit would be held for a slowness it has
    # (pods are compared side by side, with the prior, in the steps before).
    variance = _pod_floored_variance(share, _pod_variance([(share.per_pod, share.variance, 0.0)]))
    if reference_requests:
        variance += P90_TAIL_SHARE * (1 - P90_TAIL_SHARE) / reference_requests
    excess = share.share - P90_TAIL_SHARE
    p_value = sequential_p(excess, variance * few_units_penalty(canary, canary), P90_SHARE_SCALE)
    beyond = excess / math.sqrt(variance) if variance > 0 else None
    return Comparison("TPOT p90", p90, reference_ms, limit, False, " ms", 1, p_value, beyond_z=beyond)


def _layout(buckets: Buckets) -> frozenset[float]:
    return frozenset(bound for bound, _ in buckets)


def shared_tpot_layout(canary: WindowStats, stable: WindowStats) -> tuple[WindowStats, WindowStats]:
    """Both sides' TPOT histograms (cells included) on the bucket bounds both layouts have, where they differ
    (another vLLM version): counts at shared bounds are exact on both sides, so neither is judged on where
    interpolation inside a wide bucket puts its requests. Fewer than two shared finite bounds: as they are
    (each side interpolates its own)."""
    layouts = {_layout(window.tpot_buckets) for window in (canary, stable) if window.tpot_buckets}
    layouts |= {_layout(cell.tpot_buckets) for window in (canary, stable) for cell in window.cells
                if cell.tpot_buckets}
    if len(layouts) <= 1:
        return canary, stable
    shared = frozenset.intersection(*layouts)
    if len([bound for bound in shared if math.isfinite(bound)]) < 2:
        return canary, stable
    bounds = sorted(shared | {math.inf})

    def on_shared(window: WindowStats) -> WindowStats:
        cells = tuple(replace(cell, tpot_buckets=rebin(cell.tpot_buckets, bounds)) if cell.tpot_buckets else cell
                      for cell in window.cells)
        return replace(window, tpot_buckets=rebin(window.tpot_buckets, bounds) if window.tpot_buckets else (),
                       cells=cells)

    return on_shared(canary), on_shared(stable)


def _units_with_data(window: WindowStats) -> int:
    return sum(1 for cell in window.cells if cell.requests > 0 or cell.drafts > 0)


def draft_trials(window: WindowStats) -> float:
    """How many independent trials a side's drafts count as in a floor. The drafts of one request share its
    content, so they are not independent: the spread between cells (pods x intervals) measures what they are
    worth, and the per-draft binomial is only a floor under it. With one cell there is no spread to measure,
    and the drafts count as the requests they came from (as if each request's drafts all agreed): a healthy
    canary scraped every 30 s, one pod a side, failed on acceptance from its first interval's 2,900 drafts of
    40 requests (p=2e-10 for a ratio of 0.71; the bench's requests differ that much)."""
    if _units_with_data(window) >= 2:
        return window.drafts
    return min(window.drafts, max(window.requests, 1.0))


def _proportion_log_floor(share: float, trials: float) -> float:
    """The variance of log(a proportion of drafts) that a binomial over `trials` gives."""
    return (1 - share) / max(share * trials, 1e-12) if share > 0 else math.inf


def _acceptance_log_variance(window: WindowStats, pairs: list[tuple[float, float]], share: float,
                             trials: float) -> float:
    """Variance of log(a proportion of drafts) from pods and intervals; a binomial over `trials` as a floor."""
    floor = _proportion_log_floor(share, trials)
    ratio, variance = _ratio(pairs)
    if ratio is None or ratio <= 0 or variance is None:
        return floor
    return max(variance / ratio**2, floor)


def _error_text(canary: WindowStats, thresholds: CanaryAnalysis) -> str:
    return (
        f"canary error rate {canary.error_rate or 0.0:.2%} ({canary.errors:.0f} of {canary.requests:.0f} requests) "
        f"> {thresholds.max_error_rate:.2%}"
    )


def _immediate_failures(canary: WindowStats, thresholds: CanaryAnalysis) -> list[tuple[str, str]]:
    """Engine-health failures and a proven error rate: each alone fails the canary, whatever the sample size
    or the load (an error rate needs no baseline)."""
    failures: list[tuple[str, str]] = []
    if canary.health_failures > 0:
        failures.append(("HealthCheckFailed", f"canary /health failed {canary.health_failures} times"))
    if canary.restarts > 0:
        failures.append(("ContainerRestarts", f"canary containers restarted {canary.restarts} times"))
    if canary.errors > 0 and thresholds.max_error_rate <= 0:
        failures.append(("ErrorRateExceeded", _error_text(canary, thresholds)))
    elif canary.errors > 0:
        evidence = error_p(canary, thresholds.max_error_rate)
        if evidence.p_value < ERROR_SIGNIFICANCE:
            onset = ""
            if evidence.since_s > 0:
                onset = (f"; {evidence.errors:.0f} of {evidence.requests:.0f} requests from {evidence.since_s:.0f} s"
                         " into the window on")
            failures.append(("ErrorRateExceeded",
                             f"{_error_text(canary, thresholds)} (p={evidence.p_value:.2g}{onset})"))
    return failures


def _limit_log(limit: float) -> float | None:
    return math.log(limit) if limit > 0 and math.isfinite(limit) else None


def _goodput(canary: WindowStats, stable: WindowStats, thresholds: CanaryAnalysis,
             change: KChange | None) -> Comparison | str:
    c, s = canary.goodput_per_sequence, stable.goodput_per_sequence
    if c is None:
        return "no goodput per sequence measured on the canary"
    if s is None:
        return "no goodput per sequence measured on the stable revision"
    # A K change must deliver what the tuner predicted, within the tolerance; a loss it did not predict
    # is never expected. But the limit stops at the stable's own goodput: a change that gains less than
    # an optimistic prediction still gains (the tuner measures the new K once it serves), and rolling it
    # back would give up a real improvement. A prediction is most optimistic exactly where the tuner has
    # measured least, so the limit must not grow with it.
    expected = 1.0 + max(change.predicted_gain, 0.0) if change is not None else 1.0
    limit = thresholds.min_tokens_per_second_ratio * expected
    if change is not None:
        limit = min(limit, max(thresholds.min_tokens_per_second_ratio, 1.0))
    metric = "goodput per sequence" if change is None else f"goodput per sequence (tuner predicted {expected:.2f}x)"
    log_limit = _limit_log(limit)
    p_value = None
    if log_limit is not None:
        variance, measured = goodput_log_variances(canary, stable)
        p_value = sequential_p(log_limit - math.log(c / s), variance * few_units_penalty(canary, stable),
                               LOG_RATIO_SCALE)
        # The benefit of the doubt counts only the spread the window shows, not the assumed one (TailShortfall).
        beyond = (log_limit - math.log(c / s)) / math.sqrt(measured) if measured > 0 else None
        return Comparison(metric, c, s, limit, True, " tok/s", 1, p_value, beyond_z=beyond,
                          noise=math.sqrt(goodput_request_noise(canary, stable)), scale=LOG_RATIO_SCALE)
    return Comparison(metric, c, s, limit, True, " tok/s", 1, p_value)


def tpot_comparison(canary: WindowStats, stable: WindowStats, quantile: float, limit: float,
                    scale: float) -> Comparison | str:
    label = f"TPOT p{round(quantile * 100)}"
    c, s = canary.tpot_ms(quantile), stable.tpot_ms(quantile)
    if c is None:
        return f"no {label} measured on the canary"
    if s is None or s <= 0:
        return f"no {label} measured on the stable revision"
    tail = tail_shortfall(canary, stable, quantile, limit)
    p_value = None if tail is None else sequential_p(
        tail.excess, tail.variance * few_units_penalty(canary, stable), scale)
    beyond = tail.excess / math.sqrt(tail.measured_variance) if tail is not None and tail.measured_variance > 0 \
        else None
    bound = None
    if quantile >= 0.99:
        # Known from the requests seen: the pods' spread sizes the failing test, not the wait for requests. And
        # known however each side's counts are read between bounds: a stable p99 at the low end of a bucket up
        # to 2.5x wide is read long by the cubic, and a canary's stalled requests short by the power law, each
        # enough to read a tripled p99 within a limit of 2 (histogram.py).
        readings = [tail] + [tail_shortfall(canary, stable, quantile, limit, stable_reading, canary_reading)
                             for stable_reading, canary_reading in READING_PAIRS]
        bound = max(item.excess + TAIL_PASS_Z * math.sqrt(item.sampling_variance) if item is not None else 1.0
                    for item in readings)
        estimate = max(item.excess if item is not None else 1.0 for item in readings)
        return Comparison(label, c, s, limit, False, " ms", 1, p_value, bound, beyond, estimate)
    return Comparison(label, c, s, limit, False, " ms", 1, p_value, beyond_z=beyond)


def composition_factors(canary: WindowStats, stable: WindowStats) -> tuple[float, ...]:
    """Per position both sides draft: the canary's acceptance over the stable's that the SAME requests give at
    the two Ks (1 at equal K). A rate per position is a mean over drafts, and a request takes one draft per
    step: one that accepts little takes more steps per token, and how many more depends on K. At a higher K
    the drafts of well-accepted requests fall more than those of the others, so the same requests show a
    lower rate at every position, by as much as their acceptance differs: 4% at position 3 for K 3 -> 4 on
    requests spread as Beta(3.7, 2.3), 12% on half code at 0.95 and half chat at 0.3, 27% for K 3 -> 6 there
    (Simpson's paradox, tuner/composition.py). Read from the side drafting more positions, which shows more of
    how requests differ."""
    shared = min(canary.k, stable.k)
    if canary.k == stable.k or shared <= 0:
        return (1.0,) * max(shared, 0)
    reference = canary if canary.k > stable.k else stable
    measured = [reference.position_acceptance(position) for position in range(min(reference.k, FITTED_POSITIONS))]
    rates = [rate for rate in measured if rate is not None]
    if len(rates) < len(measured):
        return (1.0,) * shared
    mix = acceptance_mix(rates)
    canary_rates = rates_at(mix, reference.k, canary.k, shared)
    stable_rates = rates_at(mix, reference.k, stable.k, shared)
    return tuple(c / s if s > 0 else 1.0 for c, s in zip(canary_rates, stable_rates, strict=True))


def _acceptance(canary: WindowStats, stable: WindowStats, thresholds: CanaryAnalysis) -> list[Comparison | str]:
    """Acceptance per draft position, on the positions both sides draft: a K change must not move what a
    request accepts. At different K the stable's rate is re-weighted to the canary's K for the same requests
    (`composition_factors`): the rates themselves move with K."""
    shared = min(canary.k, stable.k)
    if shared <= 0:
        return []
    if min(canary.drafts, stable.drafts) < thresholds.min_drafts:
        return [f"{min(canary.drafts, stable.drafts):.0f} drafts on the smaller side; acceptance needs "
                f"{thresholds.min_drafts} each"]
    limit = thresholds.min_accepted_length_ratio
    log_limit = _limit_log(limit)
    if len(canary.accepted_per_position) < shared or len(stable.accepted_per_position) < shared:
        # A vLLM without per-position counters: accepted length, when both sides draft the same K. At
        # different K there is nothing like for like; goodput (against the tuner's prediction) still gates.
        if canary.k != stable.k:
            return []
        c, s = canary.mean_accepted_length, stable.mean_accepted_length
        if c is None or s is None:
            return ["no accepted length measured"]
        p_value = None
        if log_limit is not None:
            # Failing counts the drafts as they are worth (`draft_trials`); the benefit of the doubt counts every
            # draft, so that neither is granted on a spread nobody measured.
            variance = sum(_accepted_length_log_variance(side, draft_trials(side)) for side in (canary, stable))
            doubt = sum(_accepted_length_log_variance(side, side.drafts) for side in (canary, stable))
            p_value = sequential_p(log_limit - math.log(c / s), variance * few_units_penalty(canary, stable),
                                   LOG_RATIO_SCALE)
            beyond = (log_limit - math.log(c / s)) / math.sqrt(doubt) if doubt > 0 else None
            return [Comparison("accepted length", c, s, limit, True, p_value=p_value, beyond_z=beyond,
                               noise=math.sqrt(sum(_accepted_length_request_noise(side) for side in (canary, stable))),
                               scale=LOG_RATIO_SCALE)]
        return [Comparison("accepted length", c, s, limit, True, p_value=p_value)]
    found: list[Comparison | str] = []
    penalty = few_units_penalty(canary, stable)
    factors = composition_factors(canary, stable)
    for position in range(shared):
        c, measured = canary.position_acceptance(position), stable.position_acceptance(position)
        if c is None or measured is None:
            return [f"no acceptance measured at draft position {position + 1}"]
        if measured <= 0:
            continue
        s = measured * factors[position]  # the stable's requests at the canary's K
        p_value = beyond = noise = None
        if log_limit is not None:
            if c <= 0:
                # No draft accepted here: no log ratio and no spread between cells to measure. The chance of
                # none in n drafts at the limit's rate is (1 - limit x s)^n; drafts of one request are not
                # independent, so n counts them as few cells do (few_units_penalty). Whichever look first sees
                # it this small, every earlier look saw none as well: the chance holds over every look. A rate
                # of 1% at the stable gave p=0 from 11 requests here and rolled back a K change on the engine.
                p_value = min(1.0, shared * (1 - min(1.0, limit * s)) ** (draft_trials(canary) / penalty))
                none_at_limit = (1 - min(1.0, limit * s)) ** (canary.drafts / penalty)
                beyond = -_normal_quantile_low(max(none_at_limit, 1e-300))
            else:
                # Failing counts the drafts as they are worth (`draft_trials`); the benefit of the doubt counts
                # every draft, so that neither is granted on a spread nobody measured.
                sides = ((canary, c), (stable, measured))
                variance = _position_log_variance(sides, position, draft_trials)
                doubt = _position_log_variance(sides, position, lambda side: side.drafts)
                # Bonferroni across positions: the positions together keep the gate's level.
                p_value = min(1.0, shared * sequential_p(log_limit - math.log(c / s),
                                                         variance * penalty,
                                                         LOG_RATIO_SCALE))
                beyond = (log_limit - math.log(c / s)) / math.sqrt(doubt) if doubt > 0 else None
                noise = math.sqrt(sum(_position_request_noise(side, share, position) for side, share in sides))
        metric = f"acceptance at position {position + 1}"
        if canary.k != stable.k:
            metric += f" (stable {measured:.2f} at K {stable.k}, re-weighted to K {canary.k})"
        found.append(Comparison(metric, c, s, limit, True, p_value=p_value, beyond_z=beyond, noise=noise,
                                scale=LOG_RATIO_SCALE))
    return found


def _position_log_variance(sides: Sequence[tuple[WindowStats, float]], position: int,
                           trials: Callable[[WindowStats], float]) -> float:
    """Variance of the log ratio of acceptance at a draft position: each side's (window, acceptance), its
    drafts counted as `trials` in the floor."""
    return sum(
        _acceptance_log_variance(
            side, [(cell.accepted_per_position[position], cell.drafts) for cell in _cells(side)
                   if len(cell.accepted_per_position) > position], share, trials(side))
        for side, share in sides)


def _position_request_noise(window: WindowStats, share: float, position: int) -> float:
    """Variance of log(acceptance at a draft position) from the intervals within each pod; every draft counted
    in the binomial floor."""
    return _within_pods_log_variance(
        window, lambda cell: (cell.accepted_per_position[position], cell.drafts)
        if len(cell.accepted_per_position) > position else None, _proportion_log_floor(share, window.drafts))


def _accepted_length_floor(window: WindowStats, trials: float) -> float:
    """The variance of accepted length that a per-draft spread over `trials` gives (not yet on the log scale)."""
    per_draft = window.accepted_tokens / window.drafts if window.drafts > 0 else 0.0
    return max(per_draft * max(window.k - per_draft, 0.0) / max(window.k, 1), 0.05) / max(trials, 1.0)


def _accepted_length_request_noise(window: WindowStats) -> float:
    """Variance of log accepted length from the intervals within each pod; every draft counted in the floor."""
    length = window.mean_accepted_length or 1.0
    return _within_pods_log_variance(window, lambda cell: (cell.accepted_tokens, cell.drafts),
                                     _accepted_length_floor(window, window.drafts) / length**2)


def _accepted_length_log_variance(window: WindowStats, trials: float) -> float:
    """Variance of log accepted length from pods and intervals; a per-draft spread over `trials` as a floor."""
    length = window.mean_accepted_length or 1.0
    floor = _accepted_length_floor(window, trials)
    ratio, variance = _ratio([(cell.accepted_tokens, cell.drafts) for cell in _cells(window)])
    return _with_floor(variance, floor) / length**2 if ratio is not None else floor / length**2


def load_z(canary: WindowStats, stable: WindowStats) -> tuple[float, float] | None:
    """(canary / stable requests per pod-second, z of its log): Poisson per side, or the spread between pods
    and intervals where larger."""
    c, s = canary.requests_per_pod_second, stable.requests_per_pod_second
    if not c or not s:
        return None

    def variance(window: WindowStats, rate: float) -> float:
        _, estimated = _ratio([(cell.requests, cell.seconds) for cell in _cells(window)])
        return _with_floor(None if estimated is None else estimated / rate**2, 1.0 / max(window.requests, 1.0))

    return c / s, math.log(c / s) / math.sqrt(variance(canary, c) + variance(stable, s))


def _span(window: WindowStats) -> float:
    """Seconds the side was observed: the time at least one of its pods was. All its pods left out for a while
    (scrapes failing, counters reset by a restart, /metrics excluded) shorten it; a pod replaced by another, or
    two pods overlapping for a moment, do not. Without interval starts: its pod-seconds per pod."""
    intervals = sorted((cell.start, cell.start + cell.seconds) for cell in window.cells
                       if cell.start is not None and cell.seconds > 0)
    if not intervals or len(intervals) != len(window.cells):
        return window.seconds / window.pods if window.pods > 0 else window.seconds
    covered, (begin, end) = 0.0, intervals[0]
    for start, stop in intervals[1:]:
        if start > end:
            covered, begin = covered + end - begin, start
        end = max(end, stop)
    return covered + end - begin


def counted_share(canary: WindowStats, stable: WindowStats, expected_share: float) -> float:
    """The canary's share of the *counted* requests that the weights promise: the route splits requests by
    weight at every moment, but each side's requests are counted only over the seconds it was observed,
    so the weights apply per observed second (with every pod observed throughout, this is the weight). Without
    per-pod cells the spans are unknown and the weight stands."""
    if not canary.cells or not stable.cells or canary.seconds <= 0 or stable.seconds <= 0:
        return expected_share
    canary_counted, stable_counted = expected_share * _span(canary), (1 - expected_share) * _span(stable)
    return canary_counted / (canary_counted + stable_counted)


def traffic_mismatches(canary: WindowStats, stable: WindowStats, expected_share: float | None) -> list[str]:
    """Why the two sides did not see the same traffic, if they did not: per-pod offered load, the request
    shares against the weights (sample-ratio mismatch), prompt and output lengths. Each needs a difference
    beyond its tolerance AND significant, so noise alone holds no step."""
    found: list[str] = []
    # Per-pod load is not gated here: equal offered load comes by construction (reconcile/rollout.py routes by
    # the replica split), and what vLLM counts is *finished* requests per pod-second, which also moves with a
    # side's speed under closed-loop clients: a slower canary finishes fewer requests and a faster K change more
    # (seen in e2e at ratios 0.44 and 1.30), so a gate on it held real regressions and real gains until they
    # timed out. Both sides' loads are still recorded in every verdict (`canary_load`, `stable_load`).
    total = canary.requests + stable.requests
    if expected_share is not None and 0 < expected_share < 1 and total > 0:
        share = canary.requests / total
        counted = counted_share(canary, stable, expected_share)
        z = (share - counted) / math.sqrt(counted * (1 - counted) / total)
        if abs(share / counted - 1) > SHARE_TOLERANCE and 2 * _normal_sf(abs(z)) < MIX_SIGNIFICANCE:
            observed = "" if math.isclose(counted, expected_share) else (
                f", {counted:.1%} of what was counted over the {_span(canary):.0f} s and {_span(stable):.0f} s each "
                f"side's pods were observed")
            found.append(f"sample-ratio mismatch: the canary served {share:.1%} of the requests, its weight says "
                         f"{expected_share:.1%}{observed}")
    for name, c_hist, s_hist in (("prompt", canary.prompt_buckets, stable.prompt_buckets),
                                 ("output", canary.output_buckets, stable.output_buckets)):
        p_value = rank_test_shifted(c_hist, s_hist)
        c_median, s_median = quantile_of(0.5, c_hist), quantile_of(0.5, s_hist)
        if p_value is None or not c_median or not s_median:
            continue
        if abs(math.log(c_median / s_median)) > math.log(LENGTH_TOLERANCE) and p_value < MIX_SIGNIFICANCE:
            found.append(f"{name} lengths differ: median {c_median:.0f} vs {s_median:.0f} tokens (p={p_value:.2g})")
    return found


def _context(canary: WindowStats, stable: WindowStats) -> list[str]:
    """Ungated figures that help a reader judge the verdict."""
    notes: list[str] = []
    if canary.mean_accepted_length is not None and stable.mean_accepted_length is not None:
        notes.append(f"accepted length {canary.mean_accepted_length:.2f} vs stable {stable.mean_accepted_length:.2f}")
    canary_p50, stable_p50 = canary.tpot_ms(0.5), stable.tpot_ms(0.5)
    if canary_p50 is not None and stable_p50 is not None:
        notes.append(f"TPOT p50 {canary_p50:.1f} ms vs stable {stable_p50:.1f} ms")
    canary_batch, stable_batch = canary.load_per_pod, stable.load_per_pod
    if canary_batch is not None and stable_batch is not None:
        notes.append(f"batch {canary_batch:.1f} vs {stable_batch:.1f} running requests per pod")
    c_tps, s_tps = canary.tokens_per_second_per_gpu, stable.tokens_per_second_per_gpu
    if c_tps is not None and s_tps is not None:
        notes.append(f"tokens/s per GPU {c_tps:.1f} vs {s_tps:.1f} (follows load; not gated)")
    notes.append(f"K {canary.k} vs {stable.k}")
    return notes


def _samples(canary: WindowStats, stable: WindowStats | None) -> str:
    seconds = max(canary.seconds, stable.seconds) if stable is not None else canary.seconds
    c_load = canary.requests_per_pod_second or 0.0
    if stable is None:
        return f"{canary.requests:.0f} canary requests over {seconds:.0f} pod-s ({c_load:.2f} requests/s per pod)"
    s_load = stable.requests_per_pod_second or 0.0
    return (f"{canary.requests:.0f} canary and {stable.requests:.0f} stable requests over {seconds:.0f} pod-s; "
            f"load {c_load:.2f} vs {s_load:.2f} requests/s per pod")


def _verdict(outcome: Outcome, reason: str, message: str, canary: WindowStats, stable: WindowStats | None,
             comparisons: tuple[Comparison, ...] = ()) -> Verdict:
    return Verdict(outcome, reason, message, comparisons, canary_requests=round(canary.requests),
                   stable_requests=round(stable.requests) if stable is not None else 0,
                   canary_load=canary.requests_per_pod_second,
                   stable_load=stable.requests_per_pod_second if stable is not None else None,
                   stable_tokens_per_pod_second=stable.tokens_per_pod_second if stable is not None else None,
                   error_rate_bound=error_rate_bound(canary)[1] if canary.requests > 0 else None,
                   canary_errors=round(canary.errors), canary_pods=canary.pods)


def _error_pass(canary: WindowStats, stable: WindowStats | None, thresholds: CanaryAnalysis) -> str | None:
    """None when the error rate is shown to be within the limit: its upper confidence bound below
    `maxErrorRate`, or below the stable's lower bound (the canary significantly better than a stable that is
    itself above the limit). Otherwise why not."""
    if thresholds.max_error_rate <= 0:
        # No error tolerated: any error fails at once (above); none is within the limit.
        return None if canary.errors <= 0 else "canary errors with none tolerated"
    _, upper = error_rate_bound(canary)
    if upper < thresholds.max_error_rate:
        return None
    if stable is not None and stable.requests > 0 and upper < error_rate_bound(stable)[0]:
        return None
    return (f"canary error rate {canary.error_rate or 0.0:.2%} ({canary.errors:.0f} of {canary.requests:.0f}), "
            f"{ERROR_PASS_CONFIDENCE:.0%} upper bound {upper:.2%} not below {thresholds.max_error_rate:.2%} yet")


def analyse(
    canary: WindowStats,
    stable: WindowStats | None,
    thresholds: CanaryAnalysis,
    change: KChange | None = None,
    *,
    expected_share: float | None = None,
) -> Verdict:
    """Judge the canary against the stable revision over the same window.

    `stable` None: no stable replica serves during this step (the 100% step, or a one-replica pool whose
    canary took its only replica in place); the canary is then judged on what needs no baseline: health,
    restarts and the error rate (its upper bound below the limit) over at least `minRequests` finished requests.
    `change`: the tuner's K change under test, if that is all the canary changes.
    `expected_share`: the canary's expected share of both sides' requests (its weight), for the
    sample-ratio check; None where the split is not known.
    """
    early = _unjudgeable(canary, stable, thresholds, expected_share)
    if early is not None:
        return early
    errors_uncertain = _error_pass(canary, stable, thresholds)
    if stable is None:
        return _judged_without_baseline(canary, thresholds, errors_uncertain)
    return _judged_against_stable(canary, stable, thresholds, change, errors_uncertain)


def _unjudgeable(
    canary: WindowStats, stable: WindowStats | None, thresholds: CanaryAnalysis, expected_share: float | None
) -> Verdict | None:
    """The verdict reached before any comparison: an immediate failure (health, restarts, errors with none
    tolerated), too few finished requests, or the two sides served different traffic. None: judge on."""
    failures = _immediate_failures(canary, thresholds)
    if failures:
        return _verdict("Fail", failures[0][0], "; ".join([*(text for _, text in failures), _samples(canary, stable)]),
                        canary, stable)

    fewest = min(canary.requests, stable.requests) if stable is not None else canary.requests
    if fewest <= 0 or fewest < thresholds.min_requests:
        return _verdict("Inconclusive", "InsufficientSamples",
                        f"{_samples(canary, stable)}; need {thresholds.min_requests} finished requests each",
                        canary, stable)

    if stable is not None:
        mismatches = traffic_mismatches(canary, stable, expected_share)
        if mismatches:
            # Nothing measured on different traffic is evidence about the revision: hold, never fail.
            return _verdict("Inconclusive", "TrafficMismatch", "; ".join([*mismatches, _samples(canary, stable)]),
                            canary, stable)
    return None


def _judged_without_baseline(canary: WindowStats, thresholds: CanaryAnalysis, errors_uncertain: str | None) -> Verdict:
    """No stable replica serves in this step: health, restarts and the error rate decide."""
    if errors_uncertain is not None:
        return _verdict("Inconclusive", "ErrorRateUncertain", f"{errors_uncertain}; {_samples(canary, None)}",
                        canary, None)
    return _verdict("Pass", "NoBaselineHealthy",
                    f"no stable replica serves in this step: judged on health, restarts and errors; error rate "
                    f"{canary.error_rate or 0.0:.2%}, {ERROR_PASS_CONFIDENCE:.0%} upper bound "
                    f"{error_rate_bound(canary)[1]:.2%} < {thresholds.max_error_rate:.2%}; "
                    f"{_samples(canary, None)}", canary, None)


def _comparisons(
    canary: WindowStats, stable: WindowStats, thresholds: CanaryAnalysis, change: KChange | None
) -> tuple[tuple[Comparison, ...], list[str]]:
    """Each gate's comparison of the canary with the stable revision, and the gates that could not be measured."""
    candidates: list[Comparison | str] = [*_acceptance(canary, stable, thresholds),
                                          _goodput(canary, stable, thresholds, change)]
    if canary.tpot_buckets or stable.tpot_buckets:
        canary_tpot, stable_tpot = shared_tpot_layout(canary, stable)
        candidates.append(tpot_comparison(canary_tpot, stable_tpot, 0.9, thresholds.max_tpot_ratio,
                                          P90_SHARE_SCALE))
        candidates.append(tpot_comparison(canary_tpot, stable_tpot, 0.99, thresholds.max_tpot_p99_ratio,
                                          P99_SHARE_SCALE))
    comparisons = tuple(item for item in candidates if isinstance(item, Comparison))
    missing = [item for item in candidates if isinstance(item, str)]
    return comparisons, missing


def _judged_against_stable(
    canary: WindowStats,
    stable: WindowStats,
    thresholds: CanaryAnalysis,
    change: KChange | None,
    errors_uncertain: str | None,
) -> Verdict:
    """The gates' comparisons decide: any failed fails; any missing or uncertain (or the error rate) holds."""
    comparisons, missing = _comparisons(canary, stable, thresholds, change)
    # Failed checks lead the message so the reason reads first in `kubectl describe` and Events.
    ordered = sorted(comparisons, key=lambda item: (not item.failed, not item.uncertain))
    notes = [*(item.describe() for item in ordered), *missing]
    if errors_uncertain is not None:
        notes.append(errors_uncertain)
    message = "; ".join([*notes, *_context(canary, stable), _samples(canary, stable)])
    if any(item.failed for item in comparisons):
        failed = next(item for item in ordered if item.failed)
        reason = "TPOTExceeded" if failed.metric.startswith("TPOT") else (
            "AcceptanceDropped" if failed.metric.startswith("accept") else "GoodputBelowExpected")
        return _verdict("Fail", reason, message, canary, stable, comparisons)
    if missing:
        return _verdict("Inconclusive", "MissingMeasurements", message, canary, stable, comparisons)
    if any(item.uncertain for item in comparisons):
        return _verdict("Inconclusive", "DifferenceUncertain", message, canary, stable, comparisons)
    if errors_uncertain is not None:
        return _verdict("Inconclusive", "ErrorRateUncertain", message, canary, stable, comparisons)
    return _verdict("Pass", "ThresholdsMet", message, canary, stable, comparisons)


def calibration_statistics(canary: WindowStats, stable: WindowStats, level: float) -> dict[str, float | None]:
    """Fixed-sample test statistics of EQUALITY per gate (one window, one look), for the bench's A/A
    calibration: z in the gate's bad direction for goodput, TPOT p90 and p99 shares, acceptance at
    position 1 and the error rate; two-sided p-values for per-pod load and the length mix. Identical
    revisions should exceed a level's critical value at about that level if the standard errors are right.
    Where a gate scales its variance for few cells (`few_units_penalty`), so does its statistic here, at
    `level`: what is calibrated is the test the gate runs."""
    found: dict[str, float | None] = {"goodput": None, "tpot_p90": None, "tpot_p99": None, "acceptance": None,
                                      "errors": None, "load": None, "lengths": None}
    scale = math.sqrt(few_units_penalty(canary, stable, level))
    z = goodput_z(canary, stable)
    found["goodput"] = -z / scale if z is not None else None
    canary_tpot, stable_tpot = shared_tpot_layout(canary, stable)
    for name, quantile in (("tpot_p90", 0.9), ("tpot_p99", 0.99)):
        tail = tail_shortfall(canary_tpot, stable_tpot, quantile, 1.0)
        if tail is not None and tail.variance > 0:
            found[name] = tail.excess / math.sqrt(tail.variance) / scale
    c, s = canary.position_acceptance(0), stable.position_acceptance(0)
    if c and s:
        variance = sum(
            _acceptance_log_variance(side, [(cell.accepted_per_position[0], cell.drafts) for cell in side.cells
                                            if cell.accepted_per_position], share, draft_trials(side))
            for side, share in ((canary, c), (stable, s)))
        found["acceptance"] = -math.log(c / s) / math.sqrt(variance) / scale
    if canary.requests > 0 and stable.requests > 0:
        c_errors, c_requests = error_counts(canary)
        s_errors, s_requests = error_counts(stable)
        pooled = (c_errors + s_errors) / (c_requests + s_requests)
        variance = pooled * (1 - pooled) * (1 / c_requests + 1 / s_requests)
        if variance > 0:
            found["errors"] = (c_errors / c_requests - s_errors / s_requests) / math.sqrt(variance)
    load = load_z(canary, stable)
    if load is not None:
        found["load"] = 2 * _normal_sf(abs(load[1]))
    p_values = [p for p in (rank_test_shifted(canary.prompt_buckets, stable.prompt_buckets),
                            rank_test_shifted(canary.output_buckets, stable.output_buckets)) if p is not None]
    if p_values:
        found["lengths"] = min(1.0, len(p_values) * min(p_values))
    return found
