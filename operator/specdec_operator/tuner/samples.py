"""One scrape of a runtime pod's `/metrics`, parsed into the numbers the tuner uses.

Pure: no I/O. `parse_metrics` either returns a `PodSample` (possibly marked incomplete, with the
reasons) or raises `MetricsParseError`; it never raises anything else, because a pod's output is
untrusted input and a bad scrape must never crash the operator or move K.

A sample keeps two kinds of reasons apart: `problems` (families missing or partial, as a pod still starting
or an older vLLM serves them) and `violations` (values vLLM cannot produce: non-finite or negative counters,
sums past float max, more draft positions than any K the API admits, a histogram of more buckets than vLLM
writes). Either makes the sample incomplete; a violation also makes the tuner's windows leave the pod out and
name it (tuner/window.py). How counters relate to each other (no more accepted tokens than drafted) is checked
across scrapes, in tuner/window.py: one scrape is not a snapshot of vLLM's counters. What a sample keeps is
bounded by the API's limits, not by the body: at most MAX_K positions and MAX_HISTOGRAM_BUCKETS buckets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Literal

from specdec_operator.api.vocabulary import MAX_K
from specdec_operator.tuner.exposition import Labels, MalformedSample, Sample, is_openmetrics, parse_samples

# vLLM 0.33 metric families (vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py).
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUESTS_RUNNING = "vllm:num_requests_running"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"
# Per finished request, its prompt and output lengths: the canary checks both sides saw the same traffic.
PROMPT_TOKENS = "vllm:request_prompt_tokens"
OUTPUT_TOKENS = "vllm:request_generation_tokens"
# Finished requests by FinishReason; "error" is a request-level engine failure, which vLLM always
# answers with HTTP 500 (vllm/v1/engine/__init__.py).
REQUEST_SUCCESS = "vllm:request_success"
FINISHED_WITH_ERROR = "error"
# prometheus-fastapi-instrumentator's counter on vLLM's API server, status grouped as "2xx".."5xx";
# /metrics, /health and the other probes are excluded by vLLM, so it counts API requests only.
HTTP_REQUESTS = "http_requests"

_SPEC_FAMILIES = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POSITION)
_HISTOGRAMS = (INTER_TOKEN_LATENCY, TIME_PER_OUTPUT_TOKEN)
_LENGTH_HISTOGRAMS = (PROMPT_TOKENS, OUTPUT_TOKENS)  # optional: missing ones are no problem
# Labels that split one logical series; every other label (model_name, engine) is summed over,
# so a data-parallel pod with several engines reads as one pod.
_KEY_LABELS = ("position", "le", "finished_reason", "status")
# vLLM's latency histograms have 15-25 buckets (vllm/v1/metrics/loggers.py); anything past this is not vLLM.
MAX_HISTOGRAM_BUCKETS = 64


class MetricsParseError(ValueError):
    """The text is not Prometheus exposition we can trust at all (garbage, truncated mid-line, empty)."""


@dataclass(frozen=True)
class HistogramSnapshot:
    """A cumulative histogram: (upper bound, cumulative count) ascending and ending at +Inf, plus sum and count."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    count: float

    def minus(self, earlier: HistogramSnapshot) -> HistogramSnapshot | None:
        """The observations between `earlier` and this one; None when the bucket layouts differ."""
        if [bound for bound, _ in self.buckets] != [bound for bound, _ in earlier.buckets]:
            return None
        pairs = zip(self.buckets, earlier.buckets, strict=True)
        buckets = tuple((bound, now - then) for (bound, now), (_, then) in pairs)
        return HistogramSnapshot(buckets, self.total - earlier.total, self.count - earlier.count)


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's spec-decode counters. `accepted_per_position[i]` counts drafts whose first i+1 tokens were accepted."""

    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_position: tuple[float, ...]


@dataclass(frozen=True)
class RequestCounters:
    """Requests the engine finished (any reason) and those it finished with an error, plus the API
    server's view: every API request answered, and those answered with a 5xx status."""

    finished: float = 0.0
    errored: float = 0.0
    http: float = 0.0
    http_5xx: float = 0.0


