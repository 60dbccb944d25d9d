"""parse_metrics: vLLM text in, PodSample out; anything else is MetricsParseError or an incomplete sample."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.tuner.samples import HistogramSnapshot, MetricsParseError, parse_metrics
from tests.unit.tuner.factories import metrics_text


def _without(fragment: str) -> str:
    return "".join(line + "\n" for line in metrics_text().splitlines() if fragment not in line)


def test_reads_every_counter_of_a_speculating_pod() -> None:
    sample = parse_metrics(metrics_text(drafts=1000, per_position=(800, 600, 450), running=8, step_s=0.03))
    assert sample.complete
    assert sample.k == 3
    assert sample.spec is not None
    assert (sample.spec.drafts, sample.spec.draft_tokens, sample.spec.accepted) == (1000, 3000, 1850)
    assert sample.spec.accepted_per_position == (800, 600, 450)
    assert sample.generation_tokens == 2850
    assert sample.requests_running == 8
    assert sample.created == 100.0
    itl = sample.inter_token_latency
    assert itl is not None
    assert (itl.count, itl.total) == (1000, pytest.approx(30.0))
    assert itl.buckets[-1] == (math.inf, 1000)


def test_a_pod_without_speculation_has_no_spec_counters_and_is_complete() -> None:
    sample = parse_metrics(metrics_text(per_position=None))
    assert sample.complete
    assert sample.spec is None
    assert sample.k == 0


def test_the_real_simulator_output_parses_completely() -> None:
    from specdec_runtime.config import SpeculativeSettings
    from specdec_runtime.simulator.virtual import VirtualReplica
    from tests.unit.runtime.simfactories import make_profile

    replica = VirtualReplica(
        make_profile(restart_s=1.0),
        SpeculativeSettings(method="eagle3", model="d", num_speculative_tokens=4),
        model_name="m",
        seed=3,
    )
    replica.advance_to(30.0)
    sample = parse_metrics(replica.metrics_text())
    assert sample.complete, sample.problems
    assert sample.k == 4
    assert sample.spec is not None and sample.spec.drafts > 0
    assert sample.created == 1.0


def test_engines_of_a_data_parallel_pod_are_summed() -> None:
    text = metrics_text(drafts=10, per_position=(5,), created=None) + (
        'vllm:num_requests_running{engine="1",model_name="m"} 4\n'
    )
    assert parse_metrics(text).requests_running == 12


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        (metrics_text()[:-1], "truncated"),
        ('vllm:generation_tokens_total{engine="0" 5\n', "not Prometheus text"),
        ("vllm:generation_tokens_total 1\nvllm:generation_tokens_total 2\n", "duplicate"),
    ],
    ids=["empty", "blank", "no-final-newline", "broken-labels", "duplicate-series"],
)
def test_untrustworthy_text_is_a_parse_error(text: str, message: str) -> None:
    with pytest.raises(MetricsParseError, match=message):
        parse_metrics(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            metrics_text().replace("vllm:generation_tokens_total{", "vllm:other_total{"),
            "generation_tokens_total missing",
        ),
        (_without('position="1"'), "missing positions"),
        (_without("draft_tokens"), "partial spec-decode"),
        (
            _without("inter_token_latency_seconds_sum"),
            "inter_token_latency_seconds histogram missing",
        ),
        (metrics_text().replace('le="+Inf",model_name="m"} 1000', 'le="+Inf",model_name="m"} 999'), "buckets not"),
        (metrics_text(running=-1), "negative"),
        (metrics_text().replace('position="2"', 'position="x"'), "bad position"),
    ],
    ids=[
        "no-generation",
        "missing-position",
        "partial-spec",
        "no-itl-sum",
        "inf-bucket-mismatch",
        "negative",
        "bad-position",
    ],
)
def test_partial_output_is_an_incomplete_sample(text: str, problem: str) -> None:
    sample = parse_metrics(text)
    assert not sample.complete
    # Values vLLM cannot produce (a negative counter) are violations: incomplete too, and the pod is named.
    assert any(problem in p for p in sample.problems + sample.violations), sample.problems


def test_lines_of_other_families_are_never_parsed() -> None:
    # A garbage line of a family the tuner does not read cannot spoil the sample.
    text = metrics_text(extra_lines=['vllm:e2e_request_latency_seconds_bucket{le="oops" what'])
    assert parse_metrics(text).complete


def test_histogram_difference_and_layout_change() -> None:
    later = HistogramSnapshot(((0.1, 5.0), (math.inf, 9.0)), 2.0, 9.0)
    earlier = HistogramSnapshot(((0.1, 1.0), (math.inf, 4.0)), 0.5, 4.0)
    assert later.minus(earlier) == HistogramSnapshot(((0.1, 4.0), (math.inf, 5.0)), 1.5, 5.0)
    assert later.minus(HistogramSnapshot(((0.2, 1.0), (math.inf, 4.0)), 0.5, 4.0)) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_raises_nothing_but_parse_errors(text: str) -> None:
    with contextlib.suppress(MetricsParseError):
        parse_metrics(text)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(metrics_text())), st.binary(max_size=40))
def test_truncated_or_corrupted_text_raises_nothing_but_parse_errors(cut: int, noise: bytes) -> None:
    text = metrics_text()[:cut] + noise.decode("latin-1")
    try:
        sample = parse_metrics(text)
    except MetricsParseError:
        return
    if cut < len(metrics_text()) - 1 and not noise:
        # Cut at a line boundary: whatever went missing is reported, never silently read as zero.
        assert not sample.complete
