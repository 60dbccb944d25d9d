"""Prometheus exposition of an engine with vLLM 0.33's metric names, types, labels and help texts.

The values live in the engine as plain numbers, so a custom collector (not prometheus_client's
Counter objects) renders them: that lets `_created` carry the simulated process start, which in
virtual time is not the wall clock.

`collect()` is the reference: prometheus_client's generate_latest over it defines the text. The fleet
driver renders ~133 bodies/s in one process, where generate_latest (per-sample label sorting, escaping
and formatting) saturates a core, so /metrics is rendered from a template instead: every byte that
cannot change while the engine lives (HELP/TYPE lines, names with their label sets, `_created`
samples) is joined once, and a render only formats the engine's numbers into its holes. Other
collectors on the registry (the HTTP simulator's request counter) still go through generate_latest.
tests/unit/runtime/test_sim_exposition.py checks the template's text equals generate_latest's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics.exposition import escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from specdec_runtime.simulator.engine import Counters, Engine, Histogram

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
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"

# vLLM registers a request_success child per FinishReason (vllm/v1/engine/__init__.py) up front.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# Synthetic requests always run to max_tokens, unless the error_rate fault fails them.
SIMULATED_FINISH_REASON = "length"
ERROR_FINISH_REASON = "error"

# vLLM 0.33's help texts; tests/contract compares them with the wheel's.
HELP: dict[str, str] = {
    NUM_REQUESTS_RUNNING: "Number of requests in model execution batches.",
    NUM_REQUESTS_WAITING: "Number of requests waiting to be processed.",
    KV_CACHE_USAGE: "KV-cache usage. 1 means 100 percent usage.",
    NUM_PREEMPTIONS: "Cumulative number of preemption from the engine.",
    PROMPT_TOKENS: "Number of prefill tokens processed.",
    GENERATION_TOKENS: "Number of generation tokens processed.",
    REQUEST_SUCCESS: "Count of successfully processed requests.",
    INTER_TOKEN_LATENCY: "Histogram of inter-token latency in seconds.",
    TIME_PER_OUTPUT_TOKEN: "Histogram of time_per_output_token_seconds per request.",
    TIME_TO_FIRST_TOKEN: "Histogram of time to first token in seconds.",
    E2E_REQUEST_LATENCY: "Histogram of e2e request latency in seconds.",
    SPEC_DECODE_DRAFTS: "Number of spec decoding drafts.",
    SPEC_DECODE_DRAFT_TOKENS: "Number of draft tokens.",
    SPEC_DECODE_ACCEPTED_TOKENS: "Number of accepted tokens.",
    SPEC_DECODE_ACCEPTED_PER_POS: "Accepted tokens per draft position.",
}

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
    TIME_TO_FIRST_TOKEN,
    E2E_REQUEST_LATENCY,
)


@dataclass(eq=False)  # registries key collectors by identity
class EngineExposition(Collector):
    """Collects one engine's metrics; `created` is the simulated process start (Unix seconds).

    collect() feeds generate_latest (the reference text); render() writes the same text fast.
    """

    engine: Engine
    model_name: str
    created: float
    # Built once: the families, label sets and `created` are fixed for the engine's life (a restart
    # builds a new engine and a new exposition).
    _template: _Template = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._template = _engine_template(self.engine, self.model_name, self.created)

    def render(self) -> str:
        """The text generate_latest writes for collect(), from the template."""
        return self._template.render(self._sample_values())

    def _sample_values(self) -> list[float]:
        """The samples' values in the order collect() yields them, `_created` ones left out."""
        engine, counters = self.engine, self.engine.counters
        values: list[float] = [engine.running, engine.waiting, engine.kv_cache_usage, 0]
        values += (counters.prompt_tokens, counters.generation_tokens)
        finished_by_reason = _finished_by_reason(counters)
        values += (finished_by_reason.get(reason, 0) for reason in FINISH_REASONS)
        for histogram in (counters.inter_token_latency, counters.time_per_output_token, counters.time_to_first_token,
                          counters.e2e_request_latency):
            cumulative = _cumulative_counts(histogram)
            values += (*cumulative, cumulative[-1], histogram.total)  # buckets, _count, _sum
        if engine.speculation is not None:
            values += (counters.drafts, counters.draft_tokens, counters.accepted_tokens)
            values += counters.accepted_per_position
        return values

    def collect(self) -> Iterator[Metric]:
        engine, counters = self.engine, self.engine.counters
        labels = [self.model_name, ENGINE_INDEX]

        def counter(name: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, HELP[name], labels=LABELS)
            family.add_metric(labels, value, created=self.created)
            return family

        def gauge(name: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, HELP[name], labels=LABELS)
            family.add_metric(labels, value)
            return family

        yield gauge(NUM_REQUESTS_RUNNING, engine.running)
        yield gauge(NUM_REQUESTS_WAITING, engine.waiting)
        yield gauge(KV_CACHE_USAGE, engine.kv_cache_usage)
        yield counter(NUM_PREEMPTIONS, 0)
        yield counter(PROMPT_TOKENS, counters.prompt_tokens)
        yield counter(GENERATION_TOKENS, counters.generation_tokens)
        success = CounterMetricFamily(REQUEST_SUCCESS, HELP[REQUEST_SUCCESS], labels=(*LABELS, "finished_reason"))
        finished_by_reason = _finished_by_reason(counters)
        for reason in FINISH_REASONS:
            success.add_metric([*labels, reason], finished_by_reason.get(reason, 0), created=self.created)
        yield success
        yield self._histogram(INTER_TOKEN_LATENCY, counters.inter_token_latency)
        yield self._histogram(TIME_PER_OUTPUT_TOKEN, counters.time_per_output_token)
        yield self._histogram(TIME_TO_FIRST_TOKEN, counters.time_to_first_token)
        yield self._histogram(E2E_REQUEST_LATENCY, counters.e2e_request_latency)
        # vLLM registers the spec-decode counters only when a speculative config is set.
        if engine.speculation is None:
            return
        yield counter(SPEC_DECODE_DRAFTS, counters.drafts)
        yield counter(SPEC_DECODE_DRAFT_TOKENS, counters.draft_tokens)
        yield counter(SPEC_DECODE_ACCEPTED_TOKENS, counters.accepted_tokens)
        per_position = CounterMetricFamily(
            SPEC_DECODE_ACCEPTED_PER_POS, HELP[SPEC_DECODE_ACCEPTED_PER_POS], labels=(*LABELS, "position")
        )
        for position, accepted in enumerate(counters.accepted_per_position):
            per_position.add_metric([*labels, str(position)], accepted, created=self.created)
        yield per_position

    def _histogram(self, name: str, histogram: Histogram) -> HistogramMetricFamily:
        labels = [self.model_name, ENGINE_INDEX]
        family = HistogramMetricFamily(name, HELP[name], labels=LABELS)
        buckets = [
            (_go_float(bound), float(cumulative))
            for bound, cumulative in zip(_upper_bounds(histogram), _cumulative_counts(histogram), strict=True)
        ]
        family.add_metric(labels, buckets, histogram.total)
        # prometheus_client's Histogram prints _created too; the metric family helper has no argument for it.
        family.add_sample(f"{name}_created", dict(zip(LABELS, labels, strict=True)), self.created)
        return family


