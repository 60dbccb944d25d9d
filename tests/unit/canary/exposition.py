"""Canary windows built the way production builds them: vLLM /metrics text -> parser -> counter
windows -> canary evidence -> WindowStats.

`scrape_text` renders vLLM 0.33's exposition (names, labels, `le` bounds, `_created`) with
prometheus_client, the library vLLM itself uses; `evidence_window` takes the numbers a window should
hold, writes them as two scrapes of one pod (plus a restart and /health answers when asked) and
returns what `CanaryWindows.stats` makes of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from specdec_operator.canary.analysis import WindowStats
from specdec_operator.canary.evidence import FAILURES_IN_A_ROW, CanaryWindows
from specdec_operator.canary.histogram import Buckets
from specdec_operator.tuner.samples import ScrapeResult, ScrapeTarget, parse_metrics
from specdec_operator.tuner.window import CounterWindows

LABELS = ("model_name", "engine")
VALUES = ["meta-llama/Llama-3.1-8B-Instruct", "0"]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
CREATED = 1_764_500_000.0


@dataclass(frozen=True)
class Scrape:
    """Cumulative counters of one vLLM pod at one moment."""

    k: int = 4
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    generation_tokens: float = 0.0
    tpot_buckets: Buckets = ()  # cumulative (le, count); empty means no request finished yet
    finished: dict[str, float] = field(default_factory=dict)  # by finished_reason
    http: dict[str, float] = field(default_factory=dict)  # by status group, e.g. "2xx", "5xx"
    created: float = CREATED
    per_position: bool = True  # False: a vLLM without vllm:spec_decode_num_accepted_tokens_per_pos
    running: float = 8.0
    # vllm:request_prompt_tokens / vllm:request_generation_tokens, cumulative (le, count); empty: not served
    prompt_buckets: Buckets = ()
    output_buckets: Buckets = ()


class _Exposition(Collector):
    def __init__(self, scrape: Scrape) -> None:
        self.scrape = scrape

    def collect(self) -> list[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        s = self.scrape

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(VALUES, value, created=s.created)
            return family

        running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                                    labels=LABELS)
        running.add_metric(VALUES, s.running)
        families: list[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily] = [
            running, counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens),
        ]
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=(*LABELS, "finished_reason"))
        for reason in FINISH_REASONS:
            success.add_metric([*VALUES, reason], s.finished.get(reason, 0.0), created=s.created)
        families.append(success)
        tpot = HistogramMetricFamily("vllm:request_time_per_output_token_seconds",
                                     "Histogram of time_per_output_token_seconds per request.", labels=LABELS)
        buckets = s.tpot_buckets or tuple((bound, 0.0) for bound in (*TPOT_BOUNDS, math.inf))
        # The sum is not read by the analysis; any consistent figure does.
        total = sum(bound * count for bound, count in buckets if math.isfinite(bound))
        tpot.add_metric(VALUES, [(floatToGoString(bound), count) for bound, count in buckets], total)
        families.append(tpot)
        itl = HistogramMetricFamily("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                    labels=LABELS)
        itl.add_metric(VALUES, [(floatToGoString(bound), 0.0) for bound in (*TPOT_BOUNDS, math.inf)], 0.0)
        families.append(itl)
        for name, doc, histogram in (
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", s.prompt_buckets),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.", s.output_buckets),
        ):
            if histogram:
                family = HistogramMetricFamily(name, doc, labels=LABELS)
                family.add_metric(VALUES, [(floatToGoString(bound), count) for bound, count in histogram], 0.0)
                families.append(family)
        if s.http:
            http = CounterMetricFamily("http_requests", "Total number of requests by method, status and handler.",
                                       labels=("method", "status", "handler"))
            for status, value in s.http.items():
                http.add_metric(["POST", status, "/v1/completions"], value)
            families.append(http)
        if s.k > 0:
            families += [
                counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", s.drafts),
                counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", s.draft_tokens),
                counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", s.accepted_tokens),
            ]
            per_position = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                               "Accepted tokens per draft position.", labels=(*LABELS, "position"))
            for position in range(s.k):
                per_position.add_metric([*VALUES, str(position)], s.accepted_tokens / s.k, created=s.created)
            if s.per_position:
                families.append(per_position)
        return families


TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)


def scrape_text(scrape: Scrape) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Exposition(scrape))
    return generate_latest(registry).decode()


def target(revision: str, restart_count: int = 0, uid: str | None = None) -> ScrapeTarget:
    return ScrapeTarget(pod=f"ns/{revision}-0", uid=uid or f"uid-{revision}", ip="127.0.0.1", port=8000,
                        pool="llama-gfx942", revision=revision, k=4, restart_count=restart_count)


def result(pod: ScrapeTarget, at: float, scrape: Scrape) -> ScrapeResult:
    sample = parse_metrics(scrape_text(scrape))
    assert sample.complete, sample.problems
    return ScrapeResult(pod, at, "ok", sample)


def feed(windows: CanaryWindows, counters: CounterWindows, results: Sequence[ScrapeResult],
         health: Sequence[tuple[ScrapeTarget, bool]] = ()) -> None:
    """One scrape round as handlers/tuning.py runs it."""
    windows.add(counters.observe(results), list(results), list(health))


def evidence_window(
    *,
    seconds: float = 120.0,
    gpus: int = 1,
    k: int = 4,
    drafts: float = 0.0,
    draft_tokens: float = 0.0,
    accepted_tokens: float = 0.0,
    generation_tokens: float = 0.0,
    tpot_buckets: Buckets = (),
    requests: float = 0.0,
    errors: float = 0.0,
    http_requests: float = 0.0,
    http_errors: float = 0.0,
    health_failures: int = 0,
    restarts: int = 0,
) -> WindowStats:
    """The WindowStats production derives from a pod whose counters grew by these amounts in `seconds`."""
    revision = "rev-new"
    windows, counters = CanaryWindows(), CounterWindows()
    windows.follow(None, 0.0)
    pod = target(revision)
    start = Scrape(k=k)
    http = {"2xx": http_requests - http_errors, "5xx": http_errors} if http_requests else {}
    end = Scrape(
        k=k, drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted_tokens,
        generation_tokens=generation_tokens, tpot_buckets=tpot_buckets,
        finished={"length": requests - errors, "error": errors}, http=http,
    )
    feed(windows, counters, [result(pod, 1000.0, start)])
    feed(windows, counters, [result(pod, 1000.0 + seconds, end)])
    for _ in range(health_failures):
        # /health answers once, then fails often enough in a row to count as one failure.
        feed(windows, counters, [], [(pod, True)])
        for _ in range(FAILURES_IN_A_ROW):
            feed(windows, counters, [], [(pod, False)])
    if restarts:
        # The container restarted: its counters start over, and the next scrape only sets a baseline.
        restarted = target(revision, restart_count=restarts)
        feed(windows, counters, [result(restarted, 1000.0 + seconds + 1, Scrape(k=k, created=CREATED + 60))])
    return windows.stats(revision, k, gpus)
