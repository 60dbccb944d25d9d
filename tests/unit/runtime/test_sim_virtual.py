"""Virtual replicas: loading, restarts and the Prometheus text they expose."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec_runtime.simulator.engine import INTER_TOKEN_LATENCY_BUCKETS
from specdec_runtime.simulator.virtual import ReplicaUnavailable, VirtualReplica
from tests.unit.runtime.simfactories import eagle, make_profile

# The names and types in /work/shared/research/vllm-specdec.md (vLLM 0.33 source).
EXPECTED_TYPES = {
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:request_success": "counter",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    return {
        family.name: (family.type, [(s.name, s.labels, s.value) for s in family.samples])
        for family in text_string_to_metric_families(text)
    }


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(key) == value for key, value in labels.items()):
                return s.value
    raise KeyError(name)


def test_metrics_have_vllm_names_types_and_labels() -> None:
    replica = VirtualReplica(make_profile(), eagle(3), model_name="org/target", seed=1)
    replica.advance_to(100.0)
    parsed = families(replica.metrics_text())
    types = {name: kind for name, (kind, _) in parsed.items() if not name.endswith("_created")}
    assert types == EXPECTED_TYPES
    for name, (_, samples) in parsed.items():
        for _, labels, _ in samples:
            assert (labels["model_name"], labels["engine"]) == ("org/target", "0"), name
    _, per_position = parsed["vllm:spec_decode_num_accepted_tokens_per_pos"]
    totals = [labels["position"] for sample_name, labels, _ in per_position if sample_name.endswith("_total")]
    assert totals == ["0", "1", "2"]


def test_counters_print_total_and_created() -> None:
    replica = VirtualReplica(make_profile(restart_s=30), eagle(2), model_name="m", seed=1)
    replica.advance_to(50.0)
    text = replica.metrics_text()
    assert sample(text, "vllm:spec_decode_num_drafts_total") > 0
    assert sample(text, "vllm:spec_decode_num_drafts_created") == 30.0
    assert sample(text, "vllm:generation_tokens_created") == 30.0


def test_histograms_use_vllm_buckets_and_count_one_observation_per_request_step() -> None:
    replica = VirtualReplica(make_profile(concurrency=4), eagle(2), model_name="m", seed=2)
    replica.advance_to(70.0)
    text = replica.metrics_text()
    bounds = [
        labels["le"]
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:inter_token_latency_seconds"
        for s in family.samples
        if s.name.endswith("_bucket")
        for labels in [s.labels]
    ]
    assert bounds == [*(str(float(b)) for b in INTER_TOKEN_LATENCY_BUCKETS), "+Inf"]
    drafts = sample(text, "vllm:spec_decode_num_drafts_total")
    assert sample(text, "vllm:inter_token_latency_seconds_count") == drafts


def test_without_speculation_no_spec_decode_metrics_exist() -> None:
    replica = VirtualReplica(make_profile(), None, model_name="m", seed=1)
    replica.advance_to(20.0)
    names = families(replica.metrics_text())
    assert not [name for name in names if "spec_decode" in name]
    assert sample(replica.metrics_text(), "vllm:generation_tokens_total") > 0


def test_loading_replica_serves_nothing() -> None:
    replica = VirtualReplica(make_profile(restart_s=120), eagle(3), model_name="m", seed=1, start_time=1000.0)
    replica.advance_to(1119.0)
    assert not replica.ready
    with pytest.raises(ReplicaUnavailable):
        replica.metrics_text()
    assert replica.generated_tokens == 0
    replica.advance_to(1121.0)
    assert replica.ready
    assert replica.generated_tokens > 0


def test_restart_resets_counters_changes_k_and_created() -> None:
    replica = VirtualReplica(make_profile(restart_s=10), eagle(3), model_name="m", seed=4)
    replica.advance_to(200.0)
    before = replica.generated_tokens
    replica.restart(eagle(5), at=200.0)
    assert replica.k == 5
    with pytest.raises(ReplicaUnavailable):
        replica.metrics_text()
    replica.advance_to(210.0)
    text = replica.metrics_text()
    assert sample(text, "vllm:spec_decode_num_drafts_total") == 0
    assert sample(text, "vllm:generation_tokens_total") == 0
    assert sample(text, "vllm:spec_decode_num_drafts_created") == 210.0
    assert sample(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="4") == 0
    replica.advance_to(300.0)
    assert replica.generated_tokens > before


def test_same_seed_same_text_and_time_only_moves_forward() -> None:
    texts = []
    for _ in range(2):
        replica = VirtualReplica(make_profile(), eagle(3), model_name="m", seed=9)
        replica.advance_to(500.0)
        texts.append(replica.metrics_text())
    assert texts[0] == texts[1]
    with pytest.raises(ValueError, match="forward"):
        replica.advance_to(499.0)


def test_dynamic_k_table_is_honoured_only_when_switched_on() -> None:
    spec = eagle(4, num_speculative_tokens_per_batch_size=[(1, 4, 1), (5, 64, 2)])
    for dynamic_k, expected_k in ((False, 4), (True, 2)):
        replica = VirtualReplica(make_profile(concurrency=8), spec, model_name="m", seed=1, dynamic_k=dynamic_k)
        replica.advance_to(60.0)
        text = replica.metrics_text()
        ratio = sample(text, "vllm:spec_decode_num_draft_tokens_total") / sample(
            text, "vllm:spec_decode_num_drafts_total"
        )
        assert ratio == expected_k
        # vLLM creates one position series per configured K, whatever the table picks.
        assert sample(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="3") >= 0
