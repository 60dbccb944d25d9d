"""The handler layer against a fake of our KubeApi seam: write order, decisions, conflicts, corrupted status,
bounded statistics and refused owned objects."""

from __future__ import annotations

import asyncio
import copy
import logging
from types import SimpleNamespace
from typing import Any

import aiohttp
import kopf
import pytest
from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter
from kopf._core.intents.stoppers import DaemonStoppingReason

from specdec_operator.api.status import SpeculationStatus, TuningDecision
from specdec_operator.handlers import register
from specdec_operator.handlers.context import OperatorContext
from specdec_operator.handlers.model_memory import ModelTuner
from specdec_operator.handlers.reconciler import reconcile, write
from specdec_operator.handlers.services.scrapes import ScrapeScheduler
from specdec_operator.handlers.writes import remember_written
from specdec_operator.kube.api import KubeApiError
from specdec_operator.metrics import REGISTRY
from specdec_operator.reconcile.observed import EventRecord, ObservedModel
from specdec_operator.reconcile.plan import ReconcilePlan, decision_plan, parse_previous_status, settle
from specdec_operator.reconcile.tuning_policy import TuningOutcome
from specdec_operator.settings import DEFAULT_IMAGE_TARGETS, DEFAULT_IMAGES, OperatorEnvSettings
from specdec_operator.tuner.engine import TunerState
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.handlers.fakeapi import FakeKubeApi, PostedEvents, live_indices
from tests.unit.reconcile.reconcilefactories import FLEET, NAMESPACE

