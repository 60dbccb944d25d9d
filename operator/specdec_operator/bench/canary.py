"""`specdec-operator bench canary`: simulated canaries replayed through `canary replay`'s entry point.

Every trial renders, every scrape interval, each pod's vLLM `/metrics` text, and hands the round to
`canary.replay.Replayer`: the operator's parser, counter windows, canary evidence, analysis and step
machine decide, nothing is reimplemented here. The traffic has the variety the analysis does not assume:

- heavy-tailed output lengths (log-normal, median 180 tokens, sigma 1.0, up to 4096) and prompt lengths;
- per-request acceptance spread (each request's per-token acceptance drawn from a Beta around the mean);
- pod-to-pod speed spread (1% to 5% log-sd per pod, drawn per trial: the analysis assumes 3% until pods say
  otherwise) and per-interval batch noise shared by a pod's requests;
- 1 to 4 requests/s per pod, pool sizes 1 to 16, equal per-pod load by construction (the route's weights
  follow the replica split: ceil(n x weight) canary pods beside the rest of the pool);
- load drift (the offered load doubles over the canary), mix bursts (long prompts and outputs on both
  sides for a while), counter resets (stable pods restart, scrapes go missing);
- the default steps (replica split, no route) and the shipped example's (HTTPRoute).

Classes are judged one by one: false rollbacks of each healthy class and detection of each bad one. An
A/A class (identical revisions) also gives the calibration table: per gate, the share of windows whose
fixed-sample equality test rejects at 5% (the standard errors are right when that share is near 5%), and
the share that the gate itself fails at its stated sequential level. Under each class table, the speed floor:
for classes that only speed tells apart, the least error the pods' hardware leaves any analysis
(`speed_floors`). Seeded: the same arguments print the same tables. Figures, not asserts: `--check` compares them
with the targets and exits 1 on a miss.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specdec_operator.api.spec import Canary, CanaryAnalysis, CanaryStep
from specdec_operator.canary.analysis import Verdict, WindowStats, calibration_statistics
from specdec_operator.canary.plan import equal_load_percent, split_canary_replicas
from specdec_operator.canary.replay import Record, Replayer, ReplaySpec, Role

TARGET_FALSE_ROLLBACK = 0.01  # of each healthy class, at most
TARGET_DETECTION = 0.99  # of each bad class, at least
CALIBRATION_LEVEL = 0.05  # the fixed-sample level of the A/A table
CALIBRATION_FACTOR = 2.0  # each gate's A/A rejection share within this factor of its level
FLOOR_SHOWN = 0.001  # speed floors below this are left out of the tables (kept in --json)

TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LENGTH_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
POOL_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
RATES = (1.0, 2.0, 3.0, 4.0)
STABLE_K, CANARY_K = 3, 4
PREDICTED_GAIN = 0.10  # what the tuner predicts for K 3 -> 4 in the K-change classes
MEAN_ACCEPTANCE = 0.62  # per-token acceptance, mean over requests
ACCEPTANCE_CONCENTRATION = 6.0  # Beta(a, b) with a + b this: requests differ a lot
# (share of requests, mean per-token acceptance) of two kinds of request, each Beta with a + b =
# KIND_CONCENTRATION around its mean: code drafts well, chat poorly; the mean over requests stays near
# MEAN_ACCEPTANCE.
CODE_AND_CHAT = ((0.5, 0.90), (0.5, 0.35))
_KIND_SHARES = tuple(share for share, _ in CODE_AND_CHAT)
_KIND_MEANS = tuple(mean for _, mean in CODE_AND_CHAT)
KIND_CONCENTRATION = 20.0
BASE_STEP_S = 0.030  # an engine step at K=3 on an idle pod
LOAD_SLOPE = 0.02  # a decode step grows ~2% per running request
POD_SPEED_SDS = (0.01, 0.02, 0.03, 0.04, 0.05)  # how much a trial's pods differ; one drawn per trial
INTERVAL_NOISE_SD = 0.04  # a pod's step time wanders with its batch from interval to interval
REQUEST_NOISE_SD = 0.10
BASELINE_ERROR_RATE = 0.002
CLEAN_TRIALS = 0.5  # the share of trials without background errors


@dataclass(frozen=True)
class Scenario:
    """What differs between the canary and the stable, and what the traffic does."""

    name: str
    healthy: bool
    k_change: bool = True  # canary K (CANARY_K unless `canary_k` says) against stable K 3
    canary_k: int = CANARY_K
    predicted_gain: float = PREDICTED_GAIN  # what the tuner predicted for the K change
    true_gain: float = PREDICTED_GAIN  # goodput the K change really brings (healthy: what was predicted)
    canary_step_factor: float = 1.0  # canary engine steps slower by this (after the K change's own cost)
    canary_error_rate: float = BASELINE_ERROR_RATE
    canary_acceptance_factor: float = 1.0
    canary_stall_share: float = 0.0  # share of canary requests that stall (TPOT x5): a tail regression
    full_step_error_rate: float | None = None  # the canary's error rate once it has all the traffic (100% step)
    drift: bool = False  # offered load doubles over the canary
    bursts: bool = False  # long-prompt/long-output bursts on both sides
    code_and_chat: bool = False  # requests of two kinds (CODE_AND_CHAT) instead of one Beta around the mean
    resets: bool = False  # stable pods restart (counter resets) and scrapes go missing


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("A/A identical", True, k_change=False, true_gain=0.0),
    Scenario("K change", True),
    Scenario("K +8% (pred. +10%)", True, true_gain=0.08),
    # A prediction far off in the good direction (a step model from priors that do not fit the engine): the
    # change still gains, so rolling it back would give up a real improvement.
    Scenario("K +25% (pred. +80%)", True, predicted_gain=0.80, true_gain=0.25),
    Scenario("load doubles", True, drift=True),
    Scenario("mix bursts", True, bursts=True),
    Scenario("counter resets", True, resets=True),
    Scenario("TPOT +20%", False, k_change=False, true_gain=0.0, canary_step_factor=1.2),
    Scenario("errors 2%", False, canary_error_rate=0.02),
    Scenario("acceptance -15%", False, k_change=False, true_gain=0.0, canary_acceptance_factor=0.85),
    # A K change predicted +10% that delivers 10% less goodput than the stable: 9% below its limit.
    Scenario("goodput -10%", False, true_gain=-0.10),
    Scenario("p99 x3", False, k_change=False, true_gain=0.0, canary_stall_share=0.03),
    # Healthy through every analysed step, failing once the stable no longer serves (a dependency only the full
    # load reaches): the last step must judge its own window.
    Scenario("errors 5% at 100%", False, k_change=False, true_gain=0.0, full_step_error_rate=0.05),
    # Requests of two kinds, as code and chat share a deployment, and a K change as long as the tuner makes
    # them: every per-position rate moves (fewer of the drafts are the well-accepted kind's at a higher K,
    # 0.84x at position 3 here) though no request accepts less. Last, so that the classes before it keep
    # their trials. (At K 6 the same +10% leaves each step 3% slower, and chat requests, whose accepted
    # length K barely moves, that much slower: a TPOT margin as narrow as K +8%'s goodput one, a second
    # probe of one canary pod's hardware rather than of acceptance.)
    Scenario("K 3 -> 5, code + chat", True, canary_k=5, code_and_chat=True),
)

EXAMPLE_ANALYSIS = CanaryAnalysis(min_accepted_length_ratio=0.9, max_tpot_ratio=1.15, max_error_rate=0.01,
                                  min_drafts=1000, timeout_seconds=1200)
STEP_SETS: dict[str, tuple[Canary, bool]] = {
    # Default steps and analysis (strategy: Canary alone); no route, so the split is the replica ratio.
    "default": (Canary(), False),
    # examples/canary-httproute.yaml: its steps and analysis, behind an HTTPRoute.
    "example": (Canary(steps=[CanaryStep(weight=10, pause_seconds=300), CanaryStep(weight=50, pause_seconds=300),
                              CanaryStep(weight=100, pause_seconds=0)], analysis=EXAMPLE_ANALYSIS), True),
}
GATES = ("goodput", "tpot_p90", "tpot_p99", "acceptance", "errors", "load", "lengths")
ONE_SIDED = {"goodput", "tpot_p90", "tpot_p99", "acceptance", "errors"}
Z_ONE_SIDED = 1.6448536269514722


@dataclass
class _Pod:
    """One vLLM pod's cumulative counters."""

    name: str
    k: int
    speed: float
    restarts: int = 0
    created: float = 1_764_500_000.0
    generation: float = 0.0
    drafts: float = 0.0
    accepted: list[float] = field(default_factory=list)
    itl_sum: float = 0.0
    tpot: list[int] = field(default_factory=lambda: [0] * (len(TPOT_BOUNDS) + 1))
    tpot_sum: float = 0.0
    prompts: list[int] = field(default_factory=lambda: [0] * (len(LENGTH_BOUNDS) + 1))
    outputs: list[int] = field(default_factory=lambda: [0] * (len(LENGTH_BOUNDS) + 1))
    finished: int = 0
    errored: int = 0
    running: float = 0.0

    def __post_init__(self) -> None:
        self.accepted = [0.0] * self.k

    def reset(self, at: float) -> None:
        fresh = _Pod(self.name, self.k, self.speed, self.restarts + 1, at)
        self.__dict__.update(fresh.__dict__)

    def metrics(self) -> str:
        labels = 'model_name="m",engine="0"'
        lines = [f"vllm:num_requests_running{{{labels}}} {self.running:.3f}",
                 f"vllm:generation_tokens_total{{{labels}}} {self.generation:.1f}",
                 f"vllm:generation_tokens_created{{{labels}}} {self.created:.1f}",
                 f"vllm:spec_decode_num_drafts_total{{{labels}}} {self.drafts:.1f}",
                 f"vllm:spec_decode_num_drafts_created{{{labels}}} {self.created:.1f}",
                 f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {self.drafts * self.k:.1f}",
                 f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {sum(self.accepted):.1f}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {value:.1f}'
                  for i, value in enumerate(self.accepted)]
        lines += [f'vllm:inter_token_latency_seconds_bucket{{{labels},le="+Inf"}} {self.drafts:.1f}',
                  f"vllm:inter_token_latency_seconds_sum{{{labels}}} {self.itl_sum:.4f}",
                  f"vllm:inter_token_latency_seconds_count{{{labels}}} {self.drafts:.1f}"]
        lines += _histogram("vllm:request_time_per_output_token_seconds", labels, TPOT_BOUNDS, self.tpot,
                            self.tpot_sum)
        lines += _histogram("vllm:request_prompt_tokens", labels, LENGTH_BOUNDS, self.prompts, 0.0)
        lines += _histogram("vllm:request_generation_tokens", labels, LENGTH_BOUNDS, self.outputs, 0.0)
        lines += [f'vllm:request_success_total{{{labels},finished_reason="stop"}} {self.finished - self.errored}',
                  f'vllm:request_success_total{{{labels},finished_reason="error"}} {self.errored}']
        return "\n".join(lines) + "\n"


