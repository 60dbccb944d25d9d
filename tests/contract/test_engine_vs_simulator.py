"""The simulator against the real engine: the same requests through vLLM's CPU build (tiny local checkpoints,
`draft_model` speculation) and through the simulator, both started by our launcher from the same runtime.json, and
what the operator reads from /metrics compared: families, types and label names, the `le` bounds of the histograms
it reads, how the counters move per finished request, the per-position semantics, and the state a fresh process
starts in. Differences that are not bugs (acceptance values, token counts of a real tokenizer) are listed with their
reason in docs/vllm-contract.md, "Simulator against the real engine".

Marked real_engine: `pytest -m real_engine tests/contract/test_engine_vs_simulator.py` (one engine, ~4 GB, 1-5 min
to start on a busy 2-core machine). hack/vllm-cpu-env and hack/tiny-models are run (cached) if needed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec_operator.tuner.samples import ScrapeResult, ScrapeTarget, parse_metrics
from specdec_operator.tuner.window import CounterWindows
from specdec_runtime import engine_env
from specdec_runtime.config import RuntimeConfig, SpeculativeSettings
from specdec_runtime.fleet_engine import ENGINE_ENV

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
K = 3
REQUESTS = 6
MAX_TOKENS = 40
PROMPTS = [f"the user {i} reads a token and the model drafts {i} more" for i in range(REQUESTS)]
# The families the operator reads (tuner, status, canary analysis, autoscaling), by their sample names' family.
READ_BY_THE_OPERATOR = (
    "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos", "vllm:generation_tokens", "vllm:prompt_tokens",
    "vllm:request_success", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds", "vllm:num_preemptions",
)
ENGINE_READY_S = 900


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Served:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    started_wall: float

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as response:
            return str(response.read().decode())

    def complete(self, prompt: str) -> dict[str, Any]:
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
        request = urllib.request.Request(f"{self.url}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    def healthy(self) -> bool:
        assert self.process.poll() is None, f"{self.name} exited: {self.log.read_text()[-3000:]}"
        try:
            return self.get("/health") is not None
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def launch(name: str, config: RuntimeConfig, work: Path, env: dict[str, str]) -> Served:
    """Our launcher, as the runtime image runs it, from a runtime.json."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "runtime.json").write_text(config.to_json())
    log = work / f"{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "specdec-runtime"), "launch", "--config", str(work / "runtime.json")],
            stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
    return Served(name, f"http://127.0.0.1:{config.port}", process, log, time.time())


def wait_healthy(served: Served, timeout_s: float) -> float:
    started = time.monotonic()
    while not served.healthy():
        assert time.monotonic() - started < timeout_s, f"{served.name} not healthy in {timeout_s:.0f}s"
        time.sleep(1)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Served]]:
    if engine_env.missing():
        subprocess.run([str(REPO / "hack" / "tiny-models")], check=True, stdout=subprocess.DEVNULL)
    tiny = engine_env.tiny_models_dir()
    venv = engine_env.vllm_cpu_venv()
    work = tmp_path_factory.mktemp("engine-vs-simulator")
    models = work / "models"
    (models / "tiny-llama").mkdir(parents=True)
    (models / "tiny-llama" / "target").symlink_to(tiny / "target")
    (models / "tiny-llama" / "drafter-good").symlink_to(tiny / "drafter-good")
    config = RuntimeConfig(
        model="tiny-llama/target", served_model_name="tiny", host="127.0.0.1", port=free_port(), max_model_len=2048,
        speculative=SpeculativeSettings(method="draft_model", model="tiny-llama/drafter-good",
                                        num_speculative_tokens=K),
    )
    base_env = {**os.environ, "SPECDEC_MODELS_DIR": str(models)}
    engine = launch("engine", config, work / "engine",
                    {**base_env, **ENGINE_ENV, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    simulator = launch("simulator", config.model_copy(update={
        "engine": "simulator", "simulator_profile": "e2e-traffic", "port": free_port()}), work / "simulator", base_env)
    try:
        print(f"engine healthy after {wait_healthy(engine, ENGINE_READY_S):.0f}s")
        wait_healthy(simulator, 60)
        yield engine, simulator
    finally:
        engine.stop()
        simulator.stop()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("engine", "model_name")))
            found[(sample.name, labels)] = sample.value
    return found


