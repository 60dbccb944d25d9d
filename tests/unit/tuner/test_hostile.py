"""Hostile /metrics through the real scrape path (issue 34): pods served on loopback by aiohttp, scraped by the
operator's scraper, fed to the tuner's windows and engine. A pod whose counters vLLM cannot produce is left out
and named; nothing raises, nothing non-finite reaches a status-bound value, and the other pods' evidence is the
same as if the hostile pod did not exist."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.api.status import SpeculationStatus
from specdec_operator.reconcile.tuning_inputs import speculation_status
from specdec_operator.tuner.engine import PoolContext, TunerReport, TunerState
from specdec_operator.tuner.samples import ScrapeResult, ScrapeTarget
from specdec_operator.tuner.scraper import scrape, scrape_session
from tests.unit.tuner.differential import data_parallel
from tests.unit.tuner.factories import BUCKETS, metrics_text

SPEC = Speculation(initial_k=3, min_k=0, max_k=8,
                   autotune=Autotune(interval_seconds=15, cooldown_seconds=60, min_samples=1000))
SCRAPE_INTERVAL_S = 15.0


def healthy_body(t: float) -> str:
    """A K=3 vLLM pod serving 100 drafts/s with conditional acceptance 0.8, 0.75, 0.75 since t=0."""
    drafts = 100.0 * t
    return metrics_text(drafts=drafts, per_position=(0.8 * drafts, 0.6 * drafts, 0.45 * drafts), step_s=0.03)


Body = Callable[[int, float], str]  # (scrape number, simulated time) -> the pod's /metrics


@dataclass
class LoopbackPod:
    name: str
    pool: str
    body: Body
    k: int = 3
    runner: web.AppRunner | None = None
    port: int = 0
    served: int = 0
    now: float = 0.0

    async def start(self) -> None:
        async def handle(_: web.Request) -> web.Response:
            text = self.body(self.served, self.now)
            self.served += 1
            return web.Response(text=text)

        app = web.Application()
        app.router.add_get("/metrics", handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    @property
    def target(self) -> ScrapeTarget:
        return ScrapeTarget(pod=f"ns/{self.name}", uid=self.name, ip="127.0.0.1", port=self.port, pool=self.pool,
                            revision="r1", k=self.k)


@dataclass
class Fleet:
    pods: list[LoopbackPod]
    pools: list[PoolContext] = field(default_factory=list)

    async def round(self, at: float) -> list[ScrapeResult]:
        for pod in self.pods:
            pod.now = at
        async with scrape_session(pool_size=8) as session:
            return await scrape([pod.target for pod in self.pods], timeout_s=30, concurrency=8, session=session,
                                clock=lambda: at)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., object]]:
    started: list[LoopbackPod] = []

    async def start(*pods: LoopbackPod) -> Fleet:
        for pod in pods:
            await pod.start()
            started.append(pod)
        pools = sorted({pod.pool for pod in pods})
        return Fleet(list(pods), [PoolContext(name=p, gfx_target="gfx942", drafter_method="eagle3", effective_k=3,
                                              replicas=2) for p in pools])

    yield start
    for pod in started:
        assert pod.runner is not None
        await pod.runner.cleanup()


def assert_status_bound_values_finite(report: TunerReport) -> None:
    """What would reach status: its JSON must hold no NaN or Infinity (the API server refuses them)."""
    status = speculation_status(SpeculationStatus(), report.stats, report.decision)
    json.dumps(status.model_dump(mode="json"), allow_nan=False)
    for decision in report.decisions:
        json.dumps(decision.model_dump(mode="json"), allow_nan=False)


async def run(fleet: Fleet, state: TunerState, rounds: int, skip: Sequence[str] = ()) -> TunerReport:
    """Scrape `rounds` rounds, evaluating after each; returns the last report. `skip`: pods whose results are
    withheld from this state (the control run that never saw the hostile pod)."""
    report = None
    for number in range(1, rounds + 1):
        at = number * SCRAPE_INTERVAL_S
        results = [r for r in await fleet.round(at) if r.target.uid not in skip]
        state.observe(fleet.pools, results, at, max_k=SPEC.max_k)
        report = state.evaluate(at, fleet.pools, SPEC)
        assert_status_bound_values_finite(report)
    assert report is not None
    return report


def _per_position_lies(_: int, t: float) -> str:
    drafts = 100.0 * t
    return metrics_text(drafts=drafts, per_position=(5 * drafts, 5 * drafts, 5 * drafts))


def _overflowing(number: int, _: float) -> str:
    # Counters that jump to near float max and restart every other scrape: each jump is an "increase".
    big = 1.7e308 if number % 2 else 0.0
    small = 1e300 if number % 2 else 0.0
    return metrics_text(drafts=big, per_position=(small, small, small), draft_tokens=big, created=100.0 + number // 2,
                        generation_tokens=big)


def _engine_sum_overflows(_: int, t: float) -> str:
    # Each engine's counters are finite; the pod's sum over its two engines is not.
    body = metrics_text(drafts=1e308 + t, per_position=(1e307, 1e306, 1e305), generation_tokens=1.5e308)
    return data_parallel(body, 2)


def _nan(_: int, t: float) -> str:
    drafts = 100.0 * t
    return metrics_text(drafts=drafts, per_position=(math.nan, 0.6 * drafts, 0.45 * drafts))


def _infinite(_: int, t: float) -> str:
    drafts = 100.0 * t
    return metrics_text(drafts=drafts, per_position=(0.8 * drafts, 0.6 * drafts, 0.45 * drafts),
                        generation_tokens=math.inf)


def _increase_beyond_any_gpu(_: int, t: float) -> str:
    drafts = 1e12 * t  # a trillion drafts a second
    return metrics_text(drafts=drafts, per_position=(0.8 * drafts, 0.6 * drafts, 0.45 * drafts))


def _five_hundred_positions(_: int, t: float) -> str:
    drafts = 100.0 * t
    return metrics_text(drafts=drafts, per_position=[drafts * 0.001] * 500, draft_tokens=drafts * 500)


def _draft_tokens_past_k(_: int, t: float) -> str:
    # Four draft tokens per draft at K=3, every interval: far past what one body's rendering can put ahead.
    drafts = 100.0 * t
    return metrics_text(drafts=drafts, per_position=(0.8 * drafts, 0.6 * drafts, 0.45 * drafts),
                        draft_tokens=4 * drafts)


HOSTILE = {
    "accepted-over-k-drafts": _per_position_lies,
    "draft-tokens-past-k": _draft_tokens_past_k,
    "float-overflow": _overflowing,
    "engine-sum-overflow": _engine_sum_overflows,
    "nan": _nan,
    "inf": _infinite,
    "implausible-rate": _increase_beyond_any_gpu,
    "500-positions": _five_hundred_positions,
}


@pytest.mark.parametrize("hostile", HOSTILE.values(), ids=HOSTILE.keys())
async def test_a_pod_with_impossible_counters_is_left_out_and_named(
    serve: Callable[..., object], hostile: Body
) -> None:
    fleet: Fleet = await serve(  # type: ignore[misc]
        LoopbackPod("good-a", "p1", lambda _, t: healthy_body(t)),
        LoopbackPod("liar", "p1", hostile),
        LoopbackPod("good-b", "p2", lambda _, t: healthy_body(t)),
    )
    state, control = TunerState(), TunerState()
    report = await run(fleet, state, 12)
    assert "ns/liar" in state.excluded_pods(), state.excluded_pods()
    assert state.excluded_pods()["ns/liar"]  # a reason
    assert not {"ns/good-a", "ns/good-b"} & set(state.excluded_pods())
    for pod in fleet.pods:
        pod.served = 0
    control_report = await run(fleet, control, 12, skip=("liar",))
    assert report.stats == control_report.stats, "the healthy pods' evidence changed"
    assert all(stats.drafts > 0 for stats in report.stats)
    assert max(len(s.per_position_acceptance) for s in report.stats) == 3


def _rendered_while_counting(number: int, t: float) -> str:
    """healthy_body's engine, its /metrics rendered while the engine goes on counting, as vLLM renders it (in a
    worker thread beside its event loop): in every other body the counters after the drafts were read 0.3 s
    later, 30 drafts' worth ahead."""
    drafts = 100.0 * t
    later = 100.0 * (t + (0.3 if number % 2 else 0.0))
    return metrics_text(drafts=drafts, per_position=(0.8 * later, 0.6 * later, 0.45 * later), draft_tokens=3 * later,
                        step_s=0.03)