NAME = "llama8b"
POOL = "llama8b-gfx942"
SPEC = spec_wire(drafters=[drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")],
                 placement={"gfxTargets": ["gfx942"]})
LOG = logging.getLogger("test")


def settings(**overrides: Any) -> OperatorEnvSettings:
    values: dict[str, Any] = {
        "runtime_images": DEFAULT_IMAGES, "image_targets": DEFAULT_IMAGE_TARGETS, "namespaces": [NAMESPACE],
        "status_stats_period_seconds": 300.0, "refused_write_backoff_seconds": 0.2,
        "refused_write_backoff_max_seconds": 1.0, **overrides,
    }
    return OperatorEnvSettings.model_validate(values)


class SteppedClock:
    """The context's monotonic clock, moved only by the test: pacing is checked exactly, whatever the machine does."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def context(api: FakeKubeApi, http: aiohttp.ClientSession, **overrides: Any) -> OperatorContext:
    ctx = OperatorContext(settings=settings(**overrides), api=api, http=http, clock=SteppedClock())
    ctx.cache.bind(live_indices(api))  # gather() reads owned objects from kopf's watch indices
    # Not running: no scrape round finishes during these tests, as before an operator's first round.
    ctx.scrapes = ScrapeScheduler(http, interval_s=15, timeout_s=5, concurrency=4, allow_non_loopback=False)
    return ctx


def stepped(ctx: OperatorContext) -> SteppedClock:
    assert isinstance(ctx.clock, SteppedClock)
    return ctx.clock


def model_body(api: FakeKubeApi, spec: dict[str, Any] | None = None) -> kopf.Body:
    stored = api.put({"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel",
                      "metadata": {"namespace": NAMESPACE, "name": NAME}, "spec": spec or SPEC})
    return kopf.Body(stored)


async def current(api: FakeKubeApi) -> kopf.Body:
    """kopf's body after its watch caught up."""
    found = await api.get("SpeculativeModel", NAMESPACE, NAME)
    assert found is not None
    return kopf.Body(found)


async def settled(ctx: OperatorContext, api: FakeKubeApi) -> kopf.Body:
    await reconcile(ctx, model_body(api), FLEET, LOG)
    api.roll_out()
    await reconcile(ctx, await current(api), FLEET, LOG)
    api.calls.clear()
    return await current(api)


def deployment_k(api: FakeKubeApi) -> str:
    deployment = api.objects[("Deployment", NAMESPACE, POOL)]
    return str(deployment["spec"]["template"]["metadata"]["annotations"][contract.ANNOTATION_K])


def proposal(from_k: int, to_k: int) -> TuningOutcome:
    decision = TuningDecision(id="d1", time="2026-11-30T12:00:00Z", pool=POOL, from_k=from_k, to_k=to_k,
                              action="Change", reason="gain +4.0% >= 3.0%", predicted_gain=0.04, confidence=0.9)
    return TuningOutcome(speculation=SpeculationStatus(last_decision=decision), proposal=decision, proposed_at=50.0,
                         events=(EventRecord("Normal", "KChanged", "K 3 -> 5 (decision d1)"),))


def decided(body: kopf.Body, outcome: TuningOutcome) -> ReconcilePlan:
    """The plan `evaluate` makes of a pass whose tuner proposed `outcome`: the decision recorded alone."""
    return settle(observed_of(body), decision_plan(parse_previous_status(body["status"]), outcome),
                  "2026-11-30T12:00:00Z")


def observed_of(body: kopf.Body) -> ObservedModel:
    return ObservedModel(namespace=NAMESPACE, name=NAME, uid=body["metadata"]["uid"],
                         generation=body["metadata"]["generation"], spec=body["spec"], status=body["status"])


async def test_status_is_written_before_any_owned_object(http: aiohttp.ClientSession, events: PostedEvents) -> None:
    api = FakeKubeApi()
    await reconcile(context(api, http), model_body(api), FLEET, LOG)
    verbs = [call.verb for call in api.calls]
    assert verbs[0] == "patch-status" and "apply" in verbs
    assert all(verb != "patch-status" for verb in verbs[1:]), verbs


async def test_a_decision_is_in_status_before_any_deployment_and_then_rendered_once(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    ctx = context(api, http)
    body = await settled(ctx, api)
    events.drain()
    assert deployment_k(api) == "3"
    tuner = ctx.model(NAMESPACE, NAME).tuner = ModelTuner(TunerState())
    outcome = proposal(3, 5)
    await write(ctx, body, dict(body), observed_of(body), decided(body, outcome), LOG)
    assert [c.verb for c in api.calls] == ["patch-status"]  # the decision alone, nothing rendered yet
    stored = api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]
    assert stored["pools"][0]["effectiveK"] == 5 and stored["speculation"]["lastDecision"]["id"] == "d1"
    assert tuner.state.last_change_at == 50.0  # committed only now
    assert events.drain() == [("Normal", "KChanged", "K 3 -> 5 (decision d1)")]
    # kopf's body is still the one from before the write: the written object is the baseline, no revert.
    await reconcile(ctx, body, FLEET, LOG)
    deployment_applies = api.writes("apply", "Deployment")
    assert [c.name for c in deployment_applies] == [POOL] and deployment_k(api) == "5"
    api.roll_out()
    api.calls.clear()
    await reconcile(ctx, await current(api), FLEET, LOG)
    await reconcile(ctx, body, FLEET, LOG)  # a stale body again, after the rollout: still nothing to do
    assert api.writes("apply", "Deployment") == []


@pytest.mark.parametrize("refusal", [
    KubeApiError(409, "Conflict", "the object has been modified"),
    KubeApiError(422, "Invalid", "denied by ValidatingAdmissionPolicy 'freeze-status'"),
])
async def test_a_refused_decision_write_changes_nothing_and_is_not_committed(
    http: aiohttp.ClientSession, events: PostedEvents, refusal: KubeApiError
) -> None:
    api = FakeKubeApi()
    ctx = context(api, http)
    body = await settled(ctx, api)
    events.drain()
    tuner = ctx.model(NAMESPACE, NAME).tuner = ModelTuner(TunerState())
    labels = {"namespace": NAMESPACE, "model": NAME, "pool": POOL}
    changes_before = REGISTRY.get_sample_value("specdec_k_changes_total", labels) or 0.0
    api.refuse[("patch-status", "SpeculativeModel")] = lambda _: refusal
    with pytest.raises(KubeApiError):
        await write(ctx, body, dict(body), observed_of(body), decided(body, proposal(3, 5)), LOG)
    assert tuner.state.last_change_at is None
    assert (REGISTRY.get_sample_value("specdec_k_changes_total", labels) or 0.0) == changes_before
    assert events.drain() == []
    await reconcile(ctx, body, FLEET, LOG)  # the next pass renders what status says: still K=3
    assert api.writes("apply", "Deployment") == [] and deployment_k(api) == "3"


@pytest.mark.parametrize("lost_answer", [
    KubeApiError(0, "Unreachable", "PATCH .../status: TimeoutError"),  # stored, but the answer never came
    KubeApiError(409, "Conflict", "the object has been modified"),  # a retry that met our own stored write
])
async def test_a_stored_decision_whose_answer_was_lost_is_committed_once(
    http: aiohttp.ClientSession, events: PostedEvents, lost_answer: KubeApiError
) -> None:
    api = FakeKubeApi()
    ctx = context(api, http)
    body = await settled(ctx, api)
    events.drain()
    tuner = ctx.model(NAMESPACE, NAME).tuner = ModelTuner(TunerState())
    labels = {"namespace": NAMESPACE, "model": NAME, "pool": POOL}
    changes_before = REGISTRY.get_sample_value("specdec_k_changes_total", labels) or 0.0
    store = api.patch_status

    async def stored_then_lost(*args: Any, **kwargs: Any) -> dict[str, Any]:
        await store(*args, **kwargs)
        raise lost_answer

    api.patch_status = stored_then_lost  # type: ignore[method-assign]
    await write(ctx, body, dict(body), observed_of(body), decided(body, proposal(3, 5)), LOG)
    api.patch_status = store  # type: ignore[method-assign]
    assert tuner.state.last_change_at == 50.0  # the cooldown runs from the recorded decision
    assert (REGISTRY.get_sample_value("specdec_k_changes_total", labels) or 0.0) == changes_before + 1
    assert events.drain() == [("Normal", "KChanged", "K 3 -> 5 (decision d1)")]
    await reconcile(ctx, body, FLEET, LOG)  # a stale body: the re-read record is the baseline, K=5 rendered
    assert [c.name for c in api.writes("apply", "Deployment")] == [POOL] and deployment_k(api) == "5"


async def test_a_concurrent_status_write_is_reread_never_overwritten(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    ctx = context(api, http)
    body = await settled(ctx, api)
    # Another replica recorded a decision in between; our body does not know it yet.
    other = api.objects[("SpeculativeModel", NAMESPACE, NAME)]
    other["status"]["pools"][0]["effectiveK"] = 6
    other["metadata"]["resourceVersion"] = "999999"
    ctx.model(NAMESPACE, NAME).written = None
    with pytest.raises(KubeApiError) as raised:
        await write(ctx, body, dict(body), observed_of(body), decided(body, proposal(3, 5)), LOG)
    assert raised.value.status == 409
    assert api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]["pools"][0]["effectiveK"] == 6
    assert ctx.model(NAMESPACE, NAME).written["metadata"]["resourceVersion"] == "999999"  # re-read at once
    await reconcile(ctx, body, FLEET, LOG)  # re-evaluated from what is stored
    assert deployment_k(api) == "6"


async def test_a_model_relabelled_out_of_the_shard_is_left_alone_even_after_a_conflict_reread(
    http: aiohttp.ClientSession, events: PostedEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeKubeApi()
    ctx = context(api, http, model_selector="specdec.io/shard notin (a)", shard="rest")
    body = await settled(ctx, api)
    assert api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]["shard"] == "rest"
    # Relabelled into shard a, which already wrote its name; our watch has not said the model left yet.
    moved = api.objects[("SpeculativeModel", NAMESPACE, NAME)]
    moved["metadata"]["labels"] = {"specdec.io/shard": "a"}
    moved["status"]["shard"] = "a"
    moved["metadata"]["resourceVersion"] = "999999"
    remember_written(ctx, (NAMESPACE, NAME), moved, over=body)  # what a 409's re-read brings back
    before = len(api.writes())
    # The model's loop judges it, before any pass: it waits for the watch instead, and ends on its DELETED.
    memo = SimpleNamespace(context=ctx)
    waiting = asyncio.Event()
    real_sleep = register._sleep_until_nudged

    async def sleep_until_nudged(*args: Any) -> bool:
        waiting.set()
        return await real_sleep(*args)

    monkeypatch.setattr(register, "_sleep_until_nudged", sleep_until_nudged)
    setter: FlagSetter[DaemonStoppingReason] = FlagSetter()
    loop = asyncio.create_task(register.reconcile_loop(
        stopped=AsyncFlagWaiter(setter), body=body, namespace=NAMESPACE, name=NAME, memo=memo, logger=LOG,
        gpu_nodes={}, gpu_pods={}, **live_indices(api)))
    try:
        await asyncio.wait_for(waiting.wait(), 10)
        await register.model_changed(namespace=NAMESPACE, name=NAME, type="DELETED", body=body, memo=memo)
        await asyncio.wait_for(loop, 10)
    finally:
        loop.cancel()
    assert len(api.writes()) == before  # no status, no owned object: shard a owns it now
    assert api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]["shard"] == "a"