def _finished_by_reason(counters: Counters) -> dict[str, int]:
    return {SIMULATED_FINISH_REASON: counters.finished_requests, ERROR_FINISH_REASON: counters.errored_requests}


def _upper_bounds(histogram: Histogram) -> tuple[float, ...]:
    return (*histogram.bounds, math.inf)


def _cumulative_counts(histogram: Histogram) -> list[int]:
    return list(itertools.accumulate(histogram.counts))


class _Template:
    """Exposition text with a hole per sample value; the text between holes is kept joined."""

    def __init__(self) -> None:
        self._chunks = [""]  # the text before the first hole, between holes, and after the last

    def text(self, text: str) -> None:
        self._chunks[-1] += text

    def sample(self, name: str, labels: Mapping[str, str]) -> None:
        """A sample line whose value each render fills in."""
        self.text(f"{_sample_key(name, labels)} ")
        self._chunks.append("\n")

    def render(self, values: Sequence[float]) -> str:
        chunks = self._chunks
        parts = [""] * (2 * len(chunks) - 1)
        parts[0::2] = chunks
        # Raises ValueError unless there is exactly one value per hole.
        parts[1::2] = map(_go_float, values)
        return "".join(parts)


# The helpers below write what generate_latest writes (prometheus_client/exposition.py), for the
# metric and label names the engine uses, which are all valid legacy Prometheus names.


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _sample_key(name: str, labels: Mapping[str, str]) -> str:
    """`name{label="value",...}`: label names sorted, values escaped (backslash, newline, quote)."""
    pairs = ",".join(f'{label}="{_escape_label_value(value)}"' for label, value in sorted(labels.items()))
    return f"{escape_metric_name(name)}{{{pairs}}}"