def families(text: str) -> dict[str, tuple[str, frozenset[str], frozenset[str]]]:
    """family -> (type, label names, `le` bounds)."""
    found = {}
    for family in text_string_to_metric_families(text):
        names = frozenset(label for sample in family.samples for label in sample.labels if label != "le")
        bounds = frozenset(sample.labels["le"] for sample in family.samples if "le" in sample.labels)
        found[family.name] = (family.type, names, bounds)
    return found


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return found.get(key, 0.0)


def test_a_fresh_process_starts_from_zero_and_the_families_the_operator_reads_match(
    pair: tuple[Served, Served],
) -> None:
    engine, simulator = pair
    texts = {served.name: served.get("/metrics") for served in pair}
    for name, text in texts.items():
        found = samples(text)
        # A (re)started process: every counter the operator differentiates starts at zero, `_created` is its start.
        for counter in ("vllm:spec_decode_num_drafts_total", "vllm:generation_tokens_total",
                        "vllm:request_success_total"):
            assert sum(v for (n, _), v in found.items() if n == counter) == 0, (name, counter)
        created = value(found, "vllm:spec_decode_num_drafts_created")
        served = engine if name == "engine" else simulator
        assert served.started_wall - 5 <= created <= time.time(), (name, created, served.started_wall)
    engine_families, simulator_families = families(texts["engine"]), families(texts["simulator"])
    differences = []
    for family in READ_BY_THE_OPERATOR:
        if family not in engine_families or family not in simulator_families:
            differences.append(f"{family}: engine has it {family in engine_families}, "
                               f"simulator {family in simulator_families}")
            continue
        if engine_families[family] != simulator_families[family]:
            differences.append(f"{family}: engine {engine_families[family]}, simulator {simulator_families[family]}")
    assert not differences, differences
    # Every family the simulator serves exists in the engine's exposition.
    assert set(simulator_families) - set(engine_families) == set(), set(simulator_families) - set(engine_families)


