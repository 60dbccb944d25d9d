"""`specdec_active` follows kopf's own peering verdict: kopf's real peering code runs against the tracker."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.structs import references
from kopf._core.engines import peering

from specdec_operator.handlers.services.cache import WatchCache
from specdec_operator.handlers.services.leadership import KOPF_PEERING_LOGGER, LeadershipTracker, track_leadership
from specdec_operator.metrics import ACTIVE, EFFECTIVE_K, REGISTRY

PEERING = "specdec-operator"
ME = peering.Identity("operator-a")
MY_PRIORITY = 500
PEERING_RESOURCE = references.Resource("kopf.dev", "v1", "clusterkopfpeerings", namespaced=False)


def _active() -> float | None:
    return REGISTRY.get_sample_value("specdec_active")


def _peer(priority: int, seconds_ago: float = 0.0) -> dict[str, Any]:
    seen = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": 60, "lastseen": seen.isoformat()}


def _event(peers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    status = {ME: _peer(MY_PRIORITY), **peers}
    return {"type": "MODIFIED", "object": {"metadata": {"name": PEERING}, "status": status}}


class KopfPeering:
    """One peering object as kopf's observer processes it: kopf's toggle, kopf's function, real events."""

    def __init__(self) -> None:
        self.settings = kopf.OperatorSettings()
        self.settings.peering.name = PEERING
        self.settings.peering.priority = MY_PRIORITY
        self.paused = aiotoggles.ToggleSet(any)
        self.toggles: list[aiotoggles.Toggle] = []

    async def add_peering_object(self) -> aiotoggles.Toggle:
        # Peering is mandatory when kopf.run gets a peering name, so kopf starts each toggle on (paused).
        toggle = await self.paused.make_toggle(True, name=PEERING)
        self.toggles.append(toggle)
        return toggle

    async def observe(self, toggle: aiotoggles.Toggle, peers: dict[str, dict[str, Any]]) -> None:
        woken = asyncio.Event()
        woken.set()  # kopf would sleep until a blocking peer expires; the test moves on at once
        await peering.process_peering_event(
            raw_event=_event(peers), namespace=None, resource=PEERING_RESOURCE, identity=ME,
            settings=self.settings, autoclean=False, stream_pressure=woken, conflicts_found=toggle,
        )

    @property
    def kopf_says_active(self) -> bool:
        return self.paused.is_off()


@pytest.fixture
def tracker() -> Iterator[LeadershipTracker]:
    yield track_leadership(1, standalone=False)
    logger = logging.getLogger(KOPF_PEERING_LOGGER)
    for handler in [h for h in logger.handlers if isinstance(h, LeadershipTracker)]:
        logger.removeHandler(handler)


async def test_active_follows_kopf_through_pause_and_takeover(tracker: LeadershipTracker) -> None:
    kopf_peering = KopfPeering()
    toggle = await kopf_peering.add_peering_object()
    assert _active() == 0 and not kopf_peering.kopf_says_active  # a peered replica starts as a standby

    await kopf_peering.observe(toggle, {"operator-b": _peer(MY_PRIORITY + 1)})  # a higher peer is alive
    assert (_active(), kopf_peering.kopf_says_active) == (0, False)

    await kopf_peering.observe(toggle, {"operator-b": _peer(MY_PRIORITY + 1, seconds_ago=120)})  # it died
    assert (_active(), kopf_peering.kopf_says_active) == (1, True)

    await kopf_peering.observe(toggle, {"operator-b": _peer(MY_PRIORITY - 1)})  # a lower peer: we keep acting
    assert (_active(), kopf_peering.kopf_says_active) == (1, True)

    await kopf_peering.observe(toggle, {"operator-c": _peer(MY_PRIORITY + 7)})  # a higher one joins: pause
    assert (_active(), kopf_peering.kopf_says_active) == (0, False)


async def test_equal_priorities_pause_everyone_and_export_standby() -> None:
    track_leadership(1, standalone=False)
    kopf_peering = KopfPeering()
    toggle = await kopf_peering.add_peering_object()
    await kopf_peering.observe(toggle, {})
    assert _active() == 1
    await kopf_peering.observe(toggle, {"operator-twin": _peer(MY_PRIORITY)})
    assert (_active(), kopf_peering.kopf_says_active) == (0, False)


async def test_one_paused_namespace_makes_the_replica_a_standby() -> None:
    track_leadership(2, standalone=False)
    kopf_peering = KopfPeering()
    team_a, team_b = await kopf_peering.add_peering_object(), await kopf_peering.add_peering_object()
    await kopf_peering.observe(team_a, {})
    assert (_active(), kopf_peering.kopf_says_active) == (0, False)  # team-b's peering is still paused
    await kopf_peering.observe(team_b, {})
    assert (_active(), kopf_peering.kopf_says_active) == (1, True)
    await kopf_peering.observe(team_b, {"operator-b": _peer(MY_PRIORITY + 1)})
    assert (_active(), kopf_peering.kopf_says_active) == (0, False)


def test_a_standalone_replica_acts_from_the_start() -> None:
    assert track_leadership(1, standalone=True).active
    assert _active() == 1


def test_pausing_drops_every_model_series() -> None:
    tracker = track_leadership(1, standalone=True)
    EFFECTIVE_K.labels("team-a", "llama", "gfx942").set(4)
    tracker.emit(logging.makeLogRecord({"msg": "Pausing operations in favour of [<Peer b>]."}))
    assert _active() == 0
    assert REGISTRY.get_sample_value("specdec_effective_k", {"namespace": "team-a", "model": "llama",
                                                             "pool": "gfx942"}) is None
    assert ACTIVE is not None


async def test_a_pause_after_acting_marks_the_watch_cache_as_lagging() -> None:
    # Kopf fills its indices once; a replica that acted, paused for a peer and resumes reads them while
    # kopf lists every kind again (handlers/resync.py). A standby that never acted gets kopf's first fill.
    cache = WatchCache()
    track_leadership(1, standalone=False, on_pause=cache.paused)
    kopf_peering = KopfPeering()
    toggle = await kopf_peering.add_peering_object()
    await kopf_peering.observe(toggle, {"operator-b": _peer(MY_PRIORITY + 1)})  # a standby from the start
    assert not cache.may_lag
    await kopf_peering.observe(toggle, {"operator-b": _peer(MY_PRIORITY + 1, seconds_ago=120)})  # it died
    assert kopf_peering.kopf_says_active and not cache.may_lag
    await kopf_peering.observe(toggle, {"operator-c": _peer(MY_PRIORITY + 7)})  # a higher one joins: pause
    assert not kopf_peering.kopf_says_active and cache.may_lag
