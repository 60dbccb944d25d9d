"""A stop signal raises kopf's stop flag, makes kopf's requests fail fast, and cancels kopf after the grace
period or at a second signal. Real signals to this process; the e2e test_shutdown.py runs the real operator."""

from __future__ import annotations

import asyncio
import os
import signal

import kopf
import pytest

from specdec_operator.handlers.services.shutdown import STOPPING_REQUEST_TIMEOUT_S, Stopper, fail_fast


def test_fail_fast_leaves_one_short_attempt_per_request() -> None:
    settings = kopf.OperatorSettings()
    assert settings.networking.error_backoffs and settings.networking.request_timeout == 300  # kopf's defaults
    fail_fast(settings)
    assert tuple(settings.networking.error_backoffs) == ()
    assert settings.networking.request_timeout == settings.networking.connect_timeout == STOPPING_REQUEST_TIMEOUT_S
    settings.networking.request_timeout = 0.5
    fail_fast(settings)
    assert settings.networking.request_timeout == 0.5  # never longer than it was


@pytest.fixture
async def held() -> asyncio.Task[None]:
    """Stands in for the task running kopf.run_tasks(): runs until cancelled."""
    return asyncio.create_task(asyncio.Event().wait())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_raises_the_stop_flag_and_cancels_kopf_after_the_grace(
    held: asyncio.Task[None], sig: signal.Signals,
) -> None:
    settings = kopf.OperatorSettings()
    stopper = Stopper(settings, grace_s=0.2)
    stopper.watch(held)
    try:
        os.kill(os.getpid(), sig)
        await asyncio.wait_for(stopper.stop_flag.wait(), 10)
        assert stopper.signalled == sig and tuple(settings.networking.error_backoffs) == ()
        assert not held.done()  # the graceful stop has its grace period
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(held, 10)  # then what is left of kopf is cancelled
    finally:
        stopper.close()


async def test_a_second_signal_cancels_kopf_at_once(held: asyncio.Task[None]) -> None:
    stopper = Stopper(kopf.OperatorSettings(), grace_s=3600)
    stopper.watch(held)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stopper.stop_flag.wait(), 10)
        assert not held.done()
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(held, 10)
    finally:
        stopper.close()
