"""The HTTP simulator on loopback: vLLM's endpoints, loading, SSE streaming and injected faults."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from specdec_runtime.simulator.server import Simulator, build_app, main
from specdec_runtime.simulator.vllm_cli import parse_serve_args
from tests.unit.runtime.simfactories import make_profile

SPEC = '{"method":"eagle","model":"org/drafter","num_speculative_tokens":3}'
ClientFactory = Callable[..., Any]


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    clients: list[TestClient[Any, Any]] = []

    async def make(clock: FakeClock, *, loaded: bool = True, **profile_overrides: Any) -> TestClient[Any, Any]:
        options = parse_serve_args(
            ["serve", "org/target", "--served-model-name", "target", "--speculative-config", SPEC,
             "--profile", "unused.yaml", "--seed", "3", "--max-model-len", "4096"]
        )
        profile = make_profile(restart_s=5, step_time={"base_s": 0.001, "per_token_s": 0.0}, **profile_overrides)
        client: TestClient[Any, Any] = TestClient(TestServer(build_app(Simulator(options, profile, clock))))
        await client.start_server()
        clients.append(client)
        if loaded:
            clock.now += 5.0
        return client

    yield make
    for client in clients:
        await client.close()


async def test_nothing_is_served_until_the_model_is_loaded(make_client: ClientFactory) -> None:
    clock = FakeClock(1000.0)
    client = await make_client(clock, loaded=False)
    for path in ("/health", "/metrics", "/v1/models"):
        assert (await client.get(path)).status == 503
    clock.now = 1005.5
    assert (await client.get("/health")).status == 200
    assert (await client.get("/ping")).status == 200
    assert await (await client.get("/version")).json() == {"version": "0.33.0"}
    models = await (await client.get("/v1/models")).json()
    assert [(m["id"], m["root"], m["max_model_len"]) for m in models["data"]] == [("target", "org/target", 4096)]


async def test_metrics_move_on_the_wall_clock_with_the_configured_k(make_client: ClientFactory) -> None:
    clock = FakeClock(0.0)
    client = await make_client(clock, loaded=False)
    clock.now = 65.0
    response = await client.get("/metrics")
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    samples = {
        (s.name, s.labels.get("position")): s.value
        for family in text_string_to_metric_families(await response.text())
        for s in family.samples
    }
    drafts = samples[("vllm:spec_decode_num_drafts_total", None)]
    assert drafts > 0
    assert samples[("vllm:spec_decode_num_draft_tokens_total", None)] == 3 * drafts
    assert ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "2") in samples
    assert samples[("vllm:spec_decode_num_drafts_created", None)] == 5.0


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"model": "target", "prompt": "one two three", "max_tokens": 7}),
    ("/v1/chat/completions", {"model": "target", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}),
])
async def test_completions_answer_in_vllm_shape(make_client: ClientFactory, path: str, body: dict[str, Any]) -> None:
    client = await make_client(FakeClock(10.0))
    reply = await (await client.post(path, json=body)).json()
    assert reply["usage"]["completion_tokens"] == 7
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["object"] == ("chat.completion" if "messages" in body else "text_completion")

    stream = await client.post(path, json={**body, "stream": True})
    assert stream.headers["Content-Type"] == "text/event-stream"
    events = [line[len("data: "):] for line in (await stream.text()).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event)["choices"][0] for event in events[:-1]]
    text = "".join(c["delta"].get("content", "") if "delta" in c else c["text"] for c in chunks)
    assert text.split() == ["sim"] * 7
    assert chunks[-1]["finish_reason"] == "length"


async def test_bad_requests_are_refused_like_vllm(make_client: ClientFactory) -> None:
    client = await make_client(FakeClock(10.0))
    wrong_model = await client.post("/v1/completions", json={"model": "other", "prompt": "x"})
    assert wrong_model.status == 404
    assert (await wrong_model.json())["error"]["type"] == "NotFoundError"
    assert (await client.post("/v1/completions", json={"model": "target"})).status == 400
    too_long = {"model": "target", "prompt": "x", "max_tokens": 5000}
    assert (await client.post("/v1/completions", json=too_long)).status == 400


async def test_faults_inject_errors_and_turn_health_red(make_client: ClientFactory) -> None:
    clock = FakeClock(10.0)
    client = await make_client(clock, faults={"error_rate": 1.0, "unhealthy_after_s": 30})
    body = {"model": "target", "prompt": "x"}
    assert (await client.post("/v1/completions", json=body)).status == 500
    assert (await client.get("/health")).status == 200
    clock.now = 46.0
    assert (await client.get("/health")).status == 503
    metrics = await (await client.get("/metrics")).text()
    errors = [
        s for family in text_string_to_metric_families(metrics) for s in family.samples
        if s.name == "http_requests_total" and s.labels["status"] == "5xx"
    ]
    assert [(s.labels["handler"], s.value) for s in errors] == [("/v1/completions", 1.0)]


def test_bad_profile_is_one_error_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("acceptance: []\n")
    assert main(["serve", "m", "--profile", str(bad)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert f"profile {bad}: field acceptance" in error