def _histogram(name: str, labels: str, bounds: Sequence[float], counts: list[int], total: float) -> list[str]:
    lines, running = [], 0
    for bound, count in zip((*bounds, math.inf), counts, strict=True):
        running += count
        le = "+Inf" if math.isinf(bound) else repr(float(bound))
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
    return [*lines, f"{name}_sum{{{labels}}} {total:.4f}", f"{name}_count{{{labels}}} {running}"]


def _poisson(rng: random.Random, mean: float) -> int:
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


@dataclass(frozen=True)
class _Side:
    """How one side's pods serve (the canary's or the stable's): their K, engine step, acceptance, errors, stalls."""

    k: int
    step_s: float
    alpha_mean: float
    error_rate: float
    stall_share: float = 0.0
    code_and_chat: bool = False


@dataclass
class _Trial:
    scenario: Scenario
    steps: str
    pool: int
    rate: float
    seed: int
    interval: float

    def spec(self) -> ReplaySpec:
        canary, _ = STEP_SETS[self.steps]
        if self.scenario.k_change:
            return ReplaySpec(canary=canary, pool="bench", stable_k=STABLE_K, canary_k=self.scenario.canary_k,
                              predicted_gain=self.scenario.predicted_gain, replicas=self.pool)
        return ReplaySpec(canary=canary, pool="bench", stable_k=STABLE_K, canary_k=STABLE_K, replicas=self.pool)