async def test_counters_read_while_vllm_counts_are_not_a_lie(serve: Callable[..., object]) -> None:
    """Seen in CI on the real engine under load: 2115 draft tokens beside 697 drafts at K=3 in one body. One
    scrape is not a snapshot, so the pod stays in, and its evidence is what the same engine read at once gives."""
    fleet: Fleet = await serve(LoopbackPod("busy", "p1", _rendered_while_counting))  # type: ignore[misc]
    state = TunerState()
    report = await run(fleet, state, 12)
    assert not state.excluded_pods(), state.excluded_pods()
    (stats,) = report.stats
    snapshot: Fleet = await serve(LoopbackPod("busy", "p1", lambda _, t: healthy_body(t)))  # type: ignore[misc]
    (expected,) = (await run(snapshot, TunerState(), 12)).stats
    assert stats.drafts == expected.drafts > 0
    # Within what the last body read ahead (30 drafts' worth in a 1500-draft window): the skew does not add up.
    assert stats.per_position_acceptance == pytest.approx(expected.per_position_acceptance, rel=30 / 1500 + 1e-9)


async def test_a_tpot_layout_that_changes_every_scrape_keeps_the_windows_small(serve: Callable[..., object]) -> None:
    """The hostile pod shifts its TPOT bucket bounds at every scrape, once adding buckets too. Before, every new
    layout merged into the union of all earlier ones: the structures grew with every scrape (and each observe()
    with them, quadratically). Now a pool keeps one layout, of at most vLLM's size."""

    def shifting(number: int, t: float) -> str:
        body = healthy_body(t)
        for bound in BUCKETS:  # every bound moves a little, every scrape
            body = body.replace(f'le="{bound}",model_name="m"}}',
                                f'le="{bound * (1 + number * 1e-6)}",model_name="m"}}')
        return body

    fleet: Fleet = await serve(  # type: ignore[misc]
        LoopbackPod("good-a", "p1", lambda _, t: healthy_body(t)),
        LoopbackPod("shifty", "p1", shifting),
    )
    state = TunerState()
    most = 0
    for number in range(1, 121):
        at = number * SCRAPE_INTERVAL_S
        window_report = state.observe(fleet.pools, await fleet.round(at), at, max_k=SPEC.max_k)
        for delta in window_report.deltas.values():
            most = max(most, len(delta.tpot_buckets))
        most = max(most, state.histogram_buckets_held())
        if number % 4 == 0:
            assert_status_bound_values_finite(state.evaluate(at, fleet.pools, SPEC))
    assert most <= len(BUCKETS) + 1, f"{most} buckets held for a {len(BUCKETS) + 1}-bucket layout"
    assert "ns/shifty" in state.excluded_pods()
    assert "layout" in state.excluded_pods()["ns/shifty"]


