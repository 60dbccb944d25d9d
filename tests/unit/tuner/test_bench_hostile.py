"""`bench hostile` runs end to end on loopback and reports every figure (the figures themselves are not judged)."""

from __future__ import annotations

import math

from specdec_operator.bench.hostile import format_table, run


async def test_the_hostile_bench_scrapes_every_pod_and_reports_each_figure() -> None:
    calm, attacked = await run(2, 1, rounds=2, interval_s=0.5, timeout_s=0.3)
    for figures in (calm, attacked):
        assert len(figures.round_s) == 2
        assert len(figures.pod_scrape_s) == 2 * 2  # two healthy pods, two rounds; the hostile model's left out
        assert len(figures.evaluation_s) == 2 * 2 and len(figures.model_round_s) == 2 * 2
    table = format_table(calm, attacked)
    assert "healthy model's round" in table and "per-model evaluation" in table
    assert all(math.isfinite(value) for value in calm.round_s + attacked.round_s)