@dataclass(frozen=True)
class PodSample:
    """The counters and gauges of one scrape. `spec` is None when the pod runs without speculation."""

    spec: SpecCounters | None
    generation_tokens: float | None
    requests_running: float | None
    inter_token_latency: HistogramSnapshot | None
    time_per_output_token: HistogramSnapshot | None
    # Process start as vLLM reports it through the counters' `_created` series; None with the
    # multiprocess collector, which omits `_created`. A change means the counters restarted.
    created: float | None
    problems: tuple[str, ...] = field(default=())
    requests: RequestCounters = field(default_factory=RequestCounters)
    violations: tuple[str, ...] = field(default=())  # values vLLM cannot produce: the pod is left out and named
    prompt_tokens: HistogramSnapshot | None = None
    output_tokens: HistogramSnapshot | None = None

    @property
    def complete(self) -> bool:
        return not self.problems and not self.violations

    @property
    def k(self) -> int:
        """K the pod runs, as vLLM reveals it: one position series per draft position, or (a vLLM without
        per-position counters) draft tokens per draft, since every draft proposes K tokens."""
        if not self.spec or self.violations:
            return 0  # a pod whose counters vLLM cannot produce reveals no K (it is left out of decisions)
        if self.spec.accepted_per_position:
            return len(self.spec.accepted_per_position)
        per_draft = self.spec.draft_tokens / self.spec.drafts if self.spec.drafts > 0 else 0.0
        # Bounded like the per-position series: no K past the API's maximum comes from a pod.
        return min(MAX_K, round(per_draft)) if math.isfinite(per_draft) else 0


@dataclass(frozen=True)
class ScrapeTarget:
    """One Ready runtime pod to scrape, with what the operator knows about it."""

    pod: str  # namespace/name, for messages
    uid: str
    ip: str
    port: int
    pool: str
    revision: str
    k: int
    restart_count: int = 0


ScrapeOutcome = Literal["ok", "incomplete", "parse_error", "timeout", "http_error", "refused"]


@dataclass(frozen=True)
class ScrapeResult:
    """What one scrape produced. `sample` is set for outcomes ok and incomplete only."""

    target: ScrapeTarget
    at: float  # when it was scraped, seconds on the scraper's clock (the operator's scheduler: monotonic)
    outcome: ScrapeOutcome
    sample: PodSample | None = None
    error: str = ""
    duration_s: float = 0.0


def parse_metrics(text: str) -> PodSample:
    """Parse vLLM's `/metrics` text. Raises only `MetricsParseError`."""
    if not text.strip():
        raise MetricsParseError("empty /metrics body")
    if not text.endswith("\n") and not is_openmetrics(text):
        # A body cut mid-line can still parse, with a shortened number that looks like a counter
        # reset; the exposition format always ends lines with a newline, so refuse it. OpenMetrics
        # marks its end with `# EOF`, whose own newline is optional: such a body is whole.
        raise MetricsParseError("truncated /metrics body: no final newline")
    try:
        samples = parse_samples(text, _READ_NAMES)
    except MalformedSample as err:
        raise MetricsParseError(f"not Prometheus text: {err}"[:300]) from err
    if not samples:
        raise MetricsParseError("no vLLM metrics in the body")
    return _build_sample(_collect(samples))


# Every sample name the tuner reads; only these lines are parsed. A production vLLM serves many more
# histograms (TTFT, e2e, queue, prefill...), and parsing them on every scrape of every pod would cost
# the operator most of its CPU for nothing. The bare family names are read too, so that a sample under
# a counter's bare name is still checked (malformed, negative) like its siblings, though only the
# _total series counts.
_WANTED_NAMES = frozenset(
    [f"{name}{suffix}" for name in (*_SPEC_FAMILIES, GENERATION_TOKENS) for suffix in ("", "_total")]
    + [DRAFTS + "_created", GENERATION_TOKENS + "_created", REQUESTS_RUNNING]
    + [f"{name}{suffix}" for name in (*_HISTOGRAMS, *_LENGTH_HISTOGRAMS)
       for suffix in ("", "_bucket", "_sum", "_count")]
    + [f"{name}{suffix}" for name in (REQUEST_SUCCESS, HTTP_REQUESTS) for suffix in ("", "_total")]
)

