"""specdec_k_changes_total and KChanged follow rollouts: with strategy Canary a recorded decision is only
proposed (KProposed, not counted); the canary's promotion posts KChanged and counts it once."""

from __future__ import annotations

import aiohttp

from specdec_operator.api.status import CanaryStatus, SpeculativeModelStatus
from specdec_operator.handlers.model_memory import ModelTuner
from specdec_operator.handlers.reconciler import write
from specdec_operator.metrics import REGISTRY, count_rollouts
from specdec_operator.reconcile.observed import EventRecord
from specdec_operator.reconcile.plan import ReconcilePlan
from specdec_operator.tuner.engine import TunerState
from tests.unit.handlers.fakeapi import FakeKubeApi, PostedEvents
from tests.unit.handlers.test_reconciler import (
    LOG,
    NAME,
    NAMESPACE,
    POOL,
    context,
    decided,
    observed_of,
    proposal,
    settled,
)

LABELS = {"namespace": NAMESPACE, "model": NAME, "pool": POOL}


def changes() -> float:
    return REGISTRY.get_sample_value("specdec_k_changes_total", LABELS) or 0.0


async def test_a_decision_that_rolls_out_through_a_canary_is_not_counted_when_recorded(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    ctx = context(api, http)
    body = await settled(ctx, api)
    events.drain()
    tuner = ctx.model(NAMESPACE, NAME).tuner = ModelTuner(TunerState())
    before = changes()
    proposed = proposal(3, 5)
    canary_mode = type(proposed)(**{**proposed.__dict__, "rolls_out_now": False,
                                    "events": (EventRecord("Normal", "KProposed", "K 3 -> 5 (decision d1)"),)})
    await write(ctx, body, dict(body), observed_of(body), decided(body, canary_mode), LOG)
    assert tuner.state.last_change_at == 50.0  # recorded: the cooldown runs
    assert changes() == before
    assert events.drain() == [("Normal", "KProposed", "K 3 -> 5 (decision d1)")]


def test_the_promotion_event_counts_the_k_change_once(events: PostedEvents) -> None:
    canary = CanaryStatus(pool=POOL, stable_revision="a", canary_revision="b", phase="Promoted", weight=100,
                          step_started_at="2026-11-30T12:00:00Z", canary_k=5, decision_id="d1")
    plan = ReconcilePlan(status=SpeculativeModelStatus(canary=canary), events=[
        EventRecord("Normal", "CanaryPromoted", "all 2 steps passed"),
        EventRecord("Normal", "KChanged", "llama8b-gfx942: K 3 -> 5 rolled out (canary promoted)"),
    ])
    before = changes()
    count_rollouts(NAMESPACE, NAME, canary.pool, [event.reason for event in plan.events])
    assert changes() == before + 1
