"""Live requests ride in the engine's batch: the running gauge follows them and vLLM's counters move."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from specdec_runtime.simulator.server import Simulator, build_app
from specdec_runtime.simulator.vllm_cli import parse_serve_args
from tests.unit.runtime.simfactories import make_profile

SPEC = '{"method":"eagle","model":"org/drafter","num_speculative_tokens":3}'


class VirtualTime:
    """A clock that moves only when a step sleeps: step lengths come out exact, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)  # still a suspension point, as a real step is


class LateTime(VirtualTime):
    """Virtual time whose every wake-up comes `late_s` after the sleep asked: a busy host's event loop."""

    def __init__(self, late_s: float) -> None:
        super().__init__()
        self.late_s = late_s

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds + self.late_s)


async def _client(virtual: VirtualTime | None = None, **profile: Any) -> TestClient[Any, Any]:
    options = parse_serve_args(["serve", "org/target", "--served-model-name", "target", "--speculative-config", SPEC,
                                "--profile", "unused.yaml", "--seed", "5"])
    # No virtual load: every sequence in the batch is one of the test's requests.
    made = make_profile(concurrency=0, restart_s=0, **profile)
    simulator = Simulator(options, made) if virtual is None else Simulator(options, made, virtual.clock, virtual.sleep)
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(simulator, background_tick=False)))
    await client.start_server()
    return client


def _samples(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            extra = {k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")}
            values[sample.name + (str(sorted(extra.items())) if extra else "")] = sample.value
    return values


async def _metrics(client: TestClient[Any, Any]) -> dict[str, float]:
    return _samples(await (await client.get("/metrics")).text())


async def _until(client: TestClient[Any, Any], name: str, value: float) -> None:
    """Scrape until the gauge reaches value: each scrape is a request, so the loop waits on the server."""
    while (await _metrics(client))[name] < value:
        pass


async def test_running_batch_follows_requests_in_flight_and_counters_count_them() -> None:
    client = await _client(step_time={"base_s": 0.01, "per_token_s": 0.0})
    try:
        body = {"model": "target", "prompt": "a b c d", "max_tokens": 40}
        tasks = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(3)]
        await _until(client, "vllm:num_requests_running", 3)
        responses = await asyncio.gather(*tasks)
        assert [r.status for r in responses] == [200, 200, 200]
        after = await _metrics(client)
        assert after["vllm:num_requests_running"] == 0
        assert after["vllm:request_success_total[('finished_reason', 'length')]"] == 3
        assert after["vllm:generation_tokens_total"] == 3 * 40
        assert after["vllm:prompt_tokens_total"] == 3 * 4
        assert after["vllm:request_time_per_output_token_seconds_count"] == 3
        assert after["vllm:time_to_first_token_seconds_count"] == 3
        assert after["vllm:e2e_request_latency_seconds_count"] == 3
        # Each request's latency covers its first token and every later step.
        assert after["vllm:e2e_request_latency_seconds_sum"] > after["vllm:time_to_first_token_seconds_sum"]
        assert after["vllm:spec_decode_num_drafts_total"] > 0
        accepted = after["vllm:spec_decode_num_accepted_tokens_total"]
        # Every decode step emits its accepted prefix plus one token; the prefill step emits the first.
        assert after["vllm:spec_decode_num_drafts_total"] + accepted + 3 >= 3 * 40
    finally:
        await client.close()


async def test_max_num_seqs_queues_live_requests_as_waiting() -> None:
    client = await _client(step_time={"base_s": 0.01, "per_token_s": 0.0},
                           requests={"max_num_seqs": 1})
    try:
        body = {"model": "target", "prompt": "x", "max_tokens": 30}
        tasks = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(2)]
        await _until(client, "vllm:num_requests_waiting", 1)
        assert (await _metrics(client))["vllm:num_requests_running"] == 1
        assert [r.status for r in await asyncio.gather(*tasks)] == [200, 200]
        assert (await _metrics(client))["vllm:num_requests_waiting"] == 0
    finally:
        await client.close()


async def test_error_rate_fails_requests_with_finished_reason_error() -> None:
    client = await _client(step_time={"base_s": 0.001, "per_token_s": 0.0}, faults={"error_rate": 1.0})
    try:
        plain = await client.post("/v1/completions", json={"model": "target", "prompt": "x", "max_tokens": 4})
        assert plain.status == 500
        stream = await client.post("/v1/completions",
                                   json={"model": "target", "prompt": "x", "max_tokens": 4, "stream": True})
        assert '"code": 500' in await stream.text()
        after = await _metrics(client)
        assert after["vllm:request_success_total[('finished_reason', 'error')]"] == 2
        assert after["vllm:request_success_total[('finished_reason', 'length')]"] == 0
    finally:
        await client.close()


