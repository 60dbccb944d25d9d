"""Prometheus exposition of an engine with vLLM 0.33's metric names, types, labels and help texts.

The values live in the engine as plain numbers, so a custom collector (not prometheus_client's
Counter objects) renders them: that lets `_created` carry the simulated process start, which in
virtual time is not the wall clock. The text itself is produced by prometheus_client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from specdec_runtime.simulator.engine import Engine, Histogram

# prometheus_client's own float formatting for `le` labels; the library leaves it unannotated.
_go_float: Callable[[float], str] = floatToGoString

ENGINE_INDEX = "0"
LABELS = ("model_name", "engine")

SPEC_DECODE_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DECODE_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_DECODE_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
NUM_PREEMPTIONS = "vllm:num_preemptions"
REQUEST_SUCCESS = "vllm:request_success"
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"

# vLLM registers a request_success child per FinishReason (vllm/v1/engine/__init__.py) up front.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# Synthetic requests always run to max_tokens, unless the error_rate fault fails them.
SIMULATED_FINISH_REASON = "length"
ERROR_FINISH_REASON = "error"

# Metric family names (as vLLM declares them, counters without _total) the simulator exposes;
# tests/contract checks each against the vllm 0.33.0 wheel.
EXPOSED_METRICS: tuple[str, ...] = (
    SPEC_DECODE_DRAFTS,
    SPEC_DECODE_DRAFT_TOKENS,
    SPEC_DECODE_ACCEPTED_TOKENS,
    SPEC_DECODE_ACCEPTED_PER_POS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    NUM_PREEMPTIONS,
    REQUEST_SUCCESS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    KV_CACHE_USAGE,
    INTER_TOKEN_LATENCY,
    TIME_PER_OUTPUT_TOKEN,
)


@dataclass(eq=False)  # registries key collectors by identity
class EngineExposition(Collector):
    """Collects one engine's metrics; `created` is the simulated process start (Unix seconds)."""

    engine: Engine
    model_name: str
    created: float

    def collect(self) -> Iterator[Metric]:
        engine, counters = self.engine, self.engine.counters
        labels = [self.model_name, ENGINE_INDEX]

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, documentation, labels=LABELS)
            family.add_metric(labels, value, created=self.created)
            return family

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=LABELS)
            family.add_metric(labels, value)
            return family

        yield gauge(NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.", engine.running)
        yield gauge(NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", engine.waiting)
        yield gauge(KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.", engine.kv_cache_usage)
        yield counter(NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.", 0)
        yield counter(PROMPT_TOKENS, "Number of prefill tokens processed.", counters.prompt_tokens)
        yield counter(GENERATION_TOKENS, "Number of generation tokens processed.", counters.generation_tokens)
        success = CounterMetricFamily(
            REQUEST_SUCCESS, "Count of successfully processed requests.", labels=(*LABELS, "finished_reason")
        )
        finished_by_reason = {
            SIMULATED_FINISH_REASON: counters.finished_requests,
            ERROR_FINISH_REASON: counters.errored_requests,
        }
        for reason in FINISH_REASONS:
            success.add_metric([*labels, reason], finished_by_reason.get(reason, 0), created=self.created)
        yield success
        yield self._histogram(
            INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", counters.inter_token_latency
        )
        yield self._histogram(
            TIME_PER_OUTPUT_TOKEN,
            "Histogram of time_per_output_token_seconds per request.",
            counters.time_per_output_token,
        )
        # vLLM registers the spec-decode counters only when a speculative config is set.
        if engine.speculation is None:
            return
        yield counter(SPEC_DECODE_DRAFTS, "Number of spec decoding drafts.", counters.drafts)
        yield counter(SPEC_DECODE_DRAFT_TOKENS, "Number of draft tokens.", counters.draft_tokens)
        yield counter(SPEC_DECODE_ACCEPTED_TOKENS, "Number of accepted tokens.", counters.accepted_tokens)
        per_position = CounterMetricFamily(
            SPEC_DECODE_ACCEPTED_PER_POS, "Accepted tokens per draft position.", labels=(*LABELS, "position")
        )
        for position, accepted in enumerate(counters.accepted_per_position):
            per_position.add_metric([*labels, str(position)], accepted, created=self.created)
        yield per_position

    def _histogram(self, name: str, documentation: str, histogram: Histogram) -> HistogramMetricFamily:
        labels = [self.model_name, ENGINE_INDEX]
        family = HistogramMetricFamily(name, documentation, labels=LABELS)
        cumulative, buckets = 0, []
        for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts, strict=True):
            cumulative += count
            buckets.append((_go_float(bound), float(cumulative)))
        family.add_metric(labels, buckets, histogram.total)
        # prometheus_client's Histogram prints _created too; the metric family helper has no argument for it.
        family.add_sample(f"{name}_created", dict(zip(LABELS, labels, strict=True)), self.created)
        return family


def build_registry(*collectors: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def exposition_text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode("utf-8")

