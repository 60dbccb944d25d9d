"""A namespace created while kopf starts is watched like any other.

With namespace patterns (`SPECDEC_NAMESPACES=["team-*"]`) kopf finds the namespaces to watch in two steps: one
LIST of namespaces, then a watch stream of its own, which starts with a LIST again. kopf (1.45) ignores the
objects of that second listing ("already noticed by the first"), so a namespace created between the two LISTs
is in neither's news: nothing in it is watched until the namespace itself changes. An e2e lane hit it every
few runs: a model created in a new namespace moments after its operator started went unhandled for minutes,
until a label on the namespace woke it up; a platform team creating a namespace during an operator restart
would meet the same.

The fix applies the watch's listing too, through kopf's own revise_namespaces: adding a namespace kopf
already knows changes nothing (a set), so only the missed ones are new.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kopf._cogs.structs import bodies, references
from kopf._core.reactor import observation

_KOPF_PROCESSOR = observation.process_discovered_namespace_event


async def process_namespace_event(
    *,
    raw_event: bodies.RawEvent,
    namespaces: Collection[references.NamespacePattern],
    insights: references.Insights,
    **kwargs: Any,
) -> None:
    """kopf's namespace event processor, with the watch's initial listing applied instead of dropped."""
    if raw_event["type"] is None:
        async with insights.revised:
            observation.revise_namespaces(raw_events=[raw_event], insights=insights, namespaces=namespaces)
            insights.revised.notify_all()
        return
    await _KOPF_PROCESSOR(raw_event=raw_event, namespaces=namespaces, insights=insights, **kwargs)


def notice_namespaces_listed_at_watch_start() -> None:
    """Install the processor; kopf's namespace observer looks it up when it starts its watch."""
    observation.process_discovered_namespace_event = process_namespace_event
