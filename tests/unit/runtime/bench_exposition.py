"""Benchmark: one simulated vLLM's /metrics body, generate_latest (the old path) against the template.

Run: nice .venv/bin/python -m tests.unit.runtime.bench_exposition [RENDERS]
Prints median milliseconds per render; asserts nothing about speed (timings are flaky on shared
machines). test_sim_exposition.py checks both write the same bytes.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from prometheus_client import generate_latest

from specdec_runtime.simulator.server import Simulator
from specdec_runtime.simulator.vllm_cli import parse_serve_args
from tests.unit.runtime.simfactories import make_profile

SPEC = '{"method":"eagle","model":"org/drafter","num_speculative_tokens":%d}'


def serving_simulator(k: int, request_statuses: tuple[str, ...]) -> Simulator:
    """A loaded HTTP simulator after 10 min of its profile's traffic that has answered these requests.

    The fleet driver's pods are only scraped, so their request counter has no children; a pod that
    served completions has some, which generate_latest still renders.
    """
    argv = ["serve", "org/target", "--served-model-name", "org/target", "--profile", "unused.yaml", "--seed", "1"]
    if k:
        argv += ["--speculative-config", SPEC % k]
    clock_now = [1.7e9]
    simulator = Simulator(parse_serve_args(argv), make_profile(), lambda: clock_now[0])
    clock_now[0] += 600.0
    simulator.tick()
    for status in request_statuses:
        simulator.http_requests.labels("POST", status, "/v1/completions").inc()
    return simulator


def median_ms(render: Callable[[], object], renders: int) -> float:
    timings = []
    for _ in range(renders):
        started = time.perf_counter()
        render()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1e3


def main(renders: int) -> None:
    for k, statuses in ((0, ()), (3, ()), (7, ()), (3, ("2xx", "4xx", "5xx"))):
        simulator = serving_simulator(k, statuses)
        registry = simulator.replica.registry
        old = median_ms(lambda: generate_latest(registry).decode("utf-8"), renders)  # noqa: B023
        new = median_ms(simulator.replica.metrics_text, renders)
        same = simulator.replica.metrics_text() == generate_latest(registry).decode("utf-8")
        print(f"K={k}, {len(statuses)} request counter children: generate_latest {old:.3f} ms, "
              f"template {new:.3f} ms per render ({old / new:.1f}x; identical text: {same}; median of {renders})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
