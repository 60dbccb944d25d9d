"""A namespace created between kopf's namespace LIST and the start of its namespace watch is still watched.

Found in the e2e lanes: a model created in a new namespace moments after its operator started went unhandled
until a label on the namespace woke kopf up (handlers/services/namespace_discovery.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from kopf._cogs.structs import bodies, references
from kopf._core.reactor import observation

from specdec_operator.handlers.services import namespace_discovery
from specdec_operator.handlers.services.namespace_discovery import process_namespace_event

PATTERNS: list[references.NamespacePattern] = ["team-*"]


def listed(name: str, **meta: Any) -> bodies.RawEvent:
    """A namespace as the watch stream's own initial LIST yields it (kopf: an event of type None)."""
    return bodies.RawEvent(type=None, object={"metadata": {"name": name, **meta}})  # type: ignore[typeddict-item]


async def test_kopf_alone_drops_what_its_watch_lists_at_start() -> None:
    """The behaviour the processor corrects: if kopf fixes it, this fails and the module can go."""
    insights = references.Insights()
    await namespace_discovery._KOPF_PROCESSOR(raw_event=listed("team-new"), namespaces=PATTERNS, insights=insights)
    assert "team-new" not in insights.namespaces


async def test_a_namespace_first_seen_in_the_watchs_listing_is_watched() -> None:
    insights = references.Insights()
    await process_namespace_event(raw_event=listed("team-new"), namespaces=PATTERNS, insights=insights)
    await process_namespace_event(raw_event=listed("other"), namespaces=PATTERNS, insights=insights)
    assert insights.namespaces == {"team-new"}


async def test_watch_events_still_go_through_kopf() -> None:
    insights = references.Insights()
    added = bodies.RawEvent(type="ADDED", object={"metadata": {"name": "team-b"}})
    await process_namespace_event(raw_event=added, namespaces=PATTERNS, insights=insights)
    assert insights.namespaces == {"team-b"}


def test_installed_where_kopfs_namespace_observer_looks_it_up(monkeypatch: pytest.MonkeyPatch) -> None:
    kopfs = observation.process_discovered_namespace_event
    monkeypatch.setattr(observation, "process_discovered_namespace_event", kopfs)  # undone after the test
    namespace_discovery.notice_namespaces_listed_at_watch_start()
    assert observation.process_discovered_namespace_event is process_namespace_event
    # The observer reads the module global when it starts its watch (not a reference bound at import).
    assert "process_discovered_namespace_event" in observation.namespace_observer.__code__.co_names


# The namespace controller's first status after a deletion: conditions, none True, while it deletes the content.
DELETING = [{"type": "NamespaceDeletionDiscoveryFailure", "status": "False", "reason": "ResourcesDiscovered"},
            {"type": "NamespaceDeletionContentFailure", "status": "False", "reason": "ContentDeleted"}]
REMAINING = [*DELETING, {"type": "NamespaceFinalizersRemaining", "status": "True", "reason": "SomeFinalizersRemain",
                         "message": "specdec.io/reconcile-loop in 1 resource instances"}]


def deleting(name: str, event: str | None = "MODIFIED", *, finalizers: tuple[str, ...] = ("kubernetes",),
             conditions: list[dict[str, str]] = DELETING) -> bodies.RawEvent:
    """A namespace marked for deletion; Kubernetes drops its own finalizer once the content is gone."""
    body = {"metadata": {"name": name, "deletionTimestamp": "2026-12-07T06:30:08Z"},
            "spec": {"finalizers": list(finalizers)}, "status": {"phase": "Terminating", "conditions": conditions}}
    return bodies.RawEvent(type=event, object=body)  # type: ignore[typeddict-item]


async def watched(processor: Any, *events: bodies.RawEvent) -> set[str]:
    insights = references.Insights()
    added = bodies.RawEvent(type="ADDED", object={"metadata": {"name": "team-a"}})
    for event in (added, *events):
        await processor(raw_event=event, namespaces=PATTERNS, insights=insights)
    return set(insights.namespaces)


async def test_kopf_alone_stops_watching_a_namespace_whose_deletion_just_began() -> None:
    """The behaviour the processor corrects: the models in it are never finalized. If kopf fixes it, this fails."""
    assert await watched(namespace_discovery._KOPF_PROCESSOR, deleting("team-a")) == set()


async def test_a_namespace_being_emptied_stays_watched_until_kubernetes_drops_its_finalizer() -> None:
    assert await watched(process_namespace_event, deleting("team-a"), deleting("team-a", conditions=REMAINING)) \
        == {"team-a"}
    emptied = deleting("team-a", finalizers=())
    assert await watched(process_namespace_event, deleting("team-a"), emptied) == set()
    assert await watched(process_namespace_event, deleting("team-a"), deleting("team-a", "DELETED")) == set()


async def test_a_namespace_listed_while_being_emptied_is_watched() -> None:
    """An operator that starts while a namespace is deleted still finalizes the models in it."""
    insights = references.Insights()
    listing = deleting("team-late", None, conditions=REMAINING)
    await process_namespace_event(raw_event=listing, namespaces=PATTERNS, insights=insights)
    assert insights.namespaces == {"team-late"}
