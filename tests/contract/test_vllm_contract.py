"""Our rendered flags and the simulator's metrics against the vllm 0.33.0 wheel's own source."""

from __future__ import annotations

import ast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec_operator.api.vocabulary import SPECULATIVE_METHODS
from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.engine import INTER_TOKEN_LATENCY_BUCKETS
from specdec_runtime.simulator.exposition import EXPOSED_METRICS, FINISH_REASONS, LABELS
from specdec_runtime.simulator.profile import PACKAGED_PROFILES_DIR, load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from specdec_runtime.simulator.vllm_cli import VLLM_SPECULATIVE_CONFIG_KEYS
from tests.contract.vllm_source import (
    BUCKETS,
    ENGINE,
    LOGGERS,
    SPEC_DECODE_METRICS,
    SPECULATIVE_CONFIG,
    VllmSource,
    WheelUnavailable,
    vllm_wheel,
)


@pytest.fixture(scope="module")
def vllm() -> VllmSource:
    try:
        wheel = vllm_wheel()
    except WheelUnavailable as err:
        pytest.skip(f"PyPI refused `pip download --no-deps vllm==0.33.0`: {err}")
    return VllmSource(wheel)


@pytest.fixture(scope="module")
def vllm_metrics(vllm: VllmSource) -> dict[str, tuple[str, str]]:
    return {**vllm.metrics(LOGGERS), **vllm.metrics(SPEC_DECODE_METRICS)}


@pytest.fixture(scope="module")
def simulated_families() -> dict[str, tuple[str, str]]:
    profile = load_profile(PACKAGED_PROFILES_DIR / "default.yaml")
    spec = SpeculativeSettings(method="eagle", model="d", num_speculative_tokens=3)
    replica = VirtualReplica(profile, spec, model_name="m", seed=1)
    replica.advance_to(profile.restart_s + 60)
    return {f.name: (f.type, f.documentation) for f in text_string_to_metric_families(replica.metrics_text())}


def test_every_key_we_render_is_a_speculative_config_field(vllm: VllmSource) -> None:
    fields = vllm.class_fields(SPECULATIVE_CONFIG, "SpeculativeConfig")
    assert set(SpeculativeSettings.model_fields) <= fields


def test_the_simulator_accepts_exactly_vllms_speculative_config_keys(vllm: VllmSource) -> None:
    assert vllm.class_fields(SPECULATIVE_CONFIG, "SpeculativeConfig") == VLLM_SPECULATIVE_CONFIG_KEYS


def test_every_method_we_accept_is_allowed(vllm: VllmSource) -> None:
    allowed = vllm.literal_values(SPECULATIVE_CONFIG, "SpeculativeMethod")
    assert set(SPECULATIVE_METHODS) <= allowed
    assert not {"medusa", "mlp_speculator"} & allowed, "methods removed in 0.33.0 are back: revisit the vocabulary"


@pytest.mark.parametrize("name", EXPOSED_METRICS)
def test_exposed_metric_exists_with_the_same_type_and_help(
    name: str, vllm_metrics: dict[str, tuple[str, str]], simulated_families: dict[str, tuple[str, str]]
) -> None:
    assert name in vllm_metrics, f"{name} is not declared in vLLM 0.33's metrics code"
    assert simulated_families[name] == vllm_metrics[name]


def test_labels_match(vllm: VllmSource) -> None:
    assert ast.literal_eval(vllm.assignment(LOGGERS, "labelnames")) == list(LABELS)
    assert vllm.assignment(SPEC_DECODE_METRICS, "pos_labelnames") == "labelnames + ['position']"
    assert vllm.module_constant(ENGINE, "FINISH_REASON_STRINGS") == FINISH_REASONS


def test_histograms_use_the_inter_token_latency_buckets_from_the_wheel(vllm: VllmSource) -> None:
    assert vllm.module_constant(BUCKETS, "INTER_TOKEN_LATENCY_BUCKETS") == INTER_TOKEN_LATENCY_BUCKETS
    assert vllm.assignment(LOGGERS, "inter_token_latency_buckets").startswith(
        "histogram_buckets('inter_token_latency'"
    )
    for metric in ("vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds"):
        assert vllm.call_keyword(LOGGERS, metric, "buckets") == "inter_token_latency_buckets"
