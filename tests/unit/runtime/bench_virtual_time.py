"""Benchmark: replay 6 h of a profile's fleet in virtual time, scraping every 15 s like the operator.

Run: .venv/bin/python -m tests.unit.runtime.bench_virtual_time [PROFILE ...]
Prints figures; asserts nothing about speed (timing asserts are flaky on shared CI machines).
"""

from __future__ import annotations

import sys
import time

from prometheus_client.parser import text_string_to_metric_families

from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.profile import load_profile, resolve_profile
from specdec_runtime.simulator.virtual import ReplicaUnavailable, VirtualReplica

HOURS = 6
SCRAPE_INTERVAL_S = 15


def replay(profile_name: str) -> None:
    profile = load_profile(resolve_profile(profile_name))
    spec = SpeculativeSettings(method="eagle", model="drafter", num_speculative_tokens=3)
    replicas = [VirtualReplica(profile, spec, model_name="m", seed=i) for i in range(profile.replicas)]
    advance_s = render_s = parse_s = 0.0
    scrapes = 0
    for t in range(0, HOURS * 3600 + 1, SCRAPE_INTERVAL_S):
        for replica in replicas:
            started = time.perf_counter()
            replica.advance_to(float(t))
            rendered = time.perf_counter()
            advance_s += rendered - started
            try:
                text = replica.metrics_text()
            except ReplicaUnavailable:
                continue
            parsed = time.perf_counter()
            render_s += parsed - rendered
            list(text_string_to_metric_families(text))
            parse_s += time.perf_counter() - parsed
            scrapes += 1
    steps = sum(replica.engine.steps for replica in replicas)
    print(
        f"{profile_name}: {HOURS} h x {len(replicas)} replicas, {steps:,} engine steps: advance {advance_s:.2f} s; "
        f"{scrapes:,} scrapes: metrics_text {render_s:.2f} s, prometheus_client parse {parse_s:.2f} s"
    )


def main(names: list[str]) -> None:
    for name in names or ["default"]:
        replay(name)


if __name__ == "__main__":
    main(sys.argv[1:])
