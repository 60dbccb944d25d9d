"""The restart a K change causes is charged to it: minGain plus the pool's measured restart cost (tuner/policy.py)."""

from __future__ import annotations

import pytest

from specdec_operator.api.status import DrafterChoice, PoolRollout, PoolStatus
from specdec_operator.handlers.services.watches import runtime_pod_view
from specdec_operator.reconcile.tuning_inputs import pool_contexts, pool_ready_seconds
from specdec_operator.tuner.policy import DEFAULT_READY_S, MAX_HORIZON_S, MIN_HORIZON_S, restart_cost
from specdec_runtime import contract
from tests.unit.tuner.test_policy import NOW, decided, evidence, speculation

# The move K=3 -> 2 under the chat profile is predicted +8% (test_policy.py); with minGain 5% it is taken when the
# restart is cheap.
SPEC = speculation(min_gain=0.05)
AN_HOUR_AGO = NOW - 3600


def test_a_gain_above_min_gain_but_not_above_the_restart_cost_holds_k() -> None:
    cheap = decided(evidence(k=3, replicas=4, ready_s=30.0), SPEC, AN_HOUR_AGO)
    assert (cheap.action, cheap.to_k) == ("Change", 2)
    assert 0.05 < cheap.predicted_gain < 0.12
    # Pods that take 10 minutes to be Ready, one of four out at a time: 600 s of the whole pool over the hour K has
    # held is 16.7%, so the same +8% does not pay for the restart.
    slow = decided(evidence(k=3, replicas=4, ready_s=600.0), SPEC, AN_HOUR_AGO)
    assert (slow.action, slow.to_k) == ("Hold", 3)
    assert "gain below 5.0% + 16.7% restart cost" in slow.reason
    assert "restart cost 16.7% (pods Ready in 600 s, 1 of 4 replicas at a time, over 1.0 h: K last changed 1.0 h " \
           "ago)" in slow.reason


def test_the_change_states_the_restart_cost_it_was_charged() -> None:
    decision = decided(evidence(k=3, replicas=4, ready_s=90.0), SPEC, AN_HOUR_AGO)
    assert decision.action == "Change"
    assert "restart cost 2.5% (pods Ready in 90 s, 1 of 4 replicas at a time" in decision.reason


def test_the_cost_scales_with_the_observed_start_to_ready_time() -> None:
    fast = restart_cost(evidence(replicas=4, ready_s=60.0), SPEC, NOW, AN_HOUR_AGO)
    slow = restart_cost(evidence(replicas=4, ready_s=240.0), SPEC, NOW, AN_HOUR_AGO)
    assert fast.fraction == pytest.approx(60 / 3600)
    assert slow.fraction == pytest.approx(4 * fast.fraction)


def test_with_no_pod_ready_time_observed_the_conservative_default_applies() -> None:
    cost = restart_cost(evidence(replicas=4), SPEC, NOW, AN_HOUR_AGO)
    assert (cost.ready_s, cost.ready_observed) == (DEFAULT_READY_S, False)
    assert cost.fraction == pytest.approx(DEFAULT_READY_S / 3600)
    assert "pods Ready in 300 s (default, none observed)" in cost.describe()
    # The default is dearer than a typical measured load, so a +8% move it blocks a fast pool may take.
    assert decided(evidence(k=3, replicas=4), speculation(min_gain=0.05), NOW - 1800).action == "Hold"


def test_the_capacity_out_at_once_and_the_horizon_scale_the_cost() -> None:
    # Two of four out at a time: two waves, half the pool out in each, the same pool-seconds as one at a time.
    assert restart_cost(evidence(replicas=4, ready_s=120.0, out_at_once=2), SPEC, NOW, AN_HOUR_AGO).fraction == \
        pytest.approx(120 / 3600)
    # Three of four at a time: two waves, three quarters out in each.
    assert restart_cost(evidence(replicas=4, ready_s=120.0, out_at_once=3), SPEC, NOW, AN_HOUR_AGO).fraction == \
        pytest.approx(2 * 120 * 0.75 / 3600)
    # A surge rollout starts the new pods beside the serving ones: no capacity out.
    surge = restart_cost(evidence(replicas=4, ready_s=120.0, out_at_once=0), SPEC, NOW, AN_HOUR_AGO)
    assert surge.fraction == 0 and "surge rollout, no replica out of service" in surge.describe()
    # The horizon is how long K has held, at least MIN_HORIZON_S, at most MAX_HORIZON_S; MAX with no change on record.
    pool = evidence(replicas=4, ready_s=120.0)
    assert restart_cost(pool, SPEC, NOW, NOW - 600).horizon_s == MIN_HORIZON_S
    assert restart_cost(pool, SPEC, NOW, NOW - 3 * 3600).horizon_s == 3 * 3600
    assert restart_cost(pool, SPEC, NOW, NOW - 30 * 3600).horizon_s == MAX_HORIZON_S
    assert restart_cost(pool, SPEC, NOW, None).horizon_s == MAX_HORIZON_S


def _pod(pool: str, started: str | None, ready_at: str | None, *, ready: bool = True, deleting: bool = False) -> dict:
    condition = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready_at}
    status = {"phase": "Running", "podIP": "10.0.0.1", "startTime": started,
              "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": started}, condition]}
    meta: dict = {"name": f"{pool}-x", "namespace": "ns", "uid": "u", "labels": {contract.LABEL_POOL: pool}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T11:00:00Z"
    # Through the watch cache's view: what reaches the pure decision is what the view keeps.
    return runtime_pod_view({"metadata": meta, "status": status})


def test_start_to_ready_is_the_median_of_the_pools_ready_pods_from_pod_status() -> None:
    pods = [
        _pod("a", "2026-01-01T10:00:00Z", "2026-01-01T10:01:30Z"),  # 90 s
        _pod("a", "2026-01-01T10:00:00Z", "2026-01-01T10:02:00Z"),  # 120 s
        _pod("a", "2026-01-01T10:00:00Z", "2026-01-01T10:30:00Z"),  # NotReady for a while since: one outlier
        _pod("a", "2026-01-01T10:00:00Z", "2026-01-01T10:00:10Z", ready=False),  # not Ready: no figure
        _pod("a", "2026-01-01T10:00:00Z", "2026-01-01T10:00:10Z", deleting=True),
        _pod("b", None, "2026-01-01T10:01:00Z"),  # no startTime (not started by a kubelet)
    ]
    assert pool_ready_seconds(pods) == {"a": 120.0}


def test_pool_contexts_carry_the_ready_time_and_the_rollouts_capacity_out() -> None:
    def status(name: str, rollout: PoolRollout | None) -> PoolStatus:
        return PoolStatus(name=name, gfx_target="gfx942", drafter=DrafterChoice(method="eagle3"), effective_k=3,
                          replicas=4, rollout=rollout)

    pools = [status("surge", PoolRollout(mode="Surge", revision="r", max_surge=1)),
             status("inplace", PoolRollout(mode="InPlace", revision="r", max_unavailable=2)),
             status("new", None)]
    contexts = pool_contexts(pools, {}, set(), ready_s={"inplace": 95.0}, max_unavailable=1)
    assert [(c.name, c.ready_s, c.out_at_once) for c in contexts] == [
        ("surge", None, 0), ("inplace", 95.0, 2), ("new", None, 1)]