# The same names as vLLM's prometheus_client writes them in OpenMetrics, which Prometheus 2 asks for and gets
# with the names' ":" escaped to "_" (prometheus_client 0.26, `escaping=underscores`, its default):
# `vllm_generation_tokens_total`. They are read as the names they escape; one series written both ways is
# a duplicate.
_ESCAPED_NAMES = {name.replace(":", "_"): name for name in _WANTED_NAMES if ":" in name}
_READ_NAMES = _WANTED_NAMES | frozenset(_ESCAPED_NAMES)


# Summed series: sample name -> {key label values -> value}.
_Series = dict[str, dict[tuple[str, ...], float]]


def _collect(samples: Iterable[Sample]) -> _Series:
    series: _Series = {}
    seen: set[tuple[str, Labels]] = set()
    keys: dict[Labels, tuple[str, ...]] = {}  # label sets repeat across lines
    for written, labels, value in samples:
        name = _ESCAPED_NAMES.get(written, written)
        identity = (name, labels)
        if identity in seen:
            raise MetricsParseError(f"duplicate series {name}{dict(sorted(labels))}")
        seen.add(identity)
        key = keys.get(labels)
        if key is None:
            by_name = dict(labels)
            key = keys[labels] = tuple(by_name.get(label, "") for label in _KEY_LABELS)
        by_key = series.setdefault(name, {})
        by_key[key] = by_key.get(key, 0.0) + value
    return series


def _total(series: _Series, name: str) -> float | None:
    values = series.get(name)
    return None if values is None else sum(values.values())


def _build_sample(series: _Series) -> PodSample:
    problems: list[str] = []
    violations: list[str] = []
    spec = _spec_counters(series, problems, violations)
    generation = _total(series, GENERATION_TOKENS + "_total")
    if generation is None:
        problems.append(f"{GENERATION_TOKENS}_total missing")
    histograms = {name: _histogram(series, name, problems, violations) for name in _HISTOGRAMS}
    # Request-length histograms only inform the canary's same-traffic check: a malformed one is left out, it
    # neither fails the sample nor excludes the pod.
    lengths = {name: _histogram(series, name, [], []) if name + "_bucket" in series else None
               for name in _LENGTH_HISTOGRAMS}
    numbers: list[float] = [value for by_key in series.values() for value in by_key.values()]
    if not all(math.isfinite(value) and value >= 0 for value in numbers):
        violations.append("negative or non-finite value")
    created = [value for name in (GENERATION_TOKENS, DRAFTS) if (value := _earliest_created(series, name)) is not None]
    sample = PodSample(
        spec=spec,
        generation_tokens=generation,
        requests_running=_total(series, REQUESTS_RUNNING),
        inter_token_latency=histograms[INTER_TOKEN_LATENCY],
        time_per_output_token=histograms[TIME_PER_OUTPUT_TOKEN],
        created=min(created) if created else None,
        problems=tuple(problems),
        requests=_request_counters(series),
        prompt_tokens=lengths[PROMPT_TOKENS],
        output_tokens=lengths[OUTPUT_TOKENS],
    )
    if not violations:
        violations += impossible_counters(sample)
    return replace(sample, violations=tuple(violations)) if violations else sample


def sample_numbers(sample: PodSample) -> list[float]:
    """Every number of the sample the tuner does arithmetic on."""
    numbers = [sample.generation_tokens or 0.0, sample.requests_running or 0.0]
    if sample.spec is not None:
        spec = sample.spec
        numbers += [spec.drafts, spec.draft_tokens, spec.accepted, *spec.accepted_per_position]
    for histogram in (sample.inter_token_latency, sample.time_per_output_token):
        if histogram is not None:
            numbers += [histogram.total, histogram.count, *(count for _, count in histogram.buckets)]
    requests = sample.requests
    return [*numbers, requests.finished, requests.errored, requests.http, requests.http_5xx]


