"""A replica that resumes after a pause reads kopf's indices while kopf lists every kind again: until they caught up
with a LIST of the model, its passes hold and write nothing (tests/e2e/test_ha.py's takeover mid-canary rolled
the stable Deployment to the canary's revision from such a pass)."""

from __future__ import annotations

import copy
import logging
from typing import Any

import aiohttp

from specdec_operator.handlers.context import OperatorContext
from specdec_operator.handlers.model_memory import Listing
from specdec_operator.handlers.reconciler import reconcile
from specdec_operator.handlers.resync import compare
from specdec_operator.handlers.services.cache import WatchCache
from specdec_operator.handlers.services.scrapes import ScrapeScheduler
from specdec_runtime import contract
from tests.unit.api.specfactories import drafter_wire, spec_wire
from tests.unit.handlers.fakeapi import FakeKubeApi, KopfView, PostedEvents, live_indices
from tests.unit.handlers.test_reconciler import NAME, POOL, context, current, model_body, settings
from tests.unit.reconcile.reconcilefactories import FLEET, NAMESPACE

CANARY_NAME = f"{POOL}-canary"
ROLLOUT = {"strategy": "Canary", "canary": {
    "steps": [{"weight": 10, "pauseSeconds": 10}, {"weight": 50, "pauseSeconds": 10}, {"weight": 100}]}}