def _sizes(pool: int, weight: int) -> tuple[int, int]:
    """(canary pods, stable pods) at a weight: the operator's own split (`split_canary_replicas`), so the bench runs
    the pods a step runs; a one-replica pool surges by a replica. At 100% the stable serves nothing."""
    stable, canary = split_canary_replicas(pool, weight)
    return canary, stable


def _accepted_length(alpha: float, k: int) -> float:
    return 1.0 + sum(alpha ** (i + 1) for i in range(k))


def _canary_step_s(scenario: Scenario) -> float:
    """The canary's engine step on an idle pod: a K change's step costs what its true gain does not deliver."""
    canary_k = scenario.canary_k if scenario.k_change else STABLE_K
    length_ratio = _accepted_length(MEAN_ACCEPTANCE, canary_k) / _accepted_length(MEAN_ACCEPTANCE, STABLE_K)
    return BASE_STEP_S * length_ratio / (1 + scenario.true_gain) * scenario.canary_step_factor


def _loaded_step_s(step_s: float, rate: float) -> float:
    """An engine step at an offered load: the batch the pod runs (Little's law) slows every step, so a slower step
    makes a larger batch and slower steps again."""
    batch = rate * 180 * 2.2 * step_s
    return step_s * (1 + LOAD_SLOPE * batch)


