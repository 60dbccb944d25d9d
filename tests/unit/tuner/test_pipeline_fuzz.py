"""The tuner's whole pipeline under hostile exposition sequences: parse -> windows -> engine evaluation.

Each example is a fleet of three pods (two pools) scraped over a sequence of rounds at arbitrary times; every
body is built from hostile numbers (NaN, Infinity, negatives, values near float max, sums that overflow across
engines), with any number of position series, shifting histogram layouts and restarts in between. No exception
may escape, and nothing non-finite may reach a value bound for status.
"""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.api.status import SpeculationStatus
from specdec_operator.reconcile.tuning_inputs import speculation_status
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.samples import MetricsParseError, ScrapeOutcome, ScrapeResult, parse_metrics
from tests.unit.tuner.differential import data_parallel
from tests.unit.tuner.factories import BUCKETS, metrics_text, target

SPEC = Speculation(initial_k=3, min_k=0, max_k=8,
                   autotune=Autotune(interval_seconds=15, cooldown_seconds=60, min_samples=100))

NUMBERS = st.one_of(
    st.floats(min_value=0, max_value=1e6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, 1e15, 1e300, 1.7e308, -1.0, math.nan, math.inf, -math.inf, 5e-324]),
)


@st.composite
def personas(draw: st.DrawFn) -> dict[str, object]:
    """How one pod lies, fixed for the sequence (a pod's lies are consistent enough to be counted)."""
    return {
        "kind": draw(st.sampled_from(["healthy", "impossible", "impossible", "hostile", "garbage"])),
        "scale": draw(st.sampled_from([1.0, 1e6, 1e12, 1e300, 1e307])),
        "factors": draw(st.lists(st.floats(0, 10), max_size=draw(st.sampled_from([4, 20, 40])))),
        "draft_share": draw(st.floats(0, 50)),
        "generated": draw(st.floats(0, 3)),
        "step_s": draw(st.sampled_from([0.03, 1e-300, 1e300])),
        "engines": draw(st.sampled_from([1, 1, 2, 3])),
    }


@st.composite
def bodies(draw: st.DrawFn, persona: dict[str, object], step: int) -> str:
    """The pod's body at round `step`: its counters grow with `step` in the persona's proportions; any round
    may also restart it, shift its histogram layouts, or carry hostile numbers."""
    grow = float(step * 1000)
    kind = persona["kind"] if draw(st.integers(0, 5)) else draw(st.sampled_from(["healthy", "hostile", "garbage"]))
    created = draw(st.sampled_from([100.0, 100.0, 100.0 + step, None]))
    if kind == "garbage":
        return draw(st.sampled_from(["", "\x00\x01{{{\n", "vllm:generation_tokens_total 1", metrics_text()[:300]]))
    if kind == "healthy":
        body = metrics_text(drafts=grow, per_position=(0.8 * grow, 0.6 * grow, 0.45 * grow), created=created)
    elif kind == "impossible":
        # Finite counters that grow from round to round, in proportions and at rates vLLM cannot produce.
        drafts = grow * float(persona["scale"])  # type: ignore[arg-type]
        factors: list[float] = persona["factors"]  # type: ignore[assignment]
        body = metrics_text(
            drafts=drafts, per_position=tuple(drafts * f for f in factors) or None,
            draft_tokens=drafts * float(persona["draft_share"]),  # type: ignore[arg-type]
            generation_tokens=drafts * float(persona["generated"]),  # type: ignore[arg-type]
            step_s=float(persona["step_s"]), created=created,  # type: ignore[arg-type]
        )
    else:
        positions = draw(st.one_of(st.none(), st.lists(NUMBERS, max_size=20)))
        body = metrics_text(
            drafts=draw(NUMBERS), per_position=positions, draft_tokens=draw(st.one_of(st.none(), NUMBERS)),
            generation_tokens=draw(st.one_of(st.none(), NUMBERS)), running=draw(NUMBERS),
            step_s=draw(st.sampled_from([0.03, 0.0, 1e300, math.inf])), created=created,
        )
    if draw(st.integers(0, 3)) == 0:  # shift the histogram layouts
        factor = draw(st.sampled_from([1.000001, 2.0, 1e-300]))
        for bound in BUCKETS[: draw(st.integers(1, len(BUCKETS)))]:
            body = body.replace(f'le="{bound}"', f'le="{bound * factor}"')
    engines: int = persona["engines"]  # type: ignore[assignment]
    return data_parallel(body, engines) if engines > 1 else body  # engines' sums may overflow


@st.composite
def rounds(draw: st.DrawFn) -> list[tuple[float, list[tuple[str, int]], list[int]]]:
    """(time gap, one (body, restart count) per pod, each pool's effective K) per round."""
    count = draw(st.integers(1, 14))
    pods = [draw(personas()) for _ in range(3)]
    plan = []
    for step in range(1, count + 1):
        gap = draw(st.sampled_from([15.0, 15.0, 15.0, 0.0, 1e-9, 3600.0, 1e6]))
        bodies_now = [(draw(bodies(persona, step)), draw(st.sampled_from([0, 0, 0, 1]))) for persona in pods]
        plan.append((gap, bodies_now, [draw(st.sampled_from([3, 3, 0, 8])), draw(st.integers(0, 8))]))
    return plan


def _result(uid: str, pool: str, body: str, at: float, restarts: int) -> ScrapeResult:
    try:
        sample = parse_metrics(body)
    except MetricsParseError as err:
        return ScrapeResult(target(uid, pool=pool, restart_count=restarts), at, "parse_error", error=str(err))
    outcome: ScrapeOutcome = "ok" if sample.complete else "incomplete"
    return ScrapeResult(target(uid, k=min(sample.k, 8), pool=pool, restart_count=restarts), at, outcome, sample)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rounds())
def test_no_hostile_sequence_escapes_the_pipeline_or_reaches_status_non_finite(
    plan: list[tuple[float, list[tuple[str, int]], list[int]]],
) -> None:
    state = TunerState()
    at = 0.0
    for gap, pods, ks in plan:
        at += gap
        pools = [PoolContext(name=f"p{i}", gfx_target="gfx942", drafter_method="eagle3", effective_k=k, replicas=2)
                 for i, k in enumerate(ks)]
        results = [_result(f"pod-{i}", f"p{min(i, 1)}", body, at, restarts)
                   for i, (body, restarts) in enumerate(pods)]
        state.observe(pools, results, at, max_k=SPEC.max_k)
        report = state.evaluate(at, pools, SPEC)
        status = speculation_status(SpeculationStatus(), report.stats, report.decision)
        json.dumps(status.model_dump(mode="json"), allow_nan=False)
        for decision in report.decisions:
            json.dumps(decision.model_dump(mode="json"), allow_nan=False)
        assert all(stats.drafts < 2**63 for stats in report.stats), "status.pools[].drafts is an int64"
        assert state.ks_held() <= set(range(SPEC.max_k + 1))
        assert state.histogram_buckets_held() <= len(BUCKETS) + 1
