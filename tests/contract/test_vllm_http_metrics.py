"""The simulator's http_requests_total against vLLM 0.33.0's own API-server instrumentation
(vllm/entrypoints/serve/instrumentator/metrics.py): the same requests move the same series, with the same
type, HELP, label names and values, and the same handlers (/health, /metrics, ...) left uncounted."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from specdec_runtime.simulator.server import HTTP_KEEP_ALIVE_S, Simulator, build_app
from specdec_runtime.simulator.vllm_cli import parse_serve_args
from tests.contract.vllm_env import VllmDriver
from tests.unit.runtime.simfactories import make_profile

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]

# (method, path, JSON body): a good and a bad completion, then handlers the instrumentation must skip or count.
REQUESTS: list[tuple[str, str, Any]] = [
    ("POST", "/v1/completions", {"model": "target", "prompt": "one two", "max_tokens": 2}),
    ("POST", "/v1/completions", {"model": "target"}),
    ("GET", "/health", None),
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
]


def http_family(text: str) -> tuple[str, str, set[tuple[str, tuple[tuple[str, str], ...]]]]:
    family = next(f for f in text_string_to_metric_families(text) if f.name == "http_requests")
    samples = {(s.name, tuple(s.labels.items())) for s in family.samples if s.name.endswith("_total")}
    return family.type, family.documentation, samples


async def simulated_exposition() -> str:
    clock = [1000.0]
    options = parse_serve_args(["serve", "org/target", "--served-model-name", "target", "--profile", "unused.yaml",
                                "--seed", "1"])
    profile = make_profile(restart_s=5, step_time={"base_s": 0.001, "per_token_s": 0.0})
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(Simulator(options, profile, lambda: clock[0]))))
    await client.start_server()
    try:
        clock[0] += 10.0
        for method, path, body in REQUESTS:
            await client.request(method, path, json=body)
        return await (await client.get("/metrics")).text()
    finally:
        await client.close()


async def test_http_requests_total_matches_vllms_instrumentation(driver: VllmDriver) -> None:
    vllm_text: str = driver.run("http_metrics", {"requests": [list(request) for request in REQUESTS]})
    vllm = http_family(vllm_text)
    assert {labels for _, labels in vllm[2]} == {
        (("handler", "/v1/completions"), ("method", "POST"), ("status", "2xx")),
        (("handler", "/v1/completions"), ("method", "POST"), ("status", "4xx")),
        (("handler", "/v1/models"), ("method", "GET"), ("status", "2xx")),
    }
    assert http_family(await simulated_exposition()) == vllm


def test_the_simulator_closes_idle_connections_when_vllms_api_server_does(driver: VllmDriver) -> None:
    # A scraper every 15 s against a server that drops idle connections after 5 s connects anew each
    # time; the simulated fleet must cost the operator what a real one does.
    defaults = driver.run("env_defaults", {"names": ["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]})
    assert defaults["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == HTTP_KEEP_ALIVE_S
