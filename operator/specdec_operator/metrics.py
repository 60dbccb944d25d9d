"""The operator's own Prometheus metrics. Every metric the dashboard queries is defined here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_POOL = ("namespace", "model", "pool")

RECONCILES = Counter(
    "specdec_reconcile", "Reconciles of SpeculativeModels by result.", ("result",), registry=REGISTRY
)
MODEL_RECONCILES = Counter(
    "specdec_model_reconciles", "Finished reconcile passes of one SpeculativeModel (ok or invalid).",
    ("namespace", "model"), registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "specdec_reconcile_duration_seconds", "Duration of one reconcile.", registry=REGISTRY
)
API_WRITES = Counter(
    "specdec_api_writes", "Write requests the operator sent to the API server.", ("kind", "verb"), registry=REGISTRY
)
STATUS_WRITES = Counter(
    "specdec_status_writes", "SpeculativeModel status writes by cause: state (decisions, conditions, pools, "
    "canary), first_statistics, statistics (a due refresh past the tolerances).", ("cause",), registry=REGISTRY,
)
SCRAPES = Counter("specdec_scrapes", "Runtime pod /metrics scrapes by result.", ("result",), registry=REGISTRY)
SCRAPE_SECONDS = Histogram(
    "specdec_scrape_duration_seconds", "Duration of one pod /metrics scrape.", registry=REGISTRY
)
EFFECTIVE_K = Gauge("specdec_effective_k", "Proposal length K the pool runs.", _POOL, registry=REGISTRY)
RECOMMENDED_K = Gauge("specdec_recommended_k", "K the tuner would pick now.", _POOL, registry=REGISTRY)
ACCEPTANCE_RATE = Gauge(
    "specdec_acceptance_rate", "Accepted / drafted tokens over the last window.", _POOL, registry=REGISTRY
)
MEAN_ACCEPTED_LENGTH = Gauge(
    "specdec_mean_accepted_length", "Tokens emitted per verification step (1 + accepted per draft).", _POOL,
    registry=REGISTRY,
)
POSITION_ACCEPTANCE = Gauge(
    "specdec_position_acceptance",
    "Fraction of drafts whose first position+1 tokens were accepted.",
    (*_POOL, "position"),
    registry=REGISTRY,
)
TOKENS_PER_SECOND = Gauge(
    "specdec_tokens_per_second", "Generated tokens per second across the pool.", _POOL, registry=REGISTRY
)
K_CHANGES = Counter("specdec_k_changes", "Changes of a pool's effective K.", _POOL, registry=REGISTRY)
TUNER_DECISIONS = Counter(
    "specdec_tuner_decisions", "Tuner decisions by action.", (*_POOL, "action"), registry=REGISTRY
)
TUNER_SAMPLES = Gauge(
    "specdec_tuner_samples", "Samples (drafts; engine steps at K=0) at the pool's current K in its decision window.",
    _POOL, registry=REGISTRY,
)
TUNER_MIN_SAMPLES = Gauge(
    "specdec_tuner_min_samples", "Samples a decision window needs before the tuner weighs a change (minSamples).",
    _POOL, registry=REGISTRY,
)
TUNER_WINDOW_START = Gauge(
    "specdec_tuner_window_start_timestamp_seconds",
    "Unix time the pool's decision window last started (it moves on while the pool's pods roll).",
    _POOL, registry=REGISTRY,
)
TUNER_WINDOW_RESTARTS = Counter(
    "specdec_tuner_window_restarts",
    "Restarts of a pool's decision window by cause: resize, k_change, drafter, rollout.",
    (*_POOL, "cause"), registry=REGISTRY,
)
POD_METRICS_EXCLUDED = Gauge(
    "specdec_pod_metrics_excluded",
    "1 for each runtime pod whose /metrics vLLM cannot produce (non-finite, accepted > drafted, impossible rates, "
    "changing histogram layouts, K above maxK): its counters are left out of tuning and canary analysis.",
    (*_POOL, "pod"), registry=REGISTRY,
)
CANARY_WEIGHT = Gauge("specdec_canary_weight", "Percent of traffic on the canary.", _POOL, registry=REGISTRY)
ROLLOUTS = Counter(
    "specdec_rollouts", "Finished canary rollouts by result.", (*_POOL, "result"), registry=REGISTRY
)
SCRAPE_ROUND_SECONDS = Histogram(
    "specdec_scrape_round_duration_seconds",
    "From the start of an operator-wide scrape round until its last pod answered (or timed out).",
    buckets=(0.5, 1, 2.5, 5, 7.5, 10, 12.5, 15, 20, 30, 60),
    registry=REGISTRY,
)
SCRAPE_LAST_ROUND_SECONDS = Gauge(
    "specdec_scrape_last_round_seconds", "Duration of the latest operator-wide scrape round.", registry=REGISTRY
)
SCRAPE_TARGETS = Gauge("specdec_scrape_targets", "Runtime pods the scrape scheduler scrapes.", registry=REGISTRY)
BACKGROUND_TASK_RESTARTS = Counter(
    "specdec_background_task_restarts",
    "Restarts of an operator-wide background task (scrape scheduler, memory watcher) after it failed.",
    ["task"],
    registry=REGISTRY,
)
ACTIVE = Gauge(
    "specdec_active",
    "1 on the replica that acts (kopf peering did not pause it), 0 on a standby.",
    registry=REGISTRY,
)
MODEL_CONDITION = Gauge(
    "specdec_model_condition",
    "1 for each condition the model's status holds now, by type, status and reason (alert on Ready not True).",
    ("namespace", "model", "type", "status", "reason"), registry=REGISTRY,
)

# Every metric labelled by one SpeculativeModel. A model's series leave /metrics when it is deleted or
# when this replica stops acting for it (standby), so dashboards and alerts never read a stale number.
MODEL_METRICS: tuple[Gauge | Counter, ...] = (
    EFFECTIVE_K, RECOMMENDED_K, ACCEPTANCE_RATE, MEAN_ACCEPTED_LENGTH, POSITION_ACCEPTANCE, TOKENS_PER_SECOND,
    K_CHANGES, TUNER_DECISIONS, TUNER_SAMPLES, TUNER_MIN_SAMPLES, TUNER_WINDOW_START, TUNER_WINDOW_RESTARTS,
    CANARY_WEIGHT, ROLLOUTS, POD_METRICS_EXCLUDED,
)
# The condition series each model has, so a changed reason replaces its old series instead of adding one.
_CONDITION_SERIES: dict[tuple[str, str], set[tuple[str, str, str]]] = {}


def set_model_conditions(namespace: str, model: str, conditions: Iterable[tuple[str, str, str]]) -> None:
    """Export the model's conditions as (type, status, reason) series of value 1; drop the ones it no longer has."""
    current = set(conditions)
    for type_, status, reason in _CONDITION_SERIES.get((namespace, model), set()) - current:
        MODEL_CONDITION.remove(namespace, model, type_, status, reason)
    for type_, status, reason in current:
        MODEL_CONDITION.labels(namespace, model, type_, status, reason).set(1)
    _CONDITION_SERIES[(namespace, model)] = current


