"""A pool that has only ever run one K probes a neighbouring K once (tuner/policy.py `_probe_neighbour`).

At one K the step time cannot tell the drafts' cost from the target's: the method's prior splits it. A drafter
several times dearer than its prior then makes a lower K look no better, and a pool held at its first K never
measures otherwise. One probe of a neighbour, a cooldown into the window, measures the split.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.bench.closedloop import BenchOptions, run_static, run_tuner
from specdec_operator.tuner.policy import PoolEvidence
from specdec_runtime.simulator.profile import load_profile
from tests.unit.tuner.test_policy import NOW, decided, evidence

COOLDOWN_S = 600


def first_k(k: int = 2, *, min_k: int = 0, max_k: int = 10, **autotune: object) -> Speculation:
    """Bounds whose initialK is `k`: a pool at `k` with no K change on record has run no other K."""
    return Speculation(initial_k=k, min_k=min_k, max_k=max_k,
                       autotune=Autotune(cooldown_seconds=COOLDOWN_S, **autotune))  # type: ignore[arg-type]


def held_at_two(window_s: float = COOLDOWN_S, **extra: object) -> PoolEvidence:
    """Chat acceptance at K=2, where the mean says hold (K=2 is best by the priors)."""
    pool = {"replicas": 4, "ready_s": 120.0, "out_at_once": 1, **extra}
    return evidence(k=2, window_s=window_s, **pool)


def test_a_pool_that_only_ran_its_first_k_probes_a_neighbour_a_cooldown_into_its_window() -> None:
    decision = decided(held_at_two(), first_k())
    assert decision.action == "Explore" and decision.from_k == 2 and decision.to_k in (1, 3)
    assert "probing K=" in decision.reason and "only K this pool has run" in decision.reason
    assert "two restarts cost 1.1%" in decision.reason and "K=2 is best" in decision.reason


def test_before_a_cooldown_into_the_window_it_holds_and_says_when() -> None:
    decision = decided(held_at_two(window_s=COOLDOWN_S - 200), first_k())
    assert (decision.action, decision.to_k) == ("Hold", 2)
    assert "K=2 is the only K measured: probing K=" in decision.reason and "in 200s" in decision.reason


def test_a_pool_that_ran_another_k_does_not_probe() -> None:
    decision = decided(held_at_two(previous_k=5), first_k())
    assert (decision.action, decision.to_k) == ("Hold", 2)
    assert "probing" not in decision.reason


def test_a_k_other_than_initial_k_counts_as_measured_before() -> None:
    # After an operator restart only status is left: a pool at a K other than initialK ran another K.
    decision = decided(held_at_two(), first_k(5))
    assert (decision.action, decision.to_k) == ("Hold", 2)
    assert "probing" not in decision.reason


def test_the_cooldown_after_a_model_change_holds_the_probe() -> None:
    decision = decided(held_at_two(), first_k(), last_change_at=NOW - 60)
    assert (decision.action, decision.to_k) == ("Hold", 2)


def test_dear_restarts_wait_until_they_cost_at_most_min_gain_of_the_time_held() -> None:
    # One replica out for 10 minutes per restart: two are 1200 pool-seconds, 5.6% of the 6 h horizon, more than
    # minGain 3%. The probe waits until they are 3% of the time the pool has held its K: 40000 s.
    early = decided(held_at_two(replicas=1, ready_s=600.0, window_s=30_000.0), first_k())
    assert (early.action, early.to_k) == ("Hold", 2)
    assert "probing K=" in early.reason and "two restarts (1200 pool-seconds)" in early.reason
    assert "cost at most minGain 3.0% of the time held, in 2.8 h" in early.reason
    due = decided(held_at_two(replicas=1, ready_s=600.0, window_s=40_001.0), first_k())
    assert due.action == "Explore" and "two restarts cost 3.0%" in due.reason


@pytest.mark.parametrize(("rejected", "probed"), [({1: 0.05}, 3), ({3: 0.05}, 1), ({1: 0.05, 3: 0.05}, None)],
                         ids=["below-rejected", "above-rejected", "both-rejected"])
def test_a_neighbour_its_canary_rolled_back_is_not_probed(rejected: dict[int, float], probed: int | None) -> None:
    decision = decided(held_at_two(rejected=rejected), first_k())
    if probed is None:
        assert (decision.action, decision.to_k) == ("Hold", 2)
    else:
        assert (decision.action, decision.to_k) == ("Explore", probed)


def test_pinned_bounds_leave_nothing_to_probe() -> None:
    decision = decided(held_at_two(), first_k(min_k=2, max_k=2))
    assert (decision.action, decision.to_k) == ("Hold", 2)


# Code completion whose drafter costs six times the eagle3 prior per pass, at 4 running requests per replica: the
# priors make K=5 (the initial K) look best, and without a measurement at a second K the pool stayed there for good
# (0.74 of the best static K, K=1).
COSTLY_DRAFTER = """\
acceptance: [0.85, 0.78, 0.72, 0.66, 0.6, 0.55, 0.5]
step_time: {base_s: 0.022, per_token_s: 0.00012, draft_base_s: 0.0132, draft_per_token_s: 0.00012}
load:
  - {duration_s: 14400, concurrency: 4}
restart_s: 120
replicas: 4
"""


def test_a_drafter_six_times_dearer_than_its_prior_is_found_out_in_the_closed_loop(tmp_path: Path) -> None:
    path = tmp_path / "costly-drafter.yaml"
    path.write_text(COSTLY_DRAFTER)
    profile, options = load_profile(path), BenchOptions()
    run = run_tuner(profile, options)
    static = {k: run_static(profile, k, options) for k in range(options.min_k, options.max_k + 1)}
    best_k = max(static, key=lambda k: static[k])
    assert run.changes and run.changes[0].action == "Explore" and "probing" in run.changes[0].reason
    assert run.final_k == best_k, (run.final_k, best_k, [(c.from_k, c.to_k, c.action) for c in run.changes])
    print(f"\ntuner {run.tokens / static[best_k]:.3f} of static K={best_k}, K={options.initial_k} "
          f"{static[options.initial_k] / static[best_k]:.3f}")
