"""Simulator faults as vLLM shows them: a slower engine in the latency histograms, failing requests
as finished_reason="error"."""

from __future__ import annotations

import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec_runtime.simulator.engine import Engine, Speculation
from specdec_runtime.simulator.exposition import EngineExposition, build_registry, exposition_text
from tests.unit.runtime.simfactories import make_profile


def run(seconds: float = 600.0, **faults: float) -> Engine:
    engine = Engine(make_profile(concurrency=8, faults=faults), Speculation(3), random.Random(3), 0.0)
    engine.run_until(seconds)
    return engine


def mean_tpot(engine: Engine) -> float:
    histogram = engine.counters.time_per_output_token
    return histogram.total / sum(histogram.counts)


def test_slowdown_scales_every_step_and_so_tpot_at_unchanged_acceptance() -> None:
    normal, slow = run(), run(slowdown=1.5)
    assert mean_tpot(slow) / mean_tpot(normal) == pytest.approx(1.5, rel=0.03)
    itl_ratio = (slow.counters.inter_token_latency.total / sum(slow.counters.inter_token_latency.counts)) / (
        normal.counters.inter_token_latency.total / sum(normal.counters.inter_token_latency.counts))
    assert itl_ratio == pytest.approx(1.5, rel=0.01)
    acceptance = [e.counters.accepted_tokens / e.counters.draft_tokens for e in (normal, slow)]
    assert acceptance[1] == pytest.approx(acceptance[0], abs=0.01)


def test_error_rate_finishes_that_share_of_requests_with_reason_error() -> None:
    engine = run(seconds=1800.0, error_rate=0.05)
    counters = engine.counters
    total = counters.finished_requests + counters.errored_requests
    assert total > 1000
    assert counters.errored_requests / total == pytest.approx(0.05, abs=0.015)
    # Every finished request, failed or not, observes its time per output token, as vLLM does.
    assert sum(counters.time_per_output_token.counts) == total
    text = exposition_text(build_registry(EngineExposition(engine, "m", created=0.0)))
    finished = {
        sample.labels["finished_reason"]: sample.value
        for family in text_string_to_metric_families(text) if family.name == "vllm:request_success"
        for sample in family.samples if sample.name.endswith("_total")
    }
    assert finished == {"stop": 0, "length": counters.finished_requests, "abort": 0,
                        "error": counters.errored_requests, "repetition": 0}

