"""A pool at K=0 (speculation off) re-probes K=1 on a schedule its restart cost sets (tuner/policy.py).

A pool that never measured acceptance explores K=1 as soon as it may. A pool that came down to K=0 from a K>0
measured speculation not paying; it re-probes only once the probe's restart, spread over the time K=0 has held
since the model's last K change, costs at most minGain. That moment follows from the
pool's restart cost and the time alone, never from when its old acceptance evidence decays below a numerical floor.
"""

from __future__ import annotations

import math

import pytest

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.api.status import TuningDecision
from specdec_operator.timestamps import format_stamp
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.policy import MIN_HORIZON_S, PoolEvidence
from tests.unit.tuner.factories import metrics_text, ok, target
from tests.unit.tuner.test_policy import NOW, decided, evidence, speculation

SPEC = speculation()  # initialK 3, minGain 3%, cooldown 600 s
REPLICAS, OUT = 4, 1


def lost_pool_s(ready_s: float, replicas: int = REPLICAS, out: int = OUT) -> float:
    """Pool-seconds of capacity one restart takes: ceil(replicas / out) waves, each `out / replicas` of the pool
    out of service for one start-to-Ready time."""
    return math.ceil(replicas / out) * ready_s * out / replicas


def reprobe_after(ready_s: float, min_gain: float = SPEC.autotune.min_gain) -> float:
    """Seconds after the last K change at which a pool that came down to K=0 re-probes K=1: once the probe's restart
    costs at most minGain of the time K=0 has held (lost / held <= minGain), and never within MIN_HORIZON_S."""
    return max(lost_pool_s(ready_s) / min_gain, MIN_HORIZON_S)


def came_down(ready_s: float = 120.0) -> PoolEvidence:
    """A pool at K=0 that ran K=2 before, its acceptance evidence decayed away (none left)."""
    return evidence(k=0, observed={}, previous_k=2, replicas=REPLICAS, ready_s=ready_s, out_at_once=OUT)


def test_a_pool_that_came_down_to_k0_holds_half_an_hour_after_the_change() -> None:
    decision = decided(came_down(), SPEC, NOW - 1800)
    assert (decision.action, decision.to_k) == ("Hold", 0)


def test_it_re_probes_k1_once_the_probe_costs_at_most_min_gain_of_the_time_held() -> None:
    due = reprobe_after(120.0)
    assert due > MIN_HORIZON_S  # the cost, not the floor, sets this moment: 120 pool-seconds / 3% = 4000 s
    before = decided(came_down(), SPEC, NOW - (due - 60))
    assert (before.action, before.to_k) == ("Hold", 0)
    after = decided(came_down(), SPEC, NOW - (due + 1))
    assert (after.action, after.to_k) == ("Explore", 1)
    assert "re-probing K=1" in after.reason
    assert "restart cost" in after.reason and "pods Ready in 120 s, 1 of 4 replicas at a time" in after.reason


def test_a_slower_loading_pool_waits_proportionally_longer() -> None:
    fast, slow = reprobe_after(120.0), reprobe_after(360.0)
    assert slow == pytest.approx(3 * fast)
    assert decided(came_down(360.0), SPEC, NOW - (fast + 1)).action == "Hold"
    assert decided(came_down(360.0), SPEC, NOW - (slow - 60)).action == "Hold"
    late = decided(came_down(360.0), SPEC, NOW - (slow + 1))
    assert (late.action, late.to_k) == ("Explore", 1)


def test_a_restart_too_dear_for_six_hours_still_re_probes_later() -> None:
    """K=0 is not absorbing: a pool whose restart costs more than minGain over MAX_HORIZON_S re-probes too."""
    due = reprobe_after(1800.0)  # pods Ready in half an hour
    assert due > 6 * 3600
    assert decided(came_down(1800.0), SPEC, NOW - 6 * 3600).action == "Hold"
    assert decided(came_down(1800.0), SPEC, NOW - (due + 1)).action == "Explore"


def test_the_hold_says_when_and_why_it_will_re_probe() -> None:
    decision = decided(came_down(), SPEC, NOW - 1800)
    assert "K=0 since 0.5 h ago" in decision.reason
    assert "re-probing K=1 once its restart costs at most minGain 3.0% over the time held" in decision.reason
    # 120 pool-seconds over the 1800 s held: 6.7%; due 4000 s after the change, 0.6 h from now.
    assert "its restart (120 pool-seconds) is now 6.7% of it; in 0.6 h" in decision.reason


def test_a_surge_rollout_still_waits_the_shortest_horizon() -> None:
    """Its restarts take no capacity, but the time measured at K=1 is not free: not within MIN_HORIZON_S."""
    surge = evidence(k=0, observed={}, previous_k=2, replicas=REPLICAS, ready_s=120.0, out_at_once=0)
    assert decided(surge, SPEC, NOW - (MIN_HORIZON_S - 60)).action == "Hold"
    assert decided(surge, SPEC, NOW - (MIN_HORIZON_S + 1)).action == "Explore"