# Canary events that end a rollout, and the result label they count under.
ROLLOUT_RESULTS = {
    "CanaryPromoted": "promoted",
    "CanaryFailed": "rolledback",
    "CanaryTimedOut": "rolledback",
    "CanaryAborted": "aborted",
    "CanaryCancelled": "cancelled",
}
# Events a canary's plan posts when it promotes a tuner K change (reconcile/rollout.py).
K_ROLLED_OUT = ("KChanged", "KExplore")


def count_rollouts(namespace: str, model: str, pool: str, reasons: Iterable[str]) -> None:
    """The rollouts of the canary pool that written events end, and the tuner K changes its canary promoted (a
    K change is counted when its canary promotes it, as its event says)."""
    for reason in reasons:
        result = ROLLOUT_RESULTS.get(reason)
        if result is not None:
            pool_series(ROLLOUTS, namespace, model, pool, result).inc()
        if reason in K_ROLLED_OUT:
            count_k_change(namespace, model, pool)


def count_k_change(namespace: str, model: str, pool: str) -> None:
    """A pool's K changed: counted once the decision is in status (with strategy Canary, once its canary
    promotes it: `count_rollouts`), not when it is proposed."""
    pool_series(K_CHANGES, namespace, model, pool).inc()


def set_canary_weight(namespace: str, model: str, pools: Iterable[str], canary_pool: str | None, weight: int) -> None:
    """The canary's percent of traffic, on its pool; 0 on the model's other pools."""
    for pool in pools:
        pool_series(CANARY_WEIGHT, namespace, model, pool).set(weight if pool == canary_pool else 0)


