"""Object factories for the canary tests: healthy defaults, and one override per case."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from specdec_operator.api.spec import Canary, CanaryAnalysis, CanaryStep, Rollout
from specdec_operator.api.status import CanaryStatus
from specdec_operator.canary.analysis import Verdict, WindowStats
from specdec_operator.canary.histogram import Buckets
from specdec_operator.canary.plan import CanaryTarget
from tests.unit.canary.exposition import evidence_window

# vLLM 0.33's bucket bounds for vllm:request_time_per_output_token_seconds.
TPOT_BOUNDS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def buckets(observations_s: Sequence[float]) -> Buckets:
    """Cumulative `le` buckets (with +Inf) holding the given observations, as a counter delta would."""
    counts = [0] * (len(TPOT_BOUNDS) + 1)
    for value in observations_s:
        counts[bisect.bisect_left(TPOT_BOUNDS, value)] += 1
    cumulative: list[tuple[float, float]] = []
    running = 0
    for bound, count in zip((*TPOT_BOUNDS, math.inf), counts, strict=True):
        running += count
        cumulative.append((bound, float(running)))
    return tuple(cumulative)


def tpot_spread(centre_s: float, requests: int = 100) -> Buckets:
    """`requests` observations spread evenly over +-20% around `centre_s`."""
    return buckets([centre_s * (0.8 + 0.4 * i / (requests - 1)) for i in range(requests)])


def window(**overrides: Any) -> WindowStats:
    """A healthy 120 s window of one GPU at K=4: accepted length 2.7, 22.5 tokens/s, TPOT ~40 ms, 400 requests.

    Built as production builds it: the numbers become two vLLM /metrics scrapes of one pod, which
    go through the parser, the counter windows and the canary evidence (tests/unit/canary/exposition.py).
    """
    values: dict[str, Any] = {
        "seconds": 120.0,
        "gpus": 1,
        "k": 4,
        "drafts": 1000.0,
        "draft_tokens": 4000.0,
        "accepted_tokens": 1700.0,
        "generation_tokens": 2700.0,
        # Enough requests that a clean error count bounds the rate below 1% (the error gate needs its
        # upper confidence bound under the limit, not just a point estimate).
        "tpot_buckets": tpot_spread(0.040, 400),
        "requests": 400.0,
    }
    values.update(overrides)
    if "drafts" in overrides:
        # Fewer drafts propose and accept fewer tokens: the windows refuse counters vLLM cannot produce
        # (more draft tokens than K x drafts, tuner/window.py).
        if "draft_tokens" not in overrides:
            values["draft_tokens"] = values["k"] * values["drafts"]
        if "accepted_tokens" not in overrides:
            values["accepted_tokens"] = 1.7 * values["drafts"]
    return evidence_window(**values)


def thresholds(**overrides: Any) -> CanaryAnalysis:
    return CanaryAnalysis(**overrides)


def rollout(
    steps: Sequence[tuple[int, int]] = ((10, 120), (50, 120), (100, 0)),
    *,
    paused: bool = False,
    timeout_seconds: int = 900,
) -> Rollout:
    return Rollout(
        strategy="Canary",
        paused=paused,
        canary=Canary(
            steps=[CanaryStep(weight=weight, pause_seconds=pause) for weight, pause in steps],
            analysis=CanaryAnalysis(timeout_seconds=timeout_seconds),
        ),
    )


def target(desired: str = "rev-new", stable: str = "rev-old", k: int | None = None) -> CanaryTarget:
    return CanaryTarget(pool="llama-gfx942", stable_revision=stable, desired_revision=desired, desired_k=k)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def canary_status(**overrides: Any) -> CanaryStatus:
    """A canary running step 1 (10%) of revision rev-new since T0."""
    values: dict[str, Any] = {
        "pool": "llama-gfx942",
        "stable_revision": "rev-old",
        "canary_revision": "rev-new",
        "step": 0,
        "weight": 10,
        "phase": "Progressing",
        "step_started_at": stamp(0),
    }
    values.update(overrides)
    return CanaryStatus(**values)


PASS = Verdict("Pass", "ThresholdsMet", "accepted length 2.70 vs stable 2.71 (ratio 1.00 >= 0.90)")
FAIL = Verdict("Fail", "ThresholdsMissed", "accepted length 1.42 vs stable 2.71 (ratio 0.52 < 0.90)")
INCONCLUSIVE = Verdict("Inconclusive", "InsufficientSamples", "120 canary and 900 stable drafts over 60 s")