async def test_five_hundred_position_series_create_no_k_and_are_not_kept(serve: Callable[..., object]) -> None:
    fleet: Fleet = await serve(LoopbackPod("wide", "p1", _five_hundred_positions, k=3))  # type: ignore[misc]
    state = TunerState()
    results: list[ScrapeResult] = []
    for number in range(1, 6):
        at = number * SCRAPE_INTERVAL_S
        results = await fleet.round(at)
        state.observe(fleet.pools, results, at, max_k=SPEC.max_k)
    (result,) = results
    assert result.sample is not None and result.sample.k <= SPEC.max_k
    report = state.evaluate(6 * SCRAPE_INTERVAL_S, fleet.pools, SPEC)
    assert state.ks_held() <= {3}
    assert all(len(stats.per_position_acceptance) <= SPEC.max_k for stats in report.stats)
    assert "ns/wide" in state.excluded_pods()


# --- no attack needed: K=0 for 30 hours (the default minK) ---


def test_thirty_hours_at_k0_never_divide_by_zero() -> None:
    """Ten minutes at K=3, then K=0 for 30 simulated hours, scraped and evaluated every minute on an injected
    clock. The K=3 evidence decays by half every 3 minutes; around hour 28 it used to reach the point where the
    Wilson interval's trials squared underflow to zero, and every evaluation raised ZeroDivisionError."""
    from tests.unit.tuner.factories import ok, target

    at_k3 = PoolContext(name="p", gfx_target="gfx942", drafter_method="eagle3", effective_k=3)
    at_k0 = PoolContext(name="p", gfx_target="gfx942", drafter_method="eagle3", effective_k=0)
    state = TunerState()
    minute = 60.0
    for step in range(1, 11):
        t = step * minute
        state.observe([at_k3], [ok(healthy_body(t), t, target(k=3))], t, max_k=SPEC.max_k)
    k0_started = 11 * minute
    for step in range(0, 30 * 60 + 1):
        t = k0_started + step * minute
        tokens = 500.0 * (t - k0_started)
        body = metrics_text(per_position=None, drafts=tokens, generation_tokens=tokens, created=k0_started)
        state.observe([at_k0], [ok(body, t, target("pod-k0", k=0))], t, max_k=SPEC.max_k)
        report = state.evaluate(t, [at_k0], SPEC)
        assert_status_bound_values_finite(report)
    assert state.ks_held() <= {0}, "evidence decayed to nothing is dropped, not kept at 1e-300"


# --- what the operator exports follows what exists now ---