def impossible_counters(sample: PodSample) -> list[str]:
    """What in one parsed sample vLLM cannot produce: sums past float max (engines or label sets summed).

    Relations between counters (accepted <= draft tokens <= K x drafts) are not checked on one sample: vLLM
    renders /metrics in a worker thread while its event loop counts, so a counter later in the body can hold
    engine steps that one earlier in it does not (in CI, 2115 draft tokens beside 697 drafts at K=3, from an
    honest engine under load). tuner/window.py checks them between scrapes, where they hold exactly."""
    if not all(math.isfinite(value) and value >= 0 for value in sample_numbers(sample)):
        return ["a counter sum is past float max"]
    return []


def _request_counters(series: _Series) -> RequestCounters:
    """Absent families read as zero: vLLM creates an http_requests child only with the first request."""
    finished = series.get(REQUEST_SUCCESS + "_total", {})
    http = series.get(HTTP_REQUESTS + "_total", {})
    reason, status = _KEY_LABELS.index("finished_reason"), _KEY_LABELS.index("status")
    return RequestCounters(
        finished=sum(finished.values()),
        errored=sum(value for key, value in finished.items() if key[reason] == FINISHED_WITH_ERROR),
        http=sum(http.values()),
        http_5xx=sum(value for key, value in http.items() if key[status].startswith("5")),
    )


def _earliest_created(series: _Series, family: str) -> float | None:
    values = series.get(family + "_created")
    # Each engine's series carries its own start time; the earliest is the process's.
    return None if not values else min(values.values())


def _spec_counters(series: _Series, problems: list[str], violations: list[str]) -> SpecCounters | None:
    present = [name for name in _SPEC_FAMILIES if name + "_total" in series]
    if not present:
        return None
    if present == list(_SPEC_FAMILIES[:3]):
        # A vLLM without per-position counters: the totals still give accepted length and K.
        drafts, draft_tokens, accepted = (_total(series, name + "_total") or 0.0 for name in present)
        return SpecCounters(drafts, draft_tokens, accepted, ())
    if len(present) < len(_SPEC_FAMILIES):
        missing = sorted(set(_SPEC_FAMILIES) - set(present))
        problems.append(f"partial spec-decode counters: missing {', '.join(missing)}")
        return None
    per_position = _per_position(series[ACCEPTED_PER_POSITION + "_total"], problems, violations)
    drafts, draft_tokens, accepted = (_total(series, name + "_total") or 0.0 for name in _SPEC_FAMILIES[:3])
    return SpecCounters(drafts, draft_tokens, accepted, per_position)


def _per_position(
    values: Mapping[tuple[str, ...], float], problems: list[str], violations: list[str]
) -> tuple[float, ...]:
    if len(values) > MAX_K:
        # K comes from the spec (at most MAX_K), never from how many series a pod shows: none of them is kept.
        violations.append(f"{len(values)} draft positions: more than any K the API admits ({MAX_K})")
        return ()
    by_position: dict[int, float] = {}
    for (position, *_), value in values.items():
        if not position.isdigit() or len(position) > 3:
            problems.append(f"bad position label {position[:20]!r}")
            return ()
        by_position[int(position)] = value
    expected = list(range(len(by_position)))
    if sorted(by_position) != expected:
        problems.append(f"missing positions: have {sorted(by_position)}")
        return ()
    return tuple(by_position[i] for i in expected)


def _histogram(series: _Series, name: str, problems: list[str], violations: list[str]) -> HistogramSnapshot | None:
    bucket_values = series.get(name + "_bucket")
    total, count = _total(series, name + "_sum"), _total(series, name + "_count")
    if bucket_values is None or total is None or count is None:
        problems.append(f"{name} histogram missing or partial")
        return None
    if len(bucket_values) > MAX_HISTOGRAM_BUCKETS:
        violations.append(f"{name}: {len(bucket_values)} buckets, more than vLLM writes ({MAX_HISTOGRAM_BUCKETS})")
        return None
    try:
        buckets = tuple(sorted((float(le), value) for (_, le, *_), value in bucket_values.items()))
    except ValueError:
        problems.append(f"{name}: bad le label")
        return None
    cumulative = [value for _, value in buckets]
    if (
        not buckets
        or buckets[-1][0] != math.inf
        or any(later < earlier for earlier, later in pairwise(cumulative))
        or cumulative[-1] != count
    ):
        problems.append(f"{name}: buckets not cumulative up to +Inf == count")
        return None
    return HistogramSnapshot(buckets, total, count)
