"""Publish a TunerReport in the operator's own Prometheus metrics (per model and pool).

These gauges are the fresh numbers: status carries the same statistics refreshed at a bounded rate.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from specdec_operator.metrics import (
    ACCEPTANCE_RATE,
    EFFECTIVE_K,
    MEAN_ACCEPTED_LENGTH,
    RECOMMENDED_K,
    TOKENS_PER_SECOND,
    TUNER_DECISIONS,
    TUNER_MIN_SAMPLES,
    TUNER_SAMPLES,
    TUNER_WINDOW_RESTARTS,
    TUNER_WINDOW_START,
    forget_pools_except,
    pool_series,
    set_excluded_pods,
    set_position_acceptance,
)
from specdec_operator.tuner.engine import RESTART_CAUSES, TunerReport
from specdec_operator.tuner.window import Exclusion


def publish(namespace: str, model: str, report: TunerReport) -> None:
    """Set the per-pool gauges from the stats and the decision windows, count the windows' restarts and the
    decisions; a Change or Explore counts as a K change.

    The report covers every pool the model has now: series of pools that are gone leave /metrics.
    """
    forget_pools_except(namespace, model, {stats.pool for stats in report.stats})
    for stats in report.stats:
        labels = (namespace, model, stats.pool)
        if stats.pool in report.effective_k:
            pool_series(EFFECTIVE_K, *labels).set(report.effective_k[stats.pool])
        if stats.recommended_k is not None:
            pool_series(RECOMMENDED_K, *labels).set(stats.recommended_k)
        if stats.acceptance_rate is not None:
            pool_series(ACCEPTANCE_RATE, *labels).set(stats.acceptance_rate)
        if stats.mean_accepted_length is not None:
            pool_series(MEAN_ACCEPTED_LENGTH, *labels).set(stats.mean_accepted_length)
        if stats.tokens_per_second is not None:
            pool_series(TOKENS_PER_SECOND, *labels).set(stats.tokens_per_second)
        set_position_acceptance(*labels, stats.per_position_acceptance)
    # Each pool's decision window as the decisions below saw it: samples below the minimum mean they held for
    # samples. Every cause's series exists from the first report on, so an increase from 0 is seen as one.
    # The engine's times are monotonic; the two clocks read back to back give the same start at every report.
    wall_offset = time.time() - time.monotonic()
    for pool, window in report.windows.items():
        labels = (namespace, model, pool)
        for cause in RESTART_CAUSES:
            pool_series(TUNER_WINDOW_RESTARTS, *labels, cause).inc(window.restarts.get(cause, 0))
        pool_series(TUNER_SAMPLES, *labels).set(window.samples)
        pool_series(TUNER_WINDOW_START, *labels).set(round(wall_offset + window.started_at, 3))
        if report.min_samples is not None:
            pool_series(TUNER_MIN_SAMPLES, *labels).set(report.min_samples)
    for decision in report.decisions:
        pool_series(TUNER_DECISIONS, namespace, model, decision.pool, decision.action).inc()


def publish_exclusions(namespace: str, model: str, excluded: Mapping[str, Exclusion]) -> None:
    """specdec_pod_metrics_excluded for the pods the model's windows leave out now (by UID); the rest go."""
    set_excluded_pods(namespace, model, {(exclusion.pool, exclusion.pod) for exclusion in excluded.values()})