def test_after_an_operator_restart_a_pool_away_from_its_initial_k_counts_as_measured() -> None:
    """Memory lost: no previous K, no evidence; but the pool runs K=0 while it started at initialK 3, and status
    keeps the last K change's time."""
    pool = evidence(k=0, observed={}, replicas=REPLICAS, ready_s=120.0)
    assert decided(pool, SPEC, NOW - 1800).action == "Hold"
    assert decided(pool, SPEC, NOW - (reprobe_after(120.0) + 1)).action == "Explore"


def test_a_new_model_at_k0_still_explores_k1_promptly() -> None:
    spec = Speculation(initial_k=0, min_k=0, max_k=10, autotune=Autotune())
    fresh = evidence(k=0, observed={}, replicas=REPLICAS, ready_s=120.0)
    decision = decided(fresh, spec, None)
    assert (decision.action, decision.to_k) == ("Explore", 1)
    assert "no acceptance measured at any K" in decision.reason
    # Another pool's K change 20 minutes ago (the model's last change) does not make this pool's K=0 a measured one.
    assert decided(fresh, spec, NOW - 1200).action == "Explore"


def test_a_pool_at_k0_with_fresh_evidence_for_k1_still_moves_on_it() -> None:
    """The schedule only adds a re-probe to a hold: evidence that K=1 pays moves the pool as before."""
    good = evidence(k=0, observed={2: 200_000.0}, previous_k=2, replicas=REPLICAS, ready_s=120.0)
    decision = decided(good, SPEC, NOW - 1800)
    assert decision.action in ("Change", "Explore") and decision.to_k > 0


# --- end to end through the tuner: the decay floor no longer sets the moment ---

SCRAPE_S = 60.0
EVALUATE_S = 300.0


def _first_reprobe(drafts_per_s: float, ready_s: float, hours: float) -> float | None:
    """Ten minutes at K=3 at `drafts_per_s`, a committed change to K=0, then K=0 scraped every minute and evaluated
    every five; seconds from the change to the first K=1 proposal (None: none within `hours`)."""
    spec = Speculation(initial_k=3, min_k=0, max_k=8, autotune=Autotune(min_samples=100))
    at_k3 = PoolContext(name="p", gfx_target="gfx942", drafter_method="eagle3", effective_k=3, replicas=1,
                        ready_s=ready_s)
    at_k0 = PoolContext(name="p", gfx_target="gfx942", drafter_method="eagle3", effective_k=0, replicas=1,
                        ready_s=ready_s)
    state = TunerState()
    for step in range(1, 11):
        t = step * SCRAPE_S
        drafts = drafts_per_s * t
        body = metrics_text(drafts=drafts, per_position=(0.1 * drafts, 0.01 * drafts, 0.001 * drafts), step_s=0.04,
                            created=0.0)
        state.observe([at_k3], [ok(body, t, target(k=3))], t, max_k=spec.max_k)
    changed = 10 * SCRAPE_S
    state.commit(TuningDecision(time=format_stamp(changed), pool="p", from_k=3, to_k=0, action="Change",
                                reason="test"), changed)
    for step in range(1, int(hours * 3600 / SCRAPE_S) + 1):
        t = changed + step * SCRAPE_S
        steps = 500.0 * (t - changed)
        body = metrics_text(per_position=None, drafts=steps, generation_tokens=steps, step_s=0.015, created=changed)
        state.observe([at_k0], [ok(body, t, target("pod-k0", k=0))], t, max_k=spec.max_k)
        if step % int(EVALUATE_S / SCRAPE_S):
            continue
        decision = state.evaluate(t, [at_k0], spec).decision
        if decision is not None and decision.to_k == 1:
            return t - changed
    return None


@pytest.mark.parametrize("drafts_per_s", [50.0, 50_000.0], ids=["few-drafts", "many-drafts"])
def test_the_re_probe_moment_is_set_by_the_restart_cost_not_by_the_evidence_volume(drafts_per_s: float) -> None:
    """The old rule re-probed once the old K=3 evidence fell below a millionth of a draft: 180 s x log2(drafts /
    1e-6) after the change, so a pool that drafted 1000x more waited 30 minutes longer, and a slow pool no longer.
    Now both wait for the same moment, one evaluation interval at most after the restart-cost rule says so."""
    ready_s = 300.0  # one replica: one restart takes 300 pool-seconds, due 10000 s after the change
    due = max(ready_s / SPEC.autotune.min_gain, MIN_HORIZON_S)
    first = _first_reprobe(drafts_per_s, ready_s, hours=due / 3600 + 0.5)
    assert first is not None
    assert due <= first < due + EVALUATE_S