# The excluded pods each model has series for (pool, pod), so pods that behave again or are gone leave /metrics.
_EXCLUDED_SERIES: dict[tuple[str, str], set[tuple[str, str]]] = {}
# How many positions each pool's specdec_position_acceptance has, so positions past a lowered K leave /metrics.
_POSITIONS: dict[tuple[str, str, str], int] = {}


def set_excluded_pods(namespace: str, model: str, pods: Iterable[tuple[str, str]]) -> None:
    """Export the model's excluded (pool, pod) pairs as series of value 1; drop those no longer excluded."""
    current = set(pods)
    for pool, pod in _EXCLUDED_SERIES.get((namespace, model), set()) - current:
        POD_METRICS_EXCLUDED.remove(namespace, model, pool, pod)
    for pool, pod in current:
        pool_series(POD_METRICS_EXCLUDED, namespace, model, pool, pod).set(1)
    if current:
        _EXCLUDED_SERIES[(namespace, model)] = current
    else:
        _EXCLUDED_SERIES.pop((namespace, model), None)


def set_position_acceptance(namespace: str, model: str, pool: str, rates: Iterable[float]) -> None:
    """specdec_position_acceptance for positions 0..len(rates)-1; the positions past them (K lowered) go."""
    values = list(rates)
    for position, rate in enumerate(values):
        pool_series(POSITION_ACCEPTANCE, namespace, model, pool, str(position)).set(rate)
    for position in range(len(values), _POSITIONS.get((namespace, model, pool), 0)):
        POSITION_ACCEPTANCE.remove(namespace, model, pool, str(position))
    if values:
        _POSITIONS[(namespace, model, pool)] = len(values)
    else:
        _POSITIONS.pop((namespace, model, pool), None)


# The pools each model has series for, so pruning a model's gone pools looks at that model alone. Reading
# the registry instead (collect() builds every sample of every model) made each tuner evaluation cost
# O(fleet): at 500 models it was the operator's largest CPU cost.
_POOLS_WITH_SERIES: dict[tuple[str, str], set[str]] = {}
MetricT = TypeVar("MetricT", Gauge, Counter)


def pool_series(metric: MetricT, namespace: str, model: str, pool: str, *labels: str) -> MetricT:
    """`metric.labels(namespace, model, pool, *labels)`, remembering that the pool has series."""
    _POOLS_WITH_SERIES.setdefault((namespace, model), set()).add(pool)
    return metric.labels(namespace, model, pool, *labels)


def count_model_pass(namespace: str, model: str) -> None:
    """One finished reconcile pass of the model: a pass, not a clock, is what "nothing changed for N passes"
    counts (the e2e tests wait on it)."""
    MODEL_RECONCILES.labels(namespace, model).inc()


def forget_model(namespace: str, model: str) -> None:
    """Remove every series of one model (all its pools)."""
    # Not limited to the tracked pools: a deletion is rare, and this also catches a series made without
    # pool_series().
    _POOLS_WITH_SERIES.pop((namespace, model), None)
    _CONDITION_SERIES.pop((namespace, model), None)
    _EXCLUDED_SERIES.pop((namespace, model), None)
    for key in [key for key in _POSITIONS if key[:2] == (namespace, model)]:
        del _POSITIONS[key]
    MODEL_CONDITION.remove_by_labels({"namespace": namespace, "model": model})
    MODEL_RECONCILES.remove_by_labels({"namespace": namespace, "model": model})
    for metric in MODEL_METRICS:
        metric.remove_by_labels({"namespace": namespace, "model": model})


def forget_pools_except(namespace: str, model: str, pools: set[str]) -> None:
    """Remove the series of a model's pools that no longer exist (a gfx target dropped from its placement)."""
    known = _POOLS_WITH_SERIES.get((namespace, model))
    if not known or known <= pools:
        return
    for pool in known - pools:
        for metric in MODEL_METRICS:
            metric.remove_by_labels({"namespace": namespace, "model": model, "pool": pool})
        _POSITIONS.pop((namespace, model, pool), None)
    excluded = _EXCLUDED_SERIES.get((namespace, model))
    if excluded:
        excluded -= {(pool, pod) for pool, pod in excluded if pool not in pools}
    known &= pools


def forget_all_models() -> None:
    """A replica that stops acting exports no model series: the active one speaks for every model."""
    _POOLS_WITH_SERIES.clear()
    _CONDITION_SERIES.clear()
    _EXCLUDED_SERIES.clear()
    _POSITIONS.clear()
    MODEL_CONDITION.clear()
    MODEL_RECONCILES.clear()
    for metric in MODEL_METRICS:
        metric.clear()
