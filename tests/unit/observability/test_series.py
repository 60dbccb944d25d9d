"""A model's series leave /metrics with the model, and a pool's with the pool; other models keep theirs."""

from __future__ import annotations

from prometheus_client import generate_latest

from specdec_operator.api.status import PoolSpeculationStats
from specdec_operator.metrics import (
    CANARY_WEIGHT,
    MODEL_CONDITION,
    MODEL_METRICS,
    REGISTRY,
    ROLLOUTS,
    forget_model,
    pool_series,
    set_model_conditions,
)
from specdec_operator.tuner.engine import TunerReport
from specdec_operator.tuner.exporter import publish


def _report(*pools: str) -> TunerReport:
    stats = tuple(
        PoolSpeculationStats(pool=pool, k=3, drafts=100, acceptance_rate=0.7, mean_accepted_length=2.4,
                             per_position_acceptance=[0.8, 0.6, 0.4], tokens_per_second=900.0, recommended_k=4)
        for pool in pools
    )
    return TunerReport(stats=stats, decisions=(), decision=None, scrape_events={})


def _exposed(model: str) -> list[str]:
    """Lines of the real /metrics text that carry the model's label."""
    return [line for line in generate_latest(REGISTRY).decode().splitlines() if f'model="{model}"' in line]


def test_deleting_a_model_removes_all_its_series_and_only_its() -> None:
    publish("ns-del", "doomed", _report("gfx942", "gfx90a"))
    publish("ns-del", "kept", _report("gfx942"))
    pool_series(CANARY_WEIGHT, "ns-del", "doomed", "gfx942").set(10)
    pool_series(ROLLOUTS, "ns-del", "doomed", "gfx942", "rolledback").inc()
    assert len(_exposed("doomed")) > 10
    kept_before = _exposed("kept")

    forget_model("ns-del", "doomed")

    assert _exposed("doomed") == []
    assert _exposed("kept") == kept_before


def test_the_same_name_in_another_namespace_is_another_model() -> None:
    publish("ns-x", "twin", _report("gfx942"))
    publish("ns-y", "twin", _report("gfx942"))
    forget_model("ns-x", "twin")
    assert _exposed("twin") and all('namespace="ns-y"' in line for line in _exposed("twin"))
    forget_model("ns-y", "twin")


def test_a_pool_that_is_gone_leaves_metrics_at_the_next_report() -> None:
    publish("ns-pool", "shrinks", _report("gfx942", "gfx1100"))
    assert any('pool="gfx1100"' in line for line in _exposed("shrinks"))
    publish("ns-pool", "shrinks", _report("gfx942"))
    lines = _exposed("shrinks")
    assert lines and not any('pool="gfx1100"' in line for line in lines)
    # A canary weight and a rollout count of a pool that goes are pruned too.
    pool_series(CANARY_WEIGHT, "ns-pool", "shrinks", "gfx90a").set(50)
    pool_series(ROLLOUTS, "ns-pool", "shrinks", "gfx90a", "promoted").inc()
    publish("ns-pool", "shrinks", _report("gfx942"))
    assert _exposed("shrinks") == lines
    forget_model("ns-pool", "shrinks")


def test_every_model_metric_is_labelled_by_namespace_model_and_pool() -> None:
    # forget_* select by these labels; a per-model metric without them could never be pruned.
    for metric in MODEL_METRICS:
        names = metric._labelnames
        assert names[:3] == ("namespace", "model", "pool"), metric


def test_model_conditions_are_one_series_each_replaced_when_the_reason_changes() -> None:
    def series() -> dict[tuple[str, ...], float]:
        return {tuple(s.labels[k] for k in ("type", "status", "reason")): s.value
                for metric in MODEL_CONDITION.collect() for s in metric.samples
                if s.labels["namespace"] == "ns-cond" and s.labels["model"] == "llama"}

    starting = [("Ready", "False", "RolloutInProgress"), ("Degraded", "False", "AsExpected")]
    set_model_conditions("ns-cond", "llama", starting)
    failing = [("Ready", "False", "ImagePullBackOff"), ("Degraded", "True", "ImagePullBackOff")]
    set_model_conditions("ns-cond", "llama", failing)
    assert series() == {("Ready", "False", "ImagePullBackOff"): 1.0, ("Degraded", "True", "ImagePullBackOff"): 1.0}
    forget_model("ns-cond", "llama")
    assert series() == {}