def _header(name: str, documentation: str, type_: str) -> str:
    escaped = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {escape_metric_name(name)} {escaped}\n# TYPE {escape_metric_name(name)} {type_}\n"


def _gauge(template: _Template, name: str, labels: Mapping[str, str]) -> None:
    template.text(_header(name, HELP[name], "gauge"))
    template.sample(name, labels)


def _created(template: _Template, name: str, children: Sequence[Mapping[str, str]], created: float) -> None:
    # generate_latest moves a family's `_created` samples after its other samples, under a gauge header.
    template.text(_header(f"{name}_created", HELP[name], "gauge"))
    for labels in children:
        template.text(f"{_sample_key(f'{name}_created', labels)} {_go_float(created)}\n")


def _counter(template: _Template, name: str, children: Sequence[Mapping[str, str]], created: float) -> None:
    template.text(_header(f"{name}_total", HELP[name], "counter"))
    for labels in children:
        template.sample(f"{name}_total", labels)
    _created(template, name, children, created)


def _histogram(template: _Template, name: str, labels: Mapping[str, str], histogram: Histogram, created: float) -> None:
    template.text(_header(name, HELP[name], "histogram"))
    for bound in _upper_bounds(histogram):
        template.sample(f"{name}_bucket", {**labels, "le": _go_float(bound)})
    template.sample(f"{name}_count", labels)
    template.sample(f"{name}_sum", labels)
    _created(template, name, [labels], created)


def _engine_template(engine: Engine, model_name: str, created: float) -> _Template:
    """The text of collect()'s families with a hole per value, in the order _sample_values lists them."""
    labels = dict(zip(LABELS, (model_name, ENGINE_INDEX), strict=True))
    counters, template = engine.counters, _Template()
    for name in (NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE):
        _gauge(template, name, labels)
    for name in (NUM_PREEMPTIONS, PROMPT_TOKENS, GENERATION_TOKENS):
        _counter(template, name, [labels], created)
    _counter(template, REQUEST_SUCCESS, [{**labels, "finished_reason": reason} for reason in FINISH_REASONS], created)
    _histogram(template, INTER_TOKEN_LATENCY, labels, counters.inter_token_latency, created)
    _histogram(template, TIME_PER_OUTPUT_TOKEN, labels, counters.time_per_output_token, created)
    _histogram(template, TIME_TO_FIRST_TOKEN, labels, counters.time_to_first_token, created)
    _histogram(template, E2E_REQUEST_LATENCY, labels, counters.e2e_request_latency, created)
    if engine.speculation is not None:
        for name in (SPEC_DECODE_DRAFTS, SPEC_DECODE_DRAFT_TOKENS, SPEC_DECODE_ACCEPTED_TOKENS):
            _counter(template, name, [labels], created)
        positions = [{**labels, "position": str(position)} for position in range(len(counters.accepted_per_position))]
        _counter(template, SPEC_DECODE_ACCEPTED_PER_POS, positions, created)
    return template


class SimulatorRegistry(CollectorRegistry):
    """A registry whose text renders EngineExpositions from their templates, others by generate_latest.

    It lists its collectors in registration order, the order CollectorRegistry.collect() yields them
    in, since the base class has no public list of them.
    """

    def __init__(self) -> None:
        super().__init__(auto_describe=False)
        self._in_order: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self._in_order.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        self._in_order.remove(collector)

    def render(self) -> str:
        """generate_latest(self)'s text, byte for byte."""
        if self.get_target_info():
            # generate_latest writes target_info first; the simulator never sets it.
            return generate_latest(self).decode("utf-8")
        return "".join(_text_of(collector) for collector in self._in_order)


def _text_of(collector: Collector) -> str:
    if isinstance(collector, EngineExposition):
        return collector.render()
    return generate_latest(collector).decode("utf-8")


def build_registry(*collectors: Collector) -> SimulatorRegistry:
    registry = SimulatorRegistry()
    for collector in collectors:
        registry.register(collector)
    return registry


def exposition_text(registry: SimulatorRegistry) -> str:
    return registry.render()
