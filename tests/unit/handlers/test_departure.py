"""A model the watch says left (relabelled out of the model selector: DELETED without a deletionTimestamp) ends
its loop. kopf stops a daemon only for a deletion, so without this the old shard's loop ran on, and a pass of it
could write its shard's name over the new owner's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import aiohttp
from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter
from kopf._core.intents.stoppers import DaemonStoppingReason

from specdec_operator.handlers.register import model_changed, reconcile_loop
from tests.unit.handlers.fakeapi import FakeKubeApi, PostedEvents, live_indices
from tests.unit.handlers.test_reconciler import LOG, NAME, NAMESPACE, context, model_body


def status_written(api: FakeKubeApi) -> asyncio.Event:
    """Set when the fake API server takes a status write."""
    written = asyncio.Event()
    take = api.patch_status

    async def patch_status(*args: Any, **kwargs: Any) -> Any:
        result = await take(*args, **kwargs)
        written.set()
        return result

    api.patch_status = patch_status  # type: ignore[method-assign]
    return written


async def test_a_model_that_left_the_watch_ends_its_loop(http: aiohttp.ClientSession, events: PostedEvents) -> None:
    api = FakeKubeApi()
    ctx = context(api, http, reconcile_interval_seconds=3600)
    body = model_body(api)
    first_pass = status_written(api)
    memo = SimpleNamespace(context=ctx)
    setter: FlagSetter[DaemonStoppingReason] = FlagSetter()
    indices = live_indices(api)
    loop = asyncio.create_task(reconcile_loop(
        stopped=AsyncFlagWaiter(setter), body=body, namespace=NAMESPACE, name=NAME, memo=memo, logger=LOG,
        gpu_nodes={}, gpu_pods={}, **indices))
    try:
        await asyncio.wait_for(first_pass.wait(), 10)
        await model_changed(namespace=NAMESPACE, name=NAME, type="MODIFIED", body=body, memo=memo)
        assert not loop.done()  # any other event leaves it running
        await model_changed(namespace=NAMESPACE, name=NAME, type="DELETED", body=body, memo=memo)
        await asyncio.wait_for(loop, 10)
        assert ctx.known(NAMESPACE, NAME) is None  # its memory (and its series) went with it
        assert not setter.is_set()  # kopf never asked it to stop
    finally:
        loop.cancel()