def run_trial(trial: _Trial, sink: list[Record] | None = None
              ) -> tuple[str, str, float, list[tuple[WindowStats, WindowStats]]]:
    """(outcome, reason, seconds to the outcome, the last analysed window of each step with a baseline).
    `sink` receives every record replayed: a recording `canary replay` reads back."""
    rng = random.Random(trial.seed)
    scenario = trial.scenario
    spec = trial.spec()
    _, routed = STEP_SETS[trial.steps]
    last_windows: dict[int, tuple[WindowStats, WindowStats]] = {}

    def on_verdict(step: int, canary: WindowStats, stable: WindowStats | None, verdict: Verdict) -> None:
        if stable is not None:
            last_windows[step] = (canary, stable)

    replayer = Replayer(spec, on_verdict=on_verdict)
    canary_k = scenario.canary_k if scenario.k_change else STABLE_K
    pods: dict[str, _Pod] = {}
    canary_step = _canary_step_s(scenario)
    alpha_canary = MEAN_ACCEPTANCE * scenario.canary_acceptance_factor
    # Half the trials serve without background errors, so a regression the analysis reads as waiting for requests
    # is never caught by a stray error alone. Drawn apart from the traffic, which stays the same draw for draw.
    background = 0.0 if random.Random(f"{trial.seed}/background").random() < CLEAN_TRIALS else BASELINE_ERROR_RATE
    pod_speed_sd = random.Random(f"{trial.seed}/pods").choice(POD_SPEED_SDS)
    canary_errors = background if scenario.canary_error_rate == BASELINE_ERROR_RATE else scenario.canary_error_rate
    canary_side = _Side(canary_k, canary_step, alpha_canary, canary_errors, scenario.canary_stall_share,
                        scenario.code_and_chat)
    stable_side = _Side(STABLE_K, BASE_STEP_S, MEAN_ACCEPTANCE, background, code_and_chat=scenario.code_and_chat)
    canary_settings = spec.canary
    # The load of the `drift` class doubles over the first third of the steps' pauses and timeouts.
    ramp_s = (sum(step.pause_seconds for step in canary_settings.steps)
              + canary_settings.analysis.timeout_seconds * len(canary_settings.steps) + 600) / 3
    # Each step ends by its pause, its timeout or, held for traffic, the quiet hold's end: a trial runs until the
    # canary is decided, so a hold is never counted as an outcome it has not reached.
    horizon = sum(max(step.pause_seconds, canary_settings.analysis.timeout_seconds,
                      canary_settings.insufficient_traffic.max_wait_seconds) for step in canary_settings.steps) + 600
    at = 1_764_500_000.0
    started = at
    burst_until = -1.0
    while not replayer.finished and at - started < horizon:
        weight = replayer.weight
        sizing = weight or canary_settings.steps[0].weight
        if replayer.status is not None and weight == 0:
            sizing = canary_settings.steps[min(replayer.status.step, len(canary_settings.steps) - 1)].weight
        n_canary, n_stable = _sizes(trial.pool, sizing)
        drift = 1.0 + (min(1.0, (at - started) / max(ramp_s, 1.0)) if scenario.drift else 0.0)
        if scenario.bursts and at > burst_until and rng.random() < 0.05:
            burst_until = at + rng.uniform(30, 90)
        burst = at <= burst_until
        records = []
        canary_now = canary_side
        if scenario.full_step_error_rate is not None and weight >= 100:
            canary_now = replace(canary_side, error_rate=scenario.full_step_error_rate)
        roles: tuple[tuple[Role, int, _Side], ...] = (
            ("canary", n_canary, canary_now),
            ("stable", n_stable, stable_side),
        )
        for role, count, side in roles:
            for index in range(count):
                name = f"{role}-{index}"
                pod = pods.get(name)
                if pod is None:
                    pod = pods[name] = _Pod(name, side.k, math.exp(rng.gauss(0.0, pod_speed_sd)), created=at)
                if weight > 0 or role == "stable":
                    _serve(pod, rng, trial.rate * drift, trial.interval, side, burst)
                if scenario.resets and role == "stable" and rng.random() < 0.01:
                    pod.reset(at)
                missing = scenario.resets and rng.random() < 0.03
                records.append(Record(at=at, pod=name, role=role, metrics=None if missing else pod.metrics(),
                                      restarts=pod.restarts, weight=equal_load_percent(trial.pool, sizing) if routed
                                      else None))
        replayer.round(records)
        if sink is not None:
            sink.extend(records)
        at += trial.interval
    result = replayer.finish()
    return result.outcome, result.reason, result.seconds, list(last_windows.values())


