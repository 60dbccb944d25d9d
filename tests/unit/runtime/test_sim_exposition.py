"""The simulator's fast /metrics text against prometheus_client's generate_latest, byte for byte.

generate_latest over the engine's collector (and whatever else is on the registry) is the reference
text; the template renderer must write exactly that in every state a replica can be in.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import Counter, Gauge, Histogram, generate_latest

from specdec_runtime.simulator.engine import Engine
from specdec_runtime.simulator.exposition import (
    EngineExposition,
    SimulatorRegistry,
    build_registry,
    exposition_text,
)
from specdec_runtime.simulator.profile import PACKAGED_PROFILES_DIR, Profile, load_profile
from specdec_runtime.simulator.server import Simulator, build_app
from specdec_runtime.simulator.virtual import VirtualReplica, speculation_from_settings
from specdec_runtime.simulator.vllm_cli import parse_serve_args
from tests.unit.runtime.simfactories import eagle, make_profile

PROFILES = sorted(PACKAGED_PROFILES_DIR.glob("*.yaml"))
KS = range(8)  # 0: no speculative config, so no spec-decode families
# Names a label value must escape (quote, backslash, newline) and ones it must not touch.
MODEL_NAMES = ("org/target", 'say "hi"', "back\\slash", "two\nlines", '\\"\n\\n', "", "模型-ü")


def assert_same_text(registry: SimulatorRegistry) -> None:
    reference = generate_latest(registry).decode("utf-8")
    assert exposition_text(registry) == reference
    assert reference.count("\n") > 0


def replica_states(profile: Profile, k: int, model_name: str) -> Iterator[VirtualReplica]:
    """One replica through its life: loaded (no traffic yet), serving, restarted with another K, serving."""
    replica = VirtualReplica(profile, eagle(k) if k else None, model_name=model_name, seed=k, start_time=1.7e9)
    replica.advance_to(replica.ready_at)
    yield replica
    replica.advance_to(replica.ready_at + 90.0)
    yield replica
    replica.restart(eagle(7 - k) if k != 7 else None, replica.now)
    replica.advance_to(replica.ready_at)
    yield replica
    replica.advance_to(replica.ready_at + 45.5)
    yield replica


@pytest.mark.parametrize("k", KS, ids=[f"k{k}" for k in KS])
@pytest.mark.parametrize("path", PROFILES, ids=[path.stem for path in PROFILES])
def test_every_packaged_profile_and_k_renders_generate_latests_text(path: Any, k: int) -> None:
    profile = load_profile(path)
    model_name = MODEL_NAMES[(k + len(path.stem)) % len(MODEL_NAMES)]
    traffic_seen = False
    for replica in replica_states(profile, k, model_name):
        assert_same_text(build_registry(EngineExposition(replica.engine, model_name, created=replica.ready_at)))
        assert replica.metrics_text() == generate_latest(replica.registry).decode("utf-8")
        traffic_seen = traffic_seen or replica.engine.counters.generation_tokens > 0
    assert traffic_seen or all(segment.concurrency == 0 for segment in profile.load)


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_model_names_needing_escaping_render_alike(model_name: str) -> None:
    replica = VirtualReplica(make_profile(), eagle(3), model_name=model_name, seed=1)
    replica.advance_to(300.0)
    assert replica.metrics_text() == generate_latest(replica.registry).decode("utf-8")
    assert '\\"' in replica.metrics_text() or '"' not in model_name


def test_the_error_rate_fault_renders_alike() -> None:
    replica = VirtualReplica(make_profile(faults={"error_rate": 0.2}), eagle(2), model_name="m", seed=5)
    replica.advance_to(900.0)
    assert replica.engine.counters.errored_requests > 0
    assert replica.metrics_text() == generate_latest(replica.registry).decode("utf-8")


def test_a_batch_size_k_table_renders_alike() -> None:
    spec = eagle(5, num_speculative_tokens_per_batch_size=[(1, 4, 5), (5, 64, 2)])
    replica = VirtualReplica(make_profile(concurrency=12), spec, model_name="m", seed=2, dynamic_k=True)
    replica.advance_to(600.0)
    assert replica.metrics_text() == generate_latest(replica.registry).decode("utf-8")


COUNTS = st.integers(min_value=0, max_value=2**62)
REALS = st.floats(min_value=0.0) | st.just(math.inf) | st.just(math.nan)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_name=st.text(max_size=12),
    created=st.floats(min_value=0.0, max_value=4e9),
    counts=st.lists(COUNTS, min_size=30, max_size=30),
    reals=st.lists(REALS, min_size=2, max_size=2),
    k=st.integers(min_value=0, max_value=7),
)
def test_any_counter_values_format_as_generate_latest_does(
    model_name: str, created: float, counts: list[int], reals: list[float], k: int
) -> None:
    """Go float formatting at its edges: exponents from 1e6 up, ints past 2**53, NaN and +Inf sums."""
    speculation = speculation_from_settings(eagle(k), dynamic_k=False) if k else None
    engine = Engine(make_profile(), speculation, random.Random(0), 0.0)
    counters = engine.counters
    values = iter(counts)
    for attribute in ("prompt_tokens", "generation_tokens", "finished_requests", "errored_requests", "drafts",
                      "draft_tokens", "accepted_tokens"):
        setattr(counters, attribute, next(values))
    counters.accepted_per_position = [next(values) for _ in range(k)]
    counters.inter_token_latency.counts[::4] = [next(values) for _ in counters.inter_token_latency.counts[::4]]
    counters.time_per_output_token.counts[-1] = next(values)
    counters.inter_token_latency.total, counters.time_per_output_token.total = reals
    assert_same_text(build_registry(EngineExposition(engine, model_name, created=created)))


def test_other_collectors_render_in_registration_order_around_the_engine() -> None:
    replica = VirtualReplica(make_profile(), eagle(4), model_name="m", seed=1)
    replica.advance_to(120.0)
    registry = build_registry(Counter("before", "Registered first.", ("path",), registry=None))
    registry.register(EngineExposition(replica.engine, "m", created=10.0))
    gauge = Gauge("after", "Registered last.", registry=registry)
    gauge.set(math.pi)
    histogram = Histogram("removed", "Unregistered again.", registry=registry)
    histogram.observe(0.3)
    assert_same_text(registry)
    registry.unregister(histogram)
    assert_same_text(registry)
    registry.set_target_info({"service": 'sim"ulator'})
    assert_same_text(registry)


class FixedClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_the_http_simulators_metrics_with_its_request_counter_match_generate_latest() -> None:
    options = parse_serve_args(
        ["serve", "org/target", "--served-model-name", 'tar"get\\', "--profile", "unused.yaml", "--seed", "3",
         "--speculative-config", '{"method":"eagle","model":"org/drafter","num_speculative_tokens":3}']
    )
    clock = FixedClock(1000.0)
    simulator = Simulator(options, make_profile(restart_s=5, faults={"error_rate": 0.5}), clock)
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(simulator, background_tick=False)))
    await client.start_server()
    try:
        clock.now += 65.0
        for model in ('tar"get\\', 'tar"get\\', "other"):
            await client.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2})
        assert (await client.get("/v1/models")).status == 200
        served = await (await client.get("/metrics")).text()
    finally:
        await client.close()
    for labels in (
        'handler="/v1/models",method="GET",status="2xx"',
        'handler="/v1/completions",method="POST",status="4xx"',  # the unknown model
        'handler="/v1/completions",method="POST",status="5xx"',  # the injected fault
    ):
        assert f"http_requests_total{{{labels}}}" in served
    assert served == generate_latest(simulator.replica.registry).decode("utf-8")
