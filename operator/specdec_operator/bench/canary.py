"""`specdec-operator bench canary`: many simulated canaries through the real analysis and step state machine.

Each trial is one canary of a K change (stable K=3, canary K=4, which the tuner predicts +10% goodput):
healthy, or with 1.5x TPOT, 5% failed requests, or acceptance per position down 30%; on pools of 1, 2, 4
and 8 replicas; with the default steps (replica-ratio split, no route) and the shipped example's steps
(examples/canary-httproute.yaml: an HTTPRoute, so the canary's per-pod load is not the stable's).

Requests arrive open-loop (Poisson) at `rate` per replica. Each finished request adds its tokens, its time
per output token (log-normal around the side's median, which grows with the per-pod running batch as a
decode step does), its drafts and accepted tokens per position, and maybe an error, to its side's window.
Every `interval` seconds (the reconcile period) the window goes through `canary.analysis.analyse` and the
verdict through `canary.progress.advance`, exactly as the operator runs them; a step change opens a fresh
window. A trial ends when the canary is Promoted or RolledBack. Seeded: the same arguments print the same
table. Figures, not asserts: `--check` compares them with the targets and exits 1 on a miss.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from specdec_operator.api.spec import Canary, CanaryAnalysis, CanaryStep, Rollout
from specdec_operator.api.status import CanaryStatus
from specdec_operator.canary.analysis import KChange, WindowStats, analyse
from specdec_operator.canary.plan import FULL_WEIGHT, CanaryTarget, split_replicas
from specdec_operator.canary.progress import advance

# Issue 21's targets.
TARGET_FALSE_ROLLBACK = 0.01  # of healthy canaries, at most
TARGET_DETECTION = 0.99  # of bad canaries, at least

SCENARIOS = ("healthy", "tpot+50%", "errors 5%", "acceptance-30%")
POOL_SIZES = (1, 2, 4, 8)
# vLLM 0.33's request_time_per_output_token_seconds buckets (vllm/v1/metrics/buckets.py).
TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
# Acceptance per draft position of a chat workload (the share of drafts whose first i+1 tokens are accepted).
POSITIONS = (0.80, 0.65, 0.55, 0.48)
STABLE_K, CANARY_K = 3, 4
BASE_TPOT_S = 0.012  # median time per output token at K=3 on an idle pod
LOAD_SLOPE = 0.02  # a decode step grows ~2% per running request (memory-bound decode at small batch)
DRAFT_COST = 0.06  # each drafted position adds ~6% to a step
TPOT_LOG_SD = 0.35  # per-request spread of TPOT across prompt and output lengths
BASELINE_ERROR_RATE = 0.002  # a healthy revision still fails a request now and then
OUTPUT_TOKENS = (64, 512)  # uniform output length range

STEP_SETS: dict[str, tuple[Canary, bool]] = {
    # Default steps and analysis (strategy: Canary alone); no route, so the split is the replica ratio.
    "default": (Canary(), False),
    # examples/canary-httproute.yaml: its steps and analysis, behind an HTTPRoute.
    "example": (Canary(steps=[CanaryStep(weight=10, pause_seconds=300), CanaryStep(weight=50, pause_seconds=300),
                              CanaryStep(weight=100, pause_seconds=0)],
                       analysis=CanaryAnalysis(min_accepted_length_ratio=0.9, max_tpot_ratio=1.15, max_error_rate=0.01,
                                               min_drafts=1000, timeout_seconds=1200)), True),
}
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def expected_length(positions: Sequence[float], k: int) -> float:
    return 1.0 + sum(positions[:k])


def step_factor(k: int) -> float:
    return 1.0 + DRAFT_COST * k


def predicted_gain() -> float:
    """What the tuner predicts for K 3 -> 4 at equal load: goodput per sequence is E(K) / step(K)."""
    return (expected_length(POSITIONS, CANARY_K) / step_factor(CANARY_K)) / (
        expected_length(POSITIONS, STABLE_K) / step_factor(STABLE_K)) - 1.0


@dataclass(frozen=True)
class Revision:
    k: int
    positions: tuple[float, ...]
    tpot_scale: float = 1.0
    error_rate: float = BASELINE_ERROR_RATE

    def median_tpot_s(self, batch: float) -> float:
        """Median time per output token at a per-pod running batch: step time over tokens per step."""
        step = step_factor(self.k) * (1.0 + LOAD_SLOPE * batch) / step_factor(STABLE_K)
        per_token = step * expected_length(POSITIONS, STABLE_K) / expected_length(self.positions, self.k)
        return BASE_TPOT_S * per_token * self.tpot_scale


def revisions(scenario: str) -> tuple[Revision, Revision]:
    stable = Revision(STABLE_K, POSITIONS)
    if scenario == "healthy":
        return stable, Revision(CANARY_K, POSITIONS)
    if scenario == "tpot+50%":
        return stable, Revision(CANARY_K, POSITIONS, tpot_scale=1.5)
    if scenario == "errors 5%":
        return stable, Revision(CANARY_K, POSITIONS, error_rate=0.05)
    if scenario == "acceptance-30%":
        return stable, Revision(CANARY_K, tuple(rate * 0.7 for rate in POSITIONS))
    raise ValueError(f"unknown scenario {scenario!r}")


@dataclass
class _Window:
    """One side's counters since the step started, as `CanaryWindows.stats` hands them to the analysis."""

    k: int
    pod_seconds: float = 0.0
    busy_seconds: float = 0.0
    generation_tokens: float = 0.0
    drafts: float = 0.0
    accepted: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    tpot_counts: list[int] = field(default_factory=lambda: [0] * (len(TPOT_BOUNDS) + 1))

    def stats(self) -> WindowStats:
        running, cumulative = 0, []
        for bound, count in zip((*TPOT_BOUNDS, math.inf), self.tpot_counts, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        return WindowStats(
            seconds=self.pod_seconds, gpus=1, k=self.k, drafts=self.drafts, draft_tokens=self.drafts * self.k,
            accepted_tokens=sum(self.accepted), generation_tokens=self.generation_tokens,
            tpot_buckets=tuple(cumulative) if self.requests else (), requests=float(self.requests),
            errors=float(self.errors), busy_seconds=self.busy_seconds, accepted_per_position=tuple(self.accepted),
        )


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    threshold, count, product = math.exp(-mean), 0, rng.random()
    while product > threshold:
        count += 1
        product *= rng.random()
    return count


def _serve(rng: random.Random, window: _Window, revision: Revision, arrivals: int, pods: int, dt: float,
           batch: float) -> None:
    """`arrivals` requests finish on this side within `dt` (steady state: finishes follow arrivals)."""
    window.pod_seconds += pods * dt
    median = revision.median_tpot_s(batch)
    if not window.accepted:
        window.accepted = [0.0] * revision.k
    for _ in range(arrivals):
        tokens = rng.randint(*OUTPUT_TOKENS)
        tpot = median * math.exp(rng.gauss(0.0, TPOT_LOG_SD))
        window.requests += 1
        window.errors += rng.random() < revision.error_rate
        window.generation_tokens += tokens
        window.busy_seconds += tokens * tpot
        window.tpot_counts[bisect.bisect_left(TPOT_BOUNDS, tpot)] += 1
        drafts = tokens / expected_length(revision.positions, revision.k)
        window.drafts += drafts
        for position in range(revision.k):
            window.accepted[position] += drafts * revision.positions[position]


@dataclass(frozen=True)
class Trial:
    outcome: str  # Promoted or RolledBack
    seconds: float
    reason: str  # the event's reason, with the verdict's reason when it failed


def _shares(pool: int, weight: int, routed: bool) -> tuple[int, int, float]:
    """(stable pods, canary pods, canary share of traffic) at a step."""
    stable, canary = split_replicas(pool, weight)
    if routed:
        # Behind an HTTPRoute the stable keeps every replica; the route's weight is the share.
        return pool if weight < FULL_WEIGHT else 0, canary, weight / FULL_WEIGHT
    return stable, canary, canary / (stable + canary)


def run_trial(scenario: str, pool: int, steps: str, rate_per_replica: float, interval_s: float,
              rng: random.Random) -> Trial:
    canary_settings, routed = STEP_SETS[steps]
    rollout = Rollout(strategy="Canary", canary=canary_settings)
    stable_rev, canary_rev = revisions(scenario)
    change = KChange(predicted_gain=predicted_gain())
    target = CanaryTarget("pool", "rev-stable", "rev-canary", desired_k=CANARY_K)
    total_rate = rate_per_replica * pool
    mean_request_s = sum(OUTPUT_TOKENS) / 2 * BASE_TPOT_S
    status: CanaryStatus | None = None
    now, step_key = T0, None
    windows = (_Window(STABLE_K), _Window(CANARY_K))
    limit = canary_settings.analysis.timeout_seconds * (len(canary_settings.steps) + 1) + 3600
    while (now - T0).total_seconds() < limit:
        verdict = None
        if status is not None and status.weight > 0:
            stable_stats, canary_stats = windows[0].stats(), windows[1].stats()
            stable_pods = _shares(pool, status.weight, routed)[0]
            verdict = analyse(canary_stats, stable_stats if stable_pods > 0 else None, canary_settings.analysis,
                              change)
        progress = advance(status, target=target, rollout=rollout, verdict=verdict, now=now, action=None,
                           canary_ready=True)
        status = progress.status
        assert status is not None
        if status.phase in ("Promoted", "RolledBack"):
            reason = progress.event.reason if progress.event else status.phase
            if verdict is not None and verdict.outcome == "Fail":
                reason = f"{reason}/{verdict.reason}"
            return Trial(status.phase, (now - T0).total_seconds(), reason)
        key = (status.step, status.step_started_at, status.weight)
        if key != step_key:
            step_key, windows = key, (_Window(STABLE_K), _Window(CANARY_K))
        if status.weight > 0:
            stable_pods, canary_pods, share = _shares(pool, status.weight, routed)
            for side, revision, pods, part in ((0, stable_rev, stable_pods, 1 - share),
                                               (1, canary_rev, canary_pods, share)):
                if pods <= 0:
                    continue
                arrivals = _poisson(rng, total_rate * part * interval_s)
                batch = total_rate * part / pods * mean_request_s  # Little's law, per pod
                _serve(rng, windows[side], revision, arrivals, pods, interval_s, batch)
        now += timedelta(seconds=interval_s)
    return Trial("RolledBack", (now - T0).total_seconds(), "BenchLimit")


@dataclass(frozen=True)
class Cell:
    steps: str
    pool: int
    scenario: str
    trials: tuple[Trial, ...]

    @property
    def rolled_back(self) -> int:
        return sum(trial.outcome == "RolledBack" for trial in self.trials)

    @property
    def median_s(self) -> float:
        return statistics.median(trial.seconds for trial in self.trials)

    @property
    def p90_s(self) -> float:
        ordered = sorted(trial.seconds for trial in self.trials)
        return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]

    def top_reason(self) -> str:
        counts: dict[str, int] = {}
        for trial in self.trials:
            counts[trial.reason] = counts.get(trial.reason, 0) + 1
        return max(counts, key=lambda reason: (counts[reason], reason))

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "pool": self.pool, "scenario": self.scenario, "trials": len(self.trials),
                "rolled_back": self.rolled_back, "median_s": self.median_s, "p90_s": self.p90_s,
                "top_reason": self.top_reason()}