def test_counters_move_alike_per_finished_request_and_per_position(pair: tuple[Served, Served]) -> None:
    moved = {}
    for served in pair:
        before = samples(served.get("/metrics"))
        for prompt in PROMPTS:  # one at a time: a batch of one, as the identities below assume
            answer = served.complete(prompt)
            assert answer["usage"]["completion_tokens"] == MAX_TOKENS, (served.name, answer["usage"])
        after = samples(served.get("/metrics"))
        moved[served.name] = {key: after[key] - before.get(key, 0.0) for key in after}
    report = {}
    for name, delta in moved.items():
        drafts = value(delta, "vllm:spec_decode_num_drafts_total")
        draft_tokens = value(delta, "vllm:spec_decode_num_draft_tokens_total")
        accepted = value(delta, "vllm:spec_decode_num_accepted_tokens_total")
        per_pos = [value(delta, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                   for i in range(K)]
        generated = value(delta, "vllm:generation_tokens_total")
        report[name] = {"drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "per_pos": per_pos,
                        "generated": generated,
                        "finished_length": value(delta, "vllm:request_success_total", finished_reason="length"),
                        "tpot_count": value(delta, "vllm:request_time_per_output_token_seconds_count")}
    print(json.dumps(report, indent=1))
    for name, seen in report.items():
        assert seen["finished_length"] == REQUESTS, (name, seen)
        assert seen["generated"] == REQUESTS * MAX_TOKENS, (name, seen)
        assert seen["tpot_count"] == REQUESTS, (name, seen)
        # A draft is K draft tokens; the accepted total is the per-position sum; position i counts drafts that
        # accepted at least i+1 tokens, so the series never rises with i.
        assert seen["draft_tokens"] == K * seen["drafts"], (name, seen)
        assert seen["accepted"] == sum(seen["per_pos"]), (name, seen)
        assert all(a >= b for a, b in zip(seen["per_pos"], seen["per_pos"][1:], strict=False)), (name, seen)
        # Every step after the prefill drafts once and emits accepted + 1 tokens; the last step's tokens beyond
        # max_tokens are counted as accepted but not generated, so generated - prefills <= drafts + accepted.
        decode_tokens = seen["generated"] - REQUESTS
        assert decode_tokens <= seen["drafts"] + seen["accepted"] <= decode_tokens + REQUESTS * K, (name, seen)


CONCURRENT = 4


def scraped_under_load(served: Served) -> list[tuple[float, str]]:
    """Its /metrics, read back to back (monotonic time, body) while CONCURRENT clients each send REQUESTS."""
    stop = threading.Event()
    bodies: list[tuple[float, str]] = []
    failed: list[BaseException] = []

    def scrape_until_stopped() -> None:
        while not stop.is_set():
            bodies.append((time.monotonic(), served.get("/metrics")))

    def client(number: int) -> None:
        try:
            for i in range(REQUESTS):
                served.complete(f"client {number} request {i}: {PROMPTS[i]}")
        except BaseException as error:
            failed.append(error)
            raise

    scraper = threading.Thread(target=scrape_until_stopped, daemon=True)
    clients = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(CONCURRENT)]
    scraper.start()
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(600)
    stop.set()
    scraper.join(60)
    bodies.append((time.monotonic(), served.get("/metrics")))
    assert not failed, (served.name, failed)
    return bodies


def test_every_scrape_under_concurrent_load_passes_the_operators_checks(pair: tuple[Served, Served]) -> None:
    """vLLM renders /metrics in a worker thread (a sync FastAPI route) while its event loop counts, so one scrape is
    not a snapshot: a counter read later in the body can be a few engine steps ahead of one read earlier (in CI a
    stable pod showed 2115 draft tokens against 697 drafts at K=3, and was left out of a canary's analysis for ten
    minutes). Scraped as fast as it answers while concurrent requests run, no scrape of either side is judged not
    vLLM, and the windows count every draft between the first scrape and the last. The race is rare (none in 364
    scrapes on an idle machine): tests/unit/tuner/test_hostile.py renders it at will; this checks the real bodies."""
    for served in pair:
        bodies = scraped_under_load(served)
        windows = CounterWindows()
        target = ScrapeTarget(pod=f"contract/{served.name}", uid=served.name, ip="127.0.0.1", port=0, pool="p",
                              revision="r", k=K)
        excluded: list[str] = []
        counted = 0.0
        ahead = []  # per scrape: draft tokens read past K x the drafts read before them, in drafts
        for at, body in bodies:
            sample = parse_metrics(body)
            assert sample.spec is not None, served.name
            ahead.append(sample.spec.draft_tokens / K - sample.spec.drafts)
            report = windows.observe([ScrapeResult(target, at, "ok", sample)], k_limit=K)
            excluded += report.violations.values()
            counted += sum(delta.drafts for delta in report.deltas.values())
        first, last = parse_metrics(bodies[0][1]).spec, parse_metrics(bodies[-1][1]).spec
        assert first is not None and last is not None
        print(f"{served.name}: {len(bodies)} scrapes under {CONCURRENT} concurrent clients; draft tokens ahead of "
              f"K x drafts in {sum(a > 0 for a in ahead)} of them, by up to {max(ahead):.1f} drafts")
        assert not excluded, (served.name, excluded[:3])
        assert counted == last.drafts - first.drafts > 0, (served.name, counted, first, last)
