"""resourceVersions are opaque strings (issue 34): which body is newer is known from what we wrote over, never
from comparing them as numbers."""

from __future__ import annotations

from typing import Any

import aiohttp

from specdec_operator.handlers.writes import newest_body, remember_written
from tests.unit.handlers.fakeapi import FakeKubeApi
from tests.unit.handlers.test_reconciler import context

KEY = ("ns", "m")


def body(version: str, marker: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "m", "resourceVersion": version}, "status": {"marker": marker}}


async def test_our_write_stays_the_baseline_until_the_watch_moves_past_what_it_wrote_over(
    http: aiohttp.ClientSession,
) -> None:
    ctx = context(FakeKubeApi(), http)
    watched = body("zz-older", "kopf")  # sorts after the write's version, and is no integer
    remember_written(ctx, KEY, body("aa-newer", "ours"), over=watched)
    assert newest_body(ctx, KEY, watched)["status"]["marker"] == "ours"
    # A second write over the first: the watch, still at the first body, is two writes behind.
    remember_written(ctx, KEY, body("mm-newest", "ours-again"), over=body("aa-newer", "ours"))
    assert newest_body(ctx, KEY, watched)["status"]["marker"] == "ours-again"
    # The watch delivers anything else (our write's echo, or someone's later write): it is the baseline now.
    assert newest_body(ctx, KEY, body("0", "echo"))["status"]["marker"] == "echo"
    assert newest_body(ctx, KEY, watched)["status"]["marker"] == "kopf"  # the written body was dropped


async def test_numeric_versions_are_not_ordered_as_integers(http: aiohttp.ClientSession) -> None:
    ctx = context(FakeKubeApi(), http)
    # An etcd restored from a backup, or another storage, may hand out a smaller number for a later write.
    remember_written(ctx, KEY, body("7", "ours"), over=body("12", "kopf"))
    assert newest_body(ctx, KEY, body("12", "kopf"))["status"]["marker"] == "ours"