async def test_slowdown_lengthens_time_per_output_token() -> None:
    async def tpot(slowdown: float) -> float:
        # On virtual time: the event loop's wake-up delays on a busy machine do not stretch the steps.
        client = await _client(VirtualTime(), step_time={"base_s": 0.04, "per_token_s": 0.0},
                               faults={"slowdown": slowdown}, acceptance=[0.0])
        try:
            await client.post("/v1/completions", json={"model": "target", "prompt": "x", "max_tokens": 8})
            after = await _metrics(client)
            return after["vllm:request_time_per_output_token_seconds_sum"]
        finally:
            await client.close()

    normal, slow = await tpot(1.0), await tpot(1.5)
    assert 1.3 < slow / normal < 1.7


async def test_a_host_that_wakes_late_does_not_stretch_the_engine_steps_unless_it_loses_a_whole_step() -> None:
    # A GPU runs its steps back to back: the engine's TPOT is its steps' time, whatever the host's scheduling
    # delays, as long as the host keeps up. A delay longer than a step is lost time, and counts.
    async def tpot(virtual: VirtualTime) -> float:
        client = await _client(virtual, step_time={"base_s": 0.04, "per_token_s": 0.0}, acceptance=[0.0])
        try:
            await client.post("/v1/completions", json={"model": "target", "prompt": "x", "max_tokens": 20})
            after = await _metrics(client)
            assert after["vllm:request_time_per_output_token_seconds_count"] == 1
            return after["vllm:request_time_per_output_token_seconds_sum"]
        finally:
            await client.close()

    on_time, late, lost = await tpot(VirtualTime()), await tpot(LateTime(0.015)), await tpot(LateTime(0.1))
    assert 0.035 < on_time < 0.045
    assert abs(late - on_time) < 1e-9, (late, on_time)
    assert lost > 2 * on_time, (lost, on_time)


async def test_a_request_in_flight_is_counted_step_by_step_as_vllm_counts_iterations() -> None:
    # vLLM counts tokens, drafts, accepted tokens and inter-token latencies per engine iteration, and a request's
    # prompt and time to first token at its prefill; only its TPOT, latency and outcome wait for it to finish. A
    # scrape in the middle of a long request sees its steps so far.
    client = await _client(step_time={"base_s": 0.01, "per_token_s": 0.0}, acceptance=[0.0])
    try:
        body = {"model": "target", "prompt": "a b c d", "max_tokens": 100}  # one token per step: 100 steps
        task = asyncio.create_task(client.post("/v1/completions", json=body))
        await _until(client, "vllm:generation_tokens_total", 10)
        during = await _metrics(client)
        emitted = during["vllm:generation_tokens_total"]
        assert during["vllm:num_requests_running"] == 1, "scraped after the request finished"
        assert during["vllm:request_success_total[('finished_reason', 'length')]"] == 0
        assert during["vllm:prompt_tokens_total"] == 4 and during["vllm:time_to_first_token_seconds_count"] == 1
        # Every step after the prefill drafted 3 tokens (none accepted) and observed one inter-token latency.
        assert during["vllm:spec_decode_num_drafts_total"] == emitted - 1
        assert during["vllm:spec_decode_num_draft_tokens_total"] == 3 * (emitted - 1)
        assert during["vllm:inter_token_latency_seconds_count"] == emitted - 1
        assert during["vllm:e2e_request_latency_seconds_count"] == 0
        assert during["vllm:request_time_per_output_token_seconds_count"] == 0
        assert (await task).status == 200
        after = await _metrics(client)
        assert after["vllm:generation_tokens_total"] == 100 and after["vllm:spec_decode_num_drafts_total"] == 99
        assert after["vllm:request_success_total[('finished_reason', 'length')]"] == 1
        assert after["vllm:e2e_request_latency_seconds_count"] == 1
    finally:
        await client.close()


async def test_a_live_request_keeps_its_kind_of_request_for_every_step() -> None:
    # One kind accepts every draft token, the other none: a request of the first takes 10 drafts of K 3 for its
    # 40 tokens after the first, one of the second 40. Kinds drawn per step would mix both within a request.
    client = await _client(step_time={"base_s": 0.01, "per_token_s": 0.0}, acceptance=None,
                           request_kinds=[{"share": 0.5, "acceptance": [1.0]}, {"share": 0.5, "acceptance": [0.0]}])
    try:
        body = {"model": "target", "prompt": "x", "max_tokens": 41}
        responses = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(12)))
        assert [r.status for r in responses] == [200] * 12
        after = await _metrics(client)
        drafts = after["vllm:spec_decode_num_drafts_total"]
        full = [after[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[('position', '{p}')]"] for p in range(3)]
        assert full[0] == full[1] == full[2], "a draft is accepted whole or not at all"
        accepting, rest = divmod(full[0], 10)
        assert rest == 0 and 0 < accepting < 12, "both kinds served, each request whole"
        assert drafts == 10 * accepting + 40 * (12 - accepting)
    finally:
        await client.close()