PLACEMENT = {"gfxTargets": ["gfx942"], "replicasPerPool": 2}
SPEC = spec_wire(drafters=[drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")], placement=PLACEMENT,
                 rollout=ROLLOUT)
CHANGED = spec_wire(drafters=[drafter_wire("eagle3", "example-org/EAGLE3-v2")], placement=PLACEMENT, rollout=ROLLOUT)
LOG = logging.getLogger("test")


def revision(api: FakeKubeApi, name: str) -> str:
    body = api.objects[("Deployment", NAMESPACE, name)]
    return str(body["spec"]["template"]["metadata"]["labels"][contract.LABEL_REVISION])


async def canary_at_step_one(api: FakeKubeApi, http: aiohttp.ClientSession) -> dict[str, Any]:
    """The leader's work until it dies: settled, the drafter changed, the canary's first step at 10%."""
    leader = context(api, http)
    await reconcile(leader, model_body(api, SPEC), FLEET, LOG)
    api.roll_out()
    await reconcile(leader, await current(api), FLEET, LOG)
    model = api.objects[("SpeculativeModel", NAMESPACE, NAME)]
    model["spec"] = copy.deepcopy(CHANGED)
    model["metadata"]["generation"] += 1
    await reconcile(leader, await current(api), FLEET, LOG)
    api.roll_out()
    await reconcile(leader, await current(api), FLEET, LOG)
    canary = (await current(api))["status"]["canary"]
    assert (canary["phase"], canary["step"], canary["weight"]) == ("Progressing", 0, 10), canary
    assert revision(api, POOL) == canary["stableRevision"] and revision(api, CANARY_NAME) == canary["canaryRevision"]
    return dict(canary)


def survivor(api: FakeKubeApi, http: aiohttp.ClientSession, view: KopfView) -> OperatorContext:
    """A fresh process that acted once (before the model existed), paused for the leader, and now resumes."""
    ctx = OperatorContext(settings=settings(), api=api, http=http)
    ctx.cache.bind(live_indices(view))
    ctx.cache.paused()
    ctx.scrapes = ScrapeScheduler(http, interval_s=15, timeout_s=5, concurrency=4, allow_non_loopback=False)
    return ctx


async def test_a_resumed_replica_holds_until_its_cache_caught_up_and_then_resumes_the_canary(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    before = await canary_at_step_one(api, http)
    view = KopfView(api, at_pause={})  # its indices as they were when it paused: nothing of the model
    ctx = survivor(api, http, view)
    api.calls.clear()

    held = await reconcile(ctx, await current(api), FLEET, LOG)
    assert held.held is not None
    assert {call.verb for call in api.calls} == {"list"}, api.calls  # nothing written, not even status
    assert revision(api, POOL) == before["stableRevision"]

    view.catch_up()  # kopf's re-list reached every kind
    api.calls.clear()
    plan = await reconcile(ctx, await current(api), FLEET, LOG)
    assert plan.held is None
    canary = (await current(api))["status"]["canary"]
    assert (canary["phase"], canary["step"], canary["weight"]) == ("Progressing", 0, 10), canary
    assert revision(api, POOL) == before["stableRevision"]
    assert revision(api, CANARY_NAME) == before["canaryRevision"]
    assert "CanaryCancelled" not in [reason for _, reason, _ in events.drain()]
    # Trusted from now on: no more LISTs for this model.
    api.calls.clear()
    await reconcile(ctx, await current(api), FLEET, LOG)
    assert api.writes("list") == []


async def test_objects_deleted_while_paused_are_left_out_once_a_list_proves_it(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    await canary_at_step_one(api, http)
    view = KopfView(api, at_pause={})
    ghost = copy.deepcopy(api.objects[("Deployment", NAMESPACE, CANARY_NAME)])
    ghost["metadata"].update({"name": f"{POOL}-old", "uid": "uid-deleted-while-paused", "resourceVersion": "101"})
    view.ghosts[("Deployment", NAMESPACE, f"{POOL}-old")] = ghost
    view.catch_up()
    ctx = survivor(api, http, view)
    api.calls.clear()
    plan = await reconcile(ctx, await current(api), FLEET, LOG)
    assert plan.held is None
    uid = api.objects[("SpeculativeModel", NAMESPACE, NAME)]["metadata"]["uid"]
    assert ("Deployment", f"{POOL}-old") not in ctx.cache.children(NAMESPACE, uid)
    assert api.writes("delete") == []


async def test_a_replica_that_never_paused_trusts_kopfs_first_fill(
    http: aiohttp.ClientSession, events: PostedEvents
) -> None:
    api = FakeKubeApi()
    await canary_at_step_one(api, http)
    assert api.writes("list") == []


def body(kind: str, name: str, version: int, uid: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "uid": uid or f"uid-{name}", "resourceVersion": str(version)}}


def test_the_index_is_caught_up_when_it_holds_every_listed_object_at_its_version_or_newer() -> None:
    listing = Listing([body("Deployment", "a", 10), body("Pod", "p", 12)], {"Deployment": "20", "Pod": "20"})
    assert compare([body("Deployment", "a", 10), body("Pod", "p", 15)], listing).caught_up
    assert compare([body("Deployment", "a", 10), body("Pod", "p", 15), body("Deployment", "new", 21)],
                   listing).caught_up  # created after the LIST
    lagging = compare([body("Deployment", "a", 9)], listing)
    assert lagging.behind == ("Deployment/a", "Pod/p") and not lagging.caught_up
    # Same name, another object: the one the index holds was deleted and the name reused.
    reused = compare([body("Deployment", "a", 8, uid="uid-old"), body("Pod", "p", 12)], listing)
    assert reused.behind == ("Deployment/a",) and reused.gone == {("Deployment", "uid-old", "8")}
    ghost = compare([body("Deployment", "a", 10), body("Pod", "p", 12), body("ConfigMap", "c", 5)],
                    Listing(listing.items, {**listing.versions, "ConfigMap": "20"}))
    assert ghost.caught_up and ghost.gone == {("ConfigMap", "uid-c", "5")}


def test_reads_leave_out_what_a_list_proved_deleted() -> None:
    owned = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
    owner = [{"kind": "SpeculativeModel", "uid": "m"}]

    def indexed(name: str, version: str) -> dict[str, Any]:
        return {"kind": "Deployment", "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                                                   "resourceVersion": version, "labels": owned,
                                                   "ownerReferences": owner}}

    cache = WatchCache()
    cache.bind({"owned_deployments": {("ns", "m"): [indexed("a", "3"), indexed("b", "4")]},
                "owned_configmaps": {}, "owned_services": {}, "owned_pdbs": {}, "runtime_pods": {}})
    assert not cache.may_lag
    cache.bury({("Deployment", "uid-b", "4")})
    assert list(cache.children("ns", "m")) == [("Deployment", "a")]
    assert len(cache.indexed("ns", "m", "m")) == 2  # kopf still holds it
    cache.paused()
    assert cache.may_lag
