"""One home for what a model's loop remembers, and one path that drops it (handlers/model_memory.py,
OperatorContext.forget); the clocks handlers/ reads come from the context."""

from __future__ import annotations

import aiohttp

from specdec_operator.handlers.model_memory import ModelTuner, Refusals
from specdec_operator.kube.retry import DownstreamBackoff
from specdec_operator.metrics import EFFECTIVE_K, REGISTRY, pool_series
from specdec_operator.tuner.engine import TunerState
from specdec_operator.tuner.samples import ScrapeTarget
from tests.unit.handlers.fakeapi import FakeKubeApi
from tests.unit.handlers.test_reconciler import context

KEY = ("team-a", "llama")
OTHER = ("team-a", "mistral")


def _target(uid: str) -> ScrapeTarget:
    return ScrapeTarget(pod=f"team-a/pod-{uid}", uid=uid, ip="127.0.0.1", port=9, pool="p", revision="r", k=3)


async def test_forget_drops_the_memory_the_services_working_sets_and_the_series_of_that_model_only(
    http: aiohttp.ClientSession,
) -> None:
    ctx = context(FakeKubeApi(), http)
    assert ctx.scrapes is not None
    for key in (KEY, OTHER):
        memory = ctx.model(*key)
        memory.tuner = ModelTuner(TunerState())
        memory.refusals = Refusals(DownstreamBackoff(1.0, 10.0))
        ctx.scrapes.want(key, [_target(key[1])])
        ctx.cache.model_changed(key, "ADDED", {"metadata": {"generation": 1}})
        pool_series(EFFECTIVE_K, *key, "p").set(3)
    ctx.depart(*KEY)

    ctx.forget(*KEY)

    assert ctx.known(*KEY) is None and ctx.known(*OTHER) is not None
    assert ctx.scrapes.models == {OTHER}
    # The watch cache forgot the model's last-seen metadata: the same event is a change again.
    assert ctx.cache.model_changed(KEY, "MODIFIED", {"metadata": {"generation": 1}})
    assert not ctx.cache.model_changed(OTHER, "MODIFIED", {"metadata": {"generation": 1}})
    labels = {"namespace": KEY[0], "model": KEY[1], "pool": "p"}
    assert REGISTRY.get_sample_value("specdec_effective_k", labels) is None
    assert REGISTRY.get_sample_value("specdec_effective_k", {**labels, "model": OTHER[1]}) == 3
    assert ctx.departures == {KEY: 1}  # kept across loops, by design


async def test_forget_tuner_stops_scraping_and_keeps_the_rest_of_the_memory(http: aiohttp.ClientSession) -> None:
    ctx = context(FakeKubeApi(), http)
    assert ctx.scrapes is not None
    memory = ctx.model(*KEY)
    memory.tuner = ModelTuner(TunerState())
    memory.route_rejection = ("HTTPRouteRefsNotResolved", "no grant")
    ctx.scrapes.want(KEY, [_target("a")])

    ctx.forget_tuner(*KEY)

    assert ctx.known(*KEY) is memory and memory.tuner is None
    assert memory.route_rejection == ("HTTPRouteRefsNotResolved", "no grant")
    assert ctx.scrapes.models == set()


async def test_status_stamps_come_from_the_injected_wall_clock(http: aiohttp.ClientSession) -> None:
    ctx = context(FakeKubeApi(), http)
    ctx.wall_clock = lambda: 1_764_750_030.9  # 2025-12-03T08:20:30.9Z
    assert ctx.stamp_now() == "2025-12-03T08:20:30Z"