def recording(records: Sequence[Record], header: dict[str, Any]) -> str:
    """A recording in `canary replay`'s format: the YAML header, then one JSON object per record."""
    import json

    import yaml

    lines = [yaml.safe_dump(header, sort_keys=False).rstrip(), "---"]
    for record in records:
        line: dict[str, Any] = {"t": record.at, "pod": record.pod, "role": record.role, "phase": record.phase,
                                "ready": record.ready, "restarts": record.restarts, "weight": record.weight,
                                "metrics": record.metrics}
        lines.append(json.dumps(line, separators=(",", ":")))
    return "\n".join(lines) + "\n"


def _serve(pod: _Pod, rng: random.Random, rate: float, interval: float, side: _Side, burst: bool) -> None:
    """One interval of open-loop traffic on one pod: requests finish with their tokens, drafts, TPOT, lengths."""
    step_s, alpha_mean, error_rate, stall_share = side.step_s, side.alpha_mean, side.error_rate, side.stall_share
    arrivals = _poisson(rng, rate * interval)
    concentration = ACCEPTANCE_CONCENTRATION
    a, b = alpha_mean * concentration, (1 - alpha_mean) * concentration
    step = _loaded_step_s(step_s, rate) * pod.speed * math.exp(rng.gauss(0.0, INTERVAL_NOISE_SD))
    busy = 0.0
    for _ in range(arrivals):
        output = min(4096, max(1, round(math.exp(rng.gauss(math.log(360 if burst else 180), 1.0)))))
        prompt = min(16000, max(1, round(math.exp(rng.gauss(math.log(2400 if burst else 600), 0.9)))))
        if side.code_and_chat:
            kind = rng.choices(_KIND_MEANS, _KIND_SHARES)[0]
            mean = kind * (alpha_mean / MEAN_ACCEPTANCE)
            alpha = rng.betavariate(mean * KIND_CONCENTRATION, (1 - mean) * KIND_CONCENTRATION)
        else:
            alpha = rng.betavariate(a, b) if a > 0 and b > 0 else alpha_mean
        length = _accepted_length(alpha, pod.k)
        drafts = output / length
        tpot = step / length * math.exp(rng.gauss(0.0, REQUEST_NOISE_SD))
        if stall_share and rng.random() < stall_share:
            tpot *= 5
        pod.generation += output
        pod.drafts += drafts
        for i in range(pod.k):
            pod.accepted[i] += drafts * alpha ** (i + 1)
        duration = output * tpot
        busy += duration
        pod.itl_sum += duration
        pod.tpot[bisect.bisect_left(TPOT_BOUNDS, tpot)] += 1
        pod.tpot_sum += tpot
        pod.prompts[bisect.bisect_left(LENGTH_BOUNDS, prompt)] += 1
        pod.outputs[bisect.bisect_left(LENGTH_BOUNDS, output)] += 1
        pod.finished += 1
        if rng.random() < error_rate:
            pod.errored += 1
    pod.running = busy / interval