def test_position_series_past_a_lowered_k_leave_the_operator_metrics() -> None:
    from specdec_operator.api.status import PoolSpeculationStats
    from specdec_operator.metrics import REGISTRY
    from specdec_operator.tuner.exporter import publish

    def report(rates: list[float]) -> TunerReport:
        stats = PoolSpeculationStats(pool="p", drafts=10, per_position_acceptance=rates)
        return TunerReport(stats=(stats,), decisions=(), decision=None, scrape_events={})

    labels = {"namespace": "ns", "model": "stale-k", "pool": "p"}
    publish("ns", "stale-k", report([0.8, 0.6, 0.45]))
    assert REGISTRY.get_sample_value("specdec_position_acceptance", {**labels, "position": "2"}) == 0.45
    publish("ns", "stale-k", report([0.8]))
    assert REGISTRY.get_sample_value("specdec_position_acceptance", {**labels, "position": "0"}) == 0.8
    for position in ("1", "2"):
        assert REGISTRY.get_sample_value("specdec_position_acceptance", {**labels, "position": position}) is None


async def test_an_excluded_pod_is_exported_until_it_is_gone(serve: Callable[..., object]) -> None:
    from specdec_operator.metrics import REGISTRY
    from specdec_operator.tuner.exporter import publish_exclusions

    fleet: Fleet = await serve(  # type: ignore[misc]
        LoopbackPod("good-a", "p1", lambda _, t: healthy_body(t)),
        LoopbackPod("liar", "p1", _per_position_lies),
    )
    state = TunerState()
    for number in range(1, 4):
        at = number * SCRAPE_INTERVAL_S
        state.observe(fleet.pools, await fleet.round(at), at, max_k=SPEC.max_k)
    publish_exclusions("ns", "exported", state.exclusions)
    labels = {"namespace": "ns", "model": "exported", "pool": "p1", "pod": "ns/liar"}
    assert REGISTRY.get_sample_value("specdec_pod_metrics_excluded", labels) == 1
    # The pod is deleted: its next round has only the healthy pod, and its exclusion and series go with it.
    at = 4 * SCRAPE_INTERVAL_S
    state.observe(fleet.pools, [r for r in await fleet.round(at) if r.target.uid != "liar"], at, max_k=SPEC.max_k)
    assert state.excluded_pods() == {}
    publish_exclusions("ns", "exported", state.exclusions)
    assert REGISTRY.get_sample_value("specdec_pod_metrics_excluded", labels) is None


def test_the_degraded_condition_names_excluded_pods() -> None:
    from specdec_operator.conditions import ConditionFacts, pod_metrics_finding, summarize

    finding = pod_metrics_finding([("ns/liar", "accepted tokens 15 > draft tokens 3")])
    updates = {update.type: update for update in summarize(ConditionFacts(ready="ok", pod_metrics_excluded=finding))}
    degraded = updates["Degraded"]
    assert degraded.status is True and degraded.reason == "PodMetricsExcluded"
    assert "ns/liar" in degraded.message and "accepted tokens 15 > draft tokens 3" in degraded.message
    assert updates["Ready"].status is True, "the model still serves"
    many = pod_metrics_finding([(f"ns/p{i}", "r") for i in range(10)])
    assert many is not None and "and 7 more" in many.message


def test_a_pool_that_is_gone_takes_its_history_with_it() -> None:
    from tests.unit.tuner.factories import ok, target

    p1 = PoolContext(name="p1", gfx_target="gfx942", drafter_method="eagle3", effective_k=3)
    p2 = PoolContext(name="p2", gfx_target="gfx90a", drafter_method="eagle3", effective_k=3)
    state = TunerState()
    for step in range(1, 4):
        t = step * SCRAPE_INTERVAL_S
        state.observe([p1, p2], [ok(healthy_body(t), t, target("a", pool="p1")),
                                 ok(healthy_body(t), t, target("b", pool="p2"))], t, max_k=SPEC.max_k)
    state.evaluate(4 * SCRAPE_INTERVAL_S, [p1, p2], SPEC)
    assert state.pools_held() == {"p1", "p2"}
    state.evaluate(5 * SCRAPE_INTERVAL_S, [p1], SPEC)
    assert state.pools_held() == {"p1"}


async def test_the_named_reason_stays_while_the_pod_keeps_lying(serve: Callable[..., object]) -> None:
    """Its numbers change every scrape; what status shows of it must not, or status is rewritten each pass. It is
    named at its second scrape: counters are related between scrapes (one body is not a snapshot, tuner/window.py),
    so the first only sets its baseline, which counts for nothing."""
    fleet: Fleet = await serve(LoopbackPod("liar", "p1", _per_position_lies))  # type: ignore[misc]
    state = TunerState()
    seen = []
    for number in range(1, 7):
        at = number * SCRAPE_INTERVAL_S
        state.observe(fleet.pools, await fleet.round(at), at, max_k=SPEC.max_k)
        seen.append(state.excluded_pods().get("ns/liar"))
    assert seen[0] is None and len(set(seen[1:])) == 1 and seen[1] is not None, seen
