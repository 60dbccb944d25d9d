"""The loop's schedule on the monotonic clock: full reconciles at reconcileIntervalSeconds, scrapes between,
due times served once (no spinning), backoff after failures."""

from __future__ import annotations

from specdec_operator.handlers.schedule import LoopSchedule
from specdec_operator.kube.retry import Backoff


def test_full_reconciles_follow_the_reconcile_interval_not_the_scrape_interval() -> None:
    schedule = LoopSchedule(reconcile_interval_s=30.0)
    assert schedule.full_due(now=0.0, nudged=False, evaluation_at=None, retry_at=None)
    schedule.succeeded(0.0, invalid_spec=False)
    schedule.ran_full(0.0, evaluation_at=None, retry_at=None)
    # A tuner scraping every 15 s wakes the loop, but only for a scrape.
    assert schedule.wake_at(scrape_at=15.0, evaluation_at=None, retry_at=None) == 15.0
    assert not schedule.full_due(now=15.0, nudged=False, evaluation_at=None, retry_at=None)
    assert schedule.full_due(now=30.0, nudged=False, evaluation_at=None, retry_at=None)


def test_a_change_an_evaluation_or_a_retry_runs_a_full_reconcile_early() -> None:
    schedule = LoopSchedule(reconcile_interval_s=30.0)
    schedule.succeeded(0.0, invalid_spec=False)
    assert schedule.full_due(now=1.0, nudged=True, evaluation_at=None, retry_at=None)
    assert schedule.full_due(now=20.0, nudged=False, evaluation_at=20.0, retry_at=None)
    assert schedule.full_due(now=12.0, nudged=False, evaluation_at=None, retry_at=10.0)
    assert schedule.wake_at(scrape_at=15.0, evaluation_at=20.0, retry_at=10.0) == 10.0


def test_a_due_time_a_reconcile_left_in_the_past_does_not_spin_the_loop() -> None:
    schedule = LoopSchedule(reconcile_interval_s=30.0)
    schedule.succeeded(5.0, invalid_spec=False)
    # The tuner could not evaluate (say, the status was unreadable), so its due time stayed at 4.0.
    schedule.ran_full(5.0, evaluation_at=4.0, retry_at=None)
    assert not schedule.full_due(now=6.0, nudged=False, evaluation_at=4.0, retry_at=None)
    assert schedule.wake_at(scrape_at=None, evaluation_at=4.0, retry_at=None) == 35.0
    # Once it moves, it counts again.
    assert schedule.full_due(now=21.0, nudged=False, evaluation_at=20.0, retry_at=None)


def test_an_invalid_spec_waits_for_a_change() -> None:
    schedule = LoopSchedule(reconcile_interval_s=30.0)
    schedule.succeeded(0.0, invalid_spec=True)
    assert not schedule.full_due(now=600.0, nudged=False, evaluation_at=None, retry_at=None)
    assert schedule.full_due(now=600.0, nudged=True, evaluation_at=None, retry_at=None)


def test_failures_back_off_exponentially_and_a_nudge_does_not_cut_the_wait() -> None:
    schedule = LoopSchedule(reconcile_interval_s=30.0, error_backoff=Backoff(base_s=1.0, cap_s=8.0))
    delays = [schedule.failed(100.0) for _ in range(6)]
    assert all(0.0 <= d <= ceiling for d, ceiling in zip(delays, (1, 2, 4, 8, 8, 8), strict=True))
    assert not schedule.full_due(now=schedule.next_full - 0.01, nudged=True, evaluation_at=None, retry_at=None)
    assert schedule.wake_at(scrape_at=0.0, evaluation_at=0.0, retry_at=0.0) == schedule.next_full
    schedule.succeeded(200.0, invalid_spec=False)
    assert schedule.failures == 0 and schedule.next_full == 230.0


def test_retry_after_sets_the_floor_of_a_failure_backoff() -> None:
    schedule = LoopSchedule(reconcile_interval_s=30.0, error_backoff=Backoff(base_s=0.1, cap_s=60.0))
    assert schedule.failed(0.0, retry_after_s=5.0) == 5.0


def test_a_held_pass_tries_again_soon_without_counting_as_a_failure() -> None:
    schedule = LoopSchedule(reconcile_interval_s=30.0)
    schedule.succeeded(0.0, invalid_spec=False, held=True)
    schedule.ran_full(0.0, evaluation_at=None, retry_at=None)
    assert schedule.failures == 0
    assert not schedule.full_due(now=0.5, nudged=False, evaluation_at=None, retry_at=None)
    assert schedule.full_due(now=1.0, nudged=False, evaluation_at=None, retry_at=None)


def test_passes_that_stay_held_back_off_so_a_failover_does_not_become_a_list_storm() -> None:
    # Each held pass may LIST the model's objects (handlers/resync.py): a fleet of models held after a failover
    # must not LIST every second for as long as a watch takes to catch up.
    schedule = LoopSchedule(reconcile_interval_s=30.0)
    now, waits = 0.0, []
    for _ in range(8):
        schedule.succeeded(now, invalid_spec=False, held=True)
        waits.append(schedule.next_full - now)
        now = schedule.next_full
    assert waits == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0, 15.0]  # doubling, capped below the reconcile interval
    assert schedule.full_due(now=now + 0.1, nudged=True, evaluation_at=None, retry_at=None)  # a watch event: at once
    schedule.succeeded(now, invalid_spec=False)  # the inputs came: the next hold starts at a second again
    schedule.succeeded(now, invalid_spec=False, held=True)
    assert schedule.next_full - now == 1.0