def test_a_model_selector_that_does_not_parse_stops_the_operator_at_start() -> None:
    with pytest.raises(ValueError, match=r"model_selector\n.*unbalanced"):
        settings(model_selector="specdec.io/shard in (a")


async def test_a_corrupted_status_holds_every_pool_and_names_the_field(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    ctx = context(api, http)
    await settled(ctx, api)
    events.drain()
    stored = api.objects[("SpeculativeModel", NAMESPACE, NAME)]
    stored["status"]["speculation"]["lastDecision"] = {
        "time": "last tuesday", "pool": POOL, "fromK": 3, "toK": 4, "action": "Change", "reason": "by hand"}
    stored["status"]["pools"][0]["effectiveK"] = 4
    stored["spec"]["placement"]["replicasPerPool"] = 3  # a spec change that would otherwise roll the pool
    ctx.model(NAMESPACE, NAME).written = None
    for _ in range(2):
        await reconcile(ctx, await current(api), FLEET, LOG)
    assert [c.verb for c in api.calls] == ["patch-status"]  # one conditions write, then quiet
    assert set(api.calls[0].body) == {"conditions"}
    after = api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]
    assert after["speculation"]["lastDecision"]["time"] == "last tuesday"  # kept for the human to repair
    degraded = next(c for c in after["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "StatusUnreadable" and "status.speculation.lastDecision.time" in degraded["message"]
    [(kind, reason, message)] = events.drain()
    assert (kind, reason) == ("Warning", "StatusUnreadable") and "lastDecision.time" in message
    assert deployment_k(api) == "3"


async def test_removed_status_fields_disappear(http: aiohttp.ClientSession, events: PostedEvents) -> None:
    api = FakeKubeApi()
    ctx = context(api, http)
    await settled(ctx, api)
    stored = api.objects[("SpeculativeModel", NAMESPACE, NAME)]
    stored["status"]["speculation"]["lastChangeTime"] = "2026-11-30T12:00:00Z"  # written by an older operator
    ctx.model(NAMESPACE, NAME).written = None
    await reconcile(ctx, await current(api), FLEET, LOG)
    assert [c.body for c in api.writes("patch-status")] == [{"speculation": {"lastChangeTime": None}}]
    assert "lastChangeTime" not in api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]["speculation"]


async def test_a_refused_owned_object_is_reported_and_retried_with_backoff(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    ctx = context(api, http)
    message = ('Deployment.apps "llama8b-gfx942" is invalid: spec.template.spec.containers[0].resources.limits: '
               'Invalid value: "2Gibibytes": quantities must match the regular expression')
    api.refuse[("apply", "Deployment")] = lambda _: KubeApiError(422, "Invalid", message)
    ctx.model(NAMESPACE, NAME).wakeup.clear()
    await reconcile(ctx, model_body(api), FLEET, LOG)
    # The refusal nudges the model: the next pass, at once, gathers it into Degraded (one status write a pass).
    assert ctx.model(NAMESPACE, NAME).wakeup.is_set()
    await reconcile(ctx, await current(api), FLEET, LOG)
    status = api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "WriteRefused" and message in degraded["message"]
    posted = [event for event in events.drain() if event[0] == "Warning"]
    assert [(t, r) for t, r, _ in posted] == [("Warning", "WriteRefused")] and message in posted[0][2]
    attempts = []
    clock = stepped(ctx)
    for _ in range(6):  # 0.9 s of a loop that runs every 0.15 s: backoff 0.2 s, then 0.4 s, ...
        clock.advance(0.15)
        await reconcile(ctx, await current(api), FLEET, LOG)
        attempts.append(len(api.writes("apply", "Deployment")))
    # Refused at 0 (retry at 0.2), tried at 0.3 (retry at 0.7), tried at 0.75: not every pass, backed off.
    assert attempts == [1, 2, 2, 2, 3, 3], attempts
    # The first pass wrote its status, the nudged pass the condition; retries rewrite nothing.
    assert len(api.writes("patch-status")) == 2
    del api.refuse[("apply", "Deployment")]
    clock.advance(1.0)
    for _ in range(2):
        await reconcile(ctx, await current(api), FLEET, LOG)
    degraded = next(c for c in api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]["conditions"]
                    if c["type"] == "Degraded")
    assert degraded["status"] == "False"


async def test_a_refused_objects_backoff_counts_from_the_refusal_not_from_the_passs_start(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    # On a loaded machine the refusal can come back long after the pass began; counting the wait from the pass's
    # start would send the next try early (a 4 s wait seen as 3.1 s on the server), so the backoff would not double.
    api = FakeKubeApi()
    ctx = context(api, http)  # backoff 0.2 s, doubling
    clock = stepped(ctx)

    def slow_refusal(_: Any) -> KubeApiError:
        clock.advance(0.3)  # the API server answers 0.3 s after the request left
        return KubeApiError(422, "Invalid", "spec.template: refused")

    api.refuse[("apply", "Deployment")] = slow_refusal
    await reconcile(ctx, model_body(api), FLEET, LOG)
    refused_at = clock.now
    assert len(api.writes("apply", "Deployment")) == 1
    clock.advance(0.15)  # 0.45 s after the pass began, 0.15 s after the refusal: not yet
    await reconcile(ctx, await current(api), FLEET, LOG)
    assert len(api.writes("apply", "Deployment")) == 1
    clock.now = refused_at + 0.2
    await reconcile(ctx, await current(api), FLEET, LOG)
    assert len(api.writes("apply", "Deployment")) == 2
    second_refusal_at = clock.now
    clock.now = second_refusal_at + 0.39  # the second wait is 0.4 s from the second refusal
    await reconcile(ctx, await current(api), FLEET, LOG)
    assert len(api.writes("apply", "Deployment")) == 2
    clock.now = second_refusal_at + 0.4
    await reconcile(ctx, await current(api), FLEET, LOG)
    assert len(api.writes("apply", "Deployment")) == 3


async def test_live_statistics_reach_status_at_a_bounded_rate(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    from specdec_operator.handlers.writes import write_status

    api = FakeKubeApi()
    ctx = context(api, http, status_stats_period_seconds=0.3)
    body = await settled(ctx, api)
    base = dict(await current(api))
    fresher = copy.deepcopy(base["status"])
    assert base["status"]["speculation"].get("acceptanceRate") is None
    fresher["speculation"]["acceptanceRate"] = 0.71
    fresher["summary"]["acceptance"] = "71%"
    written = await write_status(ctx, base, fresher, LOG)  # the first known acceptance goes out at once
    assert written is not None and written["status"]["speculation"]["acceptanceRate"] == 0.71
    fresher["speculation"]["acceptanceRate"] = 0.50
    assert await write_status(ctx, written, fresher, LOG) is None  # not due again yet
    stepped(ctx).advance(0.3)
    fresher["speculation"]["acceptanceRate"] = 0.72
    assert await write_status(ctx, written, fresher, LOG) is None  # due, but within the tolerance
    fresher["speculation"]["acceptanceRate"] = 0.50
    written = await write_status(ctx, written, fresher, LOG)  # due and moved
    assert written is not None and written["status"]["speculation"]["acceptanceRate"] == 0.50
    fresher["speculation"]["acceptanceRate"] = 0.72
    decided = copy.deepcopy(fresher)
    decided["pools"][0]["effectiveK"] = 4
    now_written = await write_status(ctx, written, decided, LOG)  # a decision goes at once, stats ride along
    assert now_written is not None and now_written["status"]["speculation"]["acceptanceRate"] == 0.72
    assert body is not None


async def test_a_models_provisional_first_statistics_may_be_refreshed_once_before_the_period(
    http: aiohttp.ClientSession, events: PostedEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first figures come from a window that began before traffic reached every pod: a fleet that has
    # just become Ready converges with one early refresh per model, not one a whole period later.
    from specdec_operator.handlers import writes

    monkeypatch.setattr(writes, "FIRST_REFRESH_S", 0.2)
    api = FakeKubeApi()
    ctx = context(api, http, status_stats_period_seconds=30.0)
    await settled(ctx, api)
    base = dict(await current(api))
    fresher = copy.deepcopy(base["status"])
    fresher["speculation"]["acceptanceRate"] = 0.40
    written = await writes.write_status(ctx, base, fresher, LOG)  # first known: at once
    assert written is not None
    fresher["speculation"]["acceptanceRate"] = 0.70
    assert await writes.write_status(ctx, written, fresher, LOG) is None  # not even the early refresh yet
    clock = stepped(ctx)
    clock.advance(0.19)
    assert await writes.write_status(ctx, written, fresher, LOG) is None
    clock.advance(0.01)
    written = await writes.write_status(ctx, written, fresher, LOG)  # the one early refresh
    assert written is not None and written["status"]["speculation"]["acceptanceRate"] == 0.70
    clock.advance(0.25)
    fresher["speculation"]["acceptanceRate"] = 0.40
    assert await writes.write_status(ctx, written, fresher, LOG) is None  # from now on, the full period


async def test_a_pass_during_which_the_model_left_the_watch_writes_nothing(
    http: aiohttp.ClientSession, events: PostedEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A relabel out of the model selector reaches the old install as a DELETED event carrying the object as it was
    # (labels that still match) with the relabel's resourceVersion: a write based on it would pass the server's
    # resourceVersion check. A pass during which the watch said DELETED must therefore write nothing.
    from specdec_operator.handlers import reconciler

    api = FakeKubeApi()
    ctx = context(api, http)
    body = model_body(api)
    real_gather = reconciler.gather

    async def gather_then_depart(*args: Any, **kwargs: Any) -> ObservedModel:
        observed = await real_gather(*args, **kwargs)
        ctx.depart(NAMESPACE, NAME)  # kopf ran the DELETED event's handler while this pass awaited
        return observed

    monkeypatch.setattr(reconciler, "gather", gather_then_depart)
    plan = await reconcile(ctx, body, FLEET, LOG)
    assert plan.held is not None and "left" in plan.held
    assert api.writes("patch-status") == [] and api.writes("apply") == []


async def test_a_pass_that_starts_after_the_model_left_the_watch_writes_nothing(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    # The DELETED event can land after the loop last looked and before its next pass starts (the loop awaits the
    # fleet audit in between). That pass's body is the departed one (matching labels, the relabel's
    # resourceVersion), so it is judged by the count its loop started with, not the count when the pass began.
    api = FakeKubeApi()
    ctx = context(api, http)
    body = model_body(api)
    loop_started_at = ctx.departures.get((NAMESPACE, NAME), 0)
    ctx.depart(NAMESPACE, NAME)
    plan = await reconcile(ctx, body, FLEET, LOG, departures=loop_started_at)
    assert plan.held is not None and "left" in plan.held
    assert api.writes("patch-status") == [] and api.writes("apply") == []


async def test_an_object_with_our_name_that_we_do_not_own_is_left_alone_and_named(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    """Issue 34 item 8: a Service (or Deployment) someone else created under a name we compute is never taken over
    by a forced server-side apply; the model says which object is in the way, as a Deployment reports a ReplicaSet
    conflict, and the rest of the model's objects are written."""
    api = FakeKubeApi()
    theirs = api.put({"apiVersion": "v1", "kind": "Service",
                      "metadata": {"namespace": NAMESPACE, "name": NAME, "labels": {"app": "theirs"}},
                      "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}})
    other_owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "someone-else",
                   "controller": True}
    api.put({"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"namespace": NAMESPACE, "name": POOL, "ownerReferences": [other_owner]},
             "spec": {"replicas": 1}})
    ctx = context(api, http)
    for _ in range(2):
        await reconcile(ctx, await current(api) if _ else model_body(api), FLEET, LOG)
        stepped(ctx).advance(5.0)
    assert not [c for c in api.writes("apply") if c.name in (NAME, POOL) and c.kind in ("Service", "Deployment")]
    assert api.objects[("Service", NAMESPACE, NAME)]["spec"] == theirs["spec"]
    assert api.objects[("Deployment", NAMESPACE, POOL)]["metadata"]["ownerReferences"] == [other_owner]
    assert api.writes("apply", "ConfigMap"), "objects nobody else holds are still written"
    status = api.objects[("SpeculativeModel", NAMESPACE, NAME)]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ObjectNotOwned", degraded
    assert f"Service/{NAME}" in degraded["message"] and f"Deployment/{POOL}" in degraded["message"]
    posted = [event for event in events.drain() if event[1] == "ObjectNotOwned"]
    assert posted and any(f"Service/{NAME}" in event[2] for event in posted)
    await api.delete("SpeculativeModel", NAMESPACE, NAME)
    assert ("Service", NAMESPACE, NAME) in api.objects
    assert not api.writes("delete", "Service")


async def test_a_status_write_whose_answer_was_lost_posts_its_events_once(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    """The client retries a PATCH whose answer timed out; the retry meets our own stored write as a 409. The
    re-read shows the status this pass computed, so it counts as written and its events are posted: the next
    pass starts from that status and would never post them."""
    api = FakeKubeApi()
    ctx = context(api, http)
    await settled(ctx, api)
    events.drain()
    store = api.patch_status

    async def stored_then_conflict(*args: Any, **kwargs: Any) -> dict[str, Any]:
        await store(*args, **kwargs)
        raise KubeApiError(409, "Conflict", "the object has been modified")

    api.patch_status = stored_then_conflict  # type: ignore[method-assign]
    stored = api.objects[("SpeculativeModel", NAMESPACE, NAME)]
    stored["spec"]["model"]["maxModelLen"] = 4096  # a spec change: the pass writes new revisions to status
    stored["metadata"]["generation"] = 2
    await reconcile(ctx, await current(api), FLEET, LOG)
    api.patch_status = store  # type: ignore[method-assign]
    posted = [reason for _, reason, _ in events.drain()]
    assert "RevisionChanged" in posted, posted
    await reconcile(ctx, await current(api), FLEET, LOG)
    assert "RevisionChanged" not in [reason for _, reason, _ in events.drain()]  # once