@dataclass
class ClassResult:
    scenario: Scenario
    steps: str
    outcomes: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def trials(self) -> int:
        return len(self.outcomes)

    @property
    def rolled_back(self) -> float:
        return sum(outcome != "Promoted" for outcome, _, _ in self.outcomes) / max(self.trials, 1)

    @property
    def median_seconds(self) -> float:
        return statistics.median(seconds for _, _, seconds in self.outcomes) if self.outcomes else 0.0

    @property
    def top_reason(self) -> str:
        reasons: dict[str, int] = {}
        for outcome, reason, _ in self.outcomes:
            key = f"{outcome}/{reason}" if outcome != "Promoted" else "Promoted"
            reasons[key] = reasons.get(key, 0) + 1
        return max(sorted(reasons), key=lambda key: reasons[key]) if reasons else "-"

    @property
    def met(self) -> bool:
        if self.scenario.healthy:
            return self.rolled_back <= TARGET_FALSE_ROLLBACK
        return self.rolled_back >= TARGET_DETECTION

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario.name, "steps": self.steps, "healthy": self.scenario.healthy,
                "trials": self.trials, "rolled_back": self.rolled_back, "median_s": self.median_seconds,
                "top_reason": self.top_reason, "met": self.met}


@dataclass
class BenchResult:
    classes: list[ClassResult]
    # per gate: (windows judged, fixed-sample rejections at CALIBRATION_LEVEL, gate failures at its level)
    calibration: dict[str, list[int]]
    # per step set: the least error any analysis makes between classes that differ only in speed (`speed_floors`)
    floors: dict[str, list[SpeedFloor]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        calibration = {gate: {"windows": n, "rejected": rejected / n if n else None,
                              "failed": failed / n if n else None}
                       for gate, (n, rejected, failed) in self.calibration.items()}
        calibrated = all(item["rejected"] is None or item["rejected"] <= CALIBRATION_FACTOR * CALIBRATION_LEVEL
                         for item in calibration.values())
        return {"classes": [item.to_json() for item in self.classes], "calibration": calibration,
                "targets_met": all(item.met for item in self.classes) and calibrated, "calibrated": calibrated,
                "speed_floors": {steps: [item.to_json() for item in floors] for steps, floors in self.floors.items()}}


def _calibrate(windows: list[tuple[WindowStats, WindowStats]], tally: dict[str, list[int]],
               thresholds: CanaryAnalysis) -> None:
    from specdec_operator.canary.analysis import analyse

    for canary, stable in windows:
        stats = calibration_statistics(canary, stable, CALIBRATION_LEVEL)
        verdict = analyse(canary, stable, thresholds)
        failed_metrics = {item.metric for item in verdict.comparisons if item.failed}
        for gate in GATES:
            value = stats[gate]
            if value is None:
                continue
            entry = tally.setdefault(gate, [0, 0, 0])
            entry[0] += 1
            rejected = value > Z_ONE_SIDED if gate in ONE_SIDED else value < CALIBRATION_LEVEL
            entry[1] += rejected
            gate_failed = {
                "goodput": any(metric.startswith("goodput") for metric in failed_metrics),
                "tpot_p90": "TPOT p90" in failed_metrics, "tpot_p99": "TPOT p99" in failed_metrics,
                "acceptance": any(metric.startswith("accept") for metric in failed_metrics),
                "errors": verdict.reason == "ErrorRateExceeded",
                "load": verdict.reason == "TrafficMismatch" and "per-pod load" in verdict.message,
                "lengths": verdict.reason == "TrafficMismatch" and "lengths differ" in verdict.message,
            }[gate]
            entry[2] += gate_failed


def run_bench(trials: int, seed: int, interval: float = 10.0, *, steps: Sequence[str] = ("default", "example"),
              scenarios: Sequence[Scenario] = SCENARIOS, pools: Sequence[int] = POOL_SIZES,
              rates: Sequence[float] = RATES) -> BenchResult:
    classes: list[ClassResult] = []
    tally: dict[str, list[int]] = {}
    floors = {steps_name: speed_floors(scenarios, steps_name, pools, rates) for steps_name in steps}
    for steps_name in steps:
        for scenario in scenarios:
            result = ClassResult(scenario, steps_name)
            # A class's trials are drawn from its place among all classes, so `--class` reruns exactly the trials
            # the whole bench ran for it.
            number = SCENARIOS.index(scenario) if scenario in SCENARIOS else len(SCENARIOS) + scenarios.index(scenario)
            for index in range(trials):
                rng = random.Random(f"{seed}/{steps_name}/{number}/{index}")
                trial = _Trial(scenario, steps_name, rng.choice(list(pools)), rng.choice(list(rates)),
                               rng.randrange(2**31), interval)
                outcome, reason, seconds, windows = run_trial(trial)
                result.outcomes.append((outcome, reason, seconds))
                if scenario.name == "A/A identical":
                    _calibrate(windows, tally, STEP_SETS[steps_name][0].analysis)
            classes.append(result)
    return BenchResult(classes, tally, floors)


@dataclass(frozen=True)
class SpeedFloor:
    """A healthy and a bad class that differ only in how fast the canary serves, and the least error any analysis
    makes between them on the bench's pools: see `speed_floors`."""

    healthy: str
    bad: str
    floor: float  # the worse of the healthy class's false rollbacks and the bad class's misses is at least this

    def to_json(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "bad": self.bad, "floor": self.floor}


def _log_speed(scenario: Scenario, rate: float) -> float:
    """The log of the canary's engine step at a load, negated: a pair of classes at the same K differ in goodput
    by the difference of this (the pods' own hardware aside)."""
    return -math.log(_loaded_step_s(_canary_step_s(scenario), rate))


def _apart_from_speed(scenario: Scenario) -> Scenario:
    return replace(scenario, name="", healthy=True, true_gain=0.0, canary_step_factor=1.0)


def _pods_seen(pool: int, canary: Canary) -> tuple[int, int]:
    """(canary pods, stable pods) a canary of this pool runs over its steps: the bench's pods keep their names,
    so a step with more pods on a side adds pods and one with fewer keeps some of the same."""
    analysed = [step.weight for step in canary.steps if step.weight < 100] or [canary.steps[0].weight]
    every = [step.weight for step in canary.steps]
    return max(_sizes(pool, weight)[0] for weight in every), max(_sizes(pool, weight)[1] for weight in analysed)


def speed_floors(scenarios: Sequence[Scenario], steps: str, pools: Sequence[int], rates: Sequence[float] = RATES,
                 spreads: Sequence[float] = POD_SPEED_SDS) -> list[SpeedFloor]:
    """For each healthy and bad class that differ only in the canary's speed (the same K, prediction, acceptance,
    errors and traffic), the least error any analysis can make between them on these pools, worst pair first.

    Speed is all that separates such a pair, and a pod's GPU moves it too: on the log scale the canary pods' mean
    speed over the stable pods' carries the pods' hardware spread, variance sd^2 (1/canary pods + 1/stable pods),
    however many requests they serve. In each (pool, rate, spread) cell an oracle that knows the spread and reads
    every pod's speed without request noise makes false rollbacks plus misses at least 2 Phi(-d / (2 s)), d the
    log ratio of the two classes' engine steps at that load and s that sd: the likelihood-ratio threshold halfway
    between them minimises the sum. Averaged over the cells the worse of the two rates is at least half the
    average sum. An analysis that must estimate the spread, and reads a window of requests, does worse: the
    floor is the part of its misses no analysis can remove without more pods."""
    from statistics import NormalDist

    canary, _ = STEP_SETS[steps]
    normal = NormalDist()
    found = []
    for healthy in (item for item in scenarios if item.healthy):
        for bad in (item for item in scenarios if not item.healthy):
            if _apart_from_speed(healthy) != _apart_from_speed(bad):
                continue
            cells = []
            for rate in rates:
                gap = abs(_log_speed(healthy, rate) - _log_speed(bad, rate))
                for pool in pools:
                    canary_pods, stable_pods = _pods_seen(pool, canary)
                    for spread in spreads:
                        sd = spread * math.sqrt(1 / canary_pods + 1 / max(stable_pods, 1))
                        cells.append(normal.cdf(-gap / (2 * sd)) if sd > 0 else 0.0)
            found.append(SpeedFloor(healthy.name, bad.name, sum(cells) / len(cells)))
    return sorted(found, key=lambda item: -item.floor)


def format_tables(result: BenchResult, interval: float, pools: Sequence[int], rates: Sequence[float]) -> str:
    summary = result.summary()
    lines = [f"canary bench: replayed through `canary replay` (parser, windows, analysis, step machine); "
             f"pools {'/'.join(map(str, pools))}, {'/'.join(f'{r:g}' for r in rates)} req/s per pod, "
             f"a scrape and a verdict every {interval:g} s", ""]
    for steps_name in dict.fromkeys(item.steps for item in result.classes):
        canary, routed = STEP_SETS[steps_name]
        shape = ", ".join(f"{step.weight}%/{step.pause_seconds}s" for step in canary.steps)
        split = "HTTPRoute, weights follow the replica split" if routed else "replica split"
        lines.append(f"{steps_name} steps {shape} ({split}; timeout {canary.analysis.timeout_seconds} s, "
                     f"minRequests {canary.analysis.min_requests})")
        lines.append(f"{'class':<22}{'kind':<9}{'trials':>7}{'rolled back':>13}{'median s':>10}  top outcome")
        for item in result.classes:
            if item.steps != steps_name:
                continue
            kind = "healthy" if item.scenario.healthy else "bad"
            flag = "" if item.met else "  <- misses target"
            lines.append(f"{item.scenario.name:<22}{kind:<9}{item.trials:>7}{item.rolled_back:>12.1%}"
                         f"{item.median_seconds:>10.0f}  {item.top_reason}{flag}")
        floors = [item for item in result.floors.get(steps_name, []) if item.floor >= FLOOR_SHOWN]
        if floors:
            lines.append("speed floor: only speed tells these classes apart, and a pod's GPU moves it too (log-sd "
                         f"{min(POD_SPEED_SDS):.0%} to {max(POD_SPEED_SDS):.0%} a pod); on these pools even an "
                         "oracle that knows the spread and has no request noise leaves the worse of the healthy "
                         "class's rollbacks and the bad class's misses at least")
            lines += [f"  {item.floor:.2%}  {item.healthy} / {item.bad}" for item in floors]
        lines.append("")
    lines.append(f"A/A calibration (identical revisions; the last window of each analysed step): share of windows "
                 f"whose fixed-sample equality test rejects at {CALIBRATION_LEVEL:.0%} (target <= "
                 f"{CALIBRATION_FACTOR * CALIBRATION_LEVEL:.0%}), and share the gate fails at its stated level")
    lines.append(f"{'gate':<12}{'windows':>9}{'rejects at 5%':>15}{'gate fails':>12}")
    for gate in GATES:
        item = summary["calibration"].get(gate)
        if item is None:
            lines.append(f"{gate:<12}{0:>9}{'-':>15}{'-':>12}")
            continue
        rejected = "-" if item["rejected"] is None else f"{item['rejected']:.1%}"
        failed = "-" if item["failed"] is None else f"{item['failed']:.2%}"
        lines.append(f"{gate:<12}{item['windows']:>9}{rejected:>15}{failed:>12}")
    healthy = [item for item in result.classes if item.scenario.healthy]
    bad = [item for item in result.classes if not item.scenario.healthy]
    worst_healthy = max((item.rolled_back for item in healthy), default=0.0)
    worst_bad = min((item.rolled_back for item in bad), default=1.0)
    lines.append("")
    lines.append(f"worst healthy class: {worst_healthy:.1%} rolled back (target <= {TARGET_FALSE_ROLLBACK:.0%}); "
                 f"worst bad class: {worst_bad:.1%} detected (target >= {TARGET_DETECTION:.0%}); calibration "
                 f"{'within' if summary['calibrated'] else 'NOT within'} {CALIBRATION_FACTOR:g}x: targets "
                 f"{'met' if summary['targets_met'] else 'MISSED'}")
    return "\n".join(lines) + "\n"