def run_bench(trials: int, seed: int, rate_per_replica: float, interval_s: float,
              pools: Sequence[int] = POOL_SIZES, steps: Sequence[str] = tuple(STEP_SETS),
              scenarios: Sequence[str] = SCENARIOS) -> list[Cell]:
    cells = []
    for steps_index, steps_name in enumerate(steps):
        for pool in pools:
            for scenario_index, scenario in enumerate(scenarios):
                # One generator per cell, derived from the seed alone: a cell's figures do not depend on
                # which other cells run.
                rng = random.Random(f"{seed}/{steps_index}/{pool}/{scenario_index}")
                cells.append(Cell(steps_name, pool, scenario, tuple(
                    run_trial(scenario, pool, steps_name, rate_per_replica, interval_s, rng) for _ in range(trials))))
    return cells


def summarise(cells: Sequence[Cell]) -> dict[str, Any]:
    healthy = [trial for cell in cells if cell.scenario == "healthy" for trial in cell.trials]
    bad = [trial for cell in cells if cell.scenario != "healthy" for trial in cell.trials]
    false_rollback = sum(t.outcome == "RolledBack" for t in healthy) / len(healthy) if healthy else 0.0
    detection = sum(t.outcome == "RolledBack" for t in bad) / len(bad) if bad else 1.0
    default_healthy = [t.seconds for c in cells if c.scenario == "healthy" and c.steps == "default" for t in c.trials]
    default_bad = [t.seconds for c in cells if c.scenario != "healthy" and c.steps == "default" for t in c.trials]
    return {
        "healthy": len(healthy), "bad": len(bad),
        "false_rollback_rate": false_rollback, "detection_rate": detection,
        "median_s_to_promotion_default_steps": statistics.median(default_healthy) if default_healthy else None,
        "median_s_to_rollback_default_steps": statistics.median(default_bad) if default_bad else None,
        "targets": {"false_rollback_rate_max": TARGET_FALSE_ROLLBACK, "detection_rate_min": TARGET_DETECTION},
        "targets_met": false_rollback <= TARGET_FALSE_ROLLBACK and detection >= TARGET_DETECTION,
    }


def _pauses(steps: str) -> str:
    canary, routed = STEP_SETS[steps]
    listed = ", ".join(f"{step.weight}%/{step.pause_seconds}s" for step in canary.steps)
    return (f"{steps} steps {listed} ({'HTTPRoute' if routed else 'replica ratio'}; pauses sum to "
            f"{sum(step.pause_seconds for step in canary.steps)} s, timeout {canary.analysis.timeout_seconds} s, "
            f"minRequests {canary.analysis.min_requests})")


def format_table(cells: Sequence[Cell], summary: dict[str, Any], rate_per_replica: float, interval_s: float) -> str:
    lines = [
        f"canary bench: K {STABLE_K} -> {CANARY_K} (tuner-predicted goodput {predicted_gain():+.1%}), "
        f"{rate_per_replica:g} req/s per replica, verdict every {interval_s:g} s",
    ]
    for steps in dict.fromkeys(cell.steps for cell in cells):
        header = (f"{'pool':>4}  {'scenario':<15}{'trials':>7}{'rolled back':>13}{'median s':>10}{'p90 s':>8}"
                  "  top reason")
        lines += ["", _pauses(steps), header]
        for cell in (c for c in cells if c.steps == steps):
            share = cell.rolled_back / len(cell.trials)
            lines.append(f"{cell.pool:>4}  {cell.scenario:<15}{len(cell.trials):>7}{share:>13.1%}"
                         f"{cell.median_s:>10.0f}{cell.p90_s:>8.0f}  {cell.top_reason()}")
    met = "met" if summary["targets_met"] else "MISSED"
    promoted = summary["median_s_to_promotion_default_steps"]
    rolled = summary["median_s_to_rollback_default_steps"]
    lines += [
        "",
        f"false rollbacks {summary['false_rollback_rate']:.2%} of {summary['healthy']} healthy canaries "
        f"(target <= {TARGET_FALSE_ROLLBACK:.0%}); detection {summary['detection_rate']:.2%} of {summary['bad']} bad "
        f"ones (target >= {TARGET_DETECTION:.0%}): targets {met}",
    ]
    if promoted is not None and rolled is not None:
        lines.append(f"median time to a verdict on the default steps: {promoted:.0f} s to promote a healthy canary, "
                     f"{rolled:.0f} s to roll back a bad one (step pauses "
                     f"{' + '.join(f'{step.pause_seconds} s' for step in STEP_SETS['default'][0].steps)})")
    return "\n".join(lines) + "\n"
