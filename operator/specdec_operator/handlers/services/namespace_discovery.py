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

A deleted namespace is also watched until it is empty. Kubernetes marks it for deletion, deletes its content, and
drops its own `kubernetes` finalizer (spec.finalizers) last. kopf (1.45) stops watching a marked namespace as soon as
its status has conditions none of which is True; the namespace controller writes exactly such a status when it
starts deleting, seconds before it reports the content that remains. With the watch gone, the deletion of a
SpeculativeModel in it never reaches kopf, kopf's finalizer on the model (it stops the model's daemon) is never
removed, and the namespace stays Terminating for good. The e2e lanes, whose operators watch `e2e-gwN-*`, waited
out a 180 s timeout on every such namespace. So while the namespace still lists its own finalizer, kopf is shown
it without the deletion mark: it is watched, and its models are finalized, until Kubernetes has emptied it.
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
    """kopf's namespace event processor, with the watch's initial listing applied instead of dropped and a
    namespace being emptied still watched."""
    raw_event = _until_emptied(raw_event)
    if raw_event["type"] is None:
        async with insights.revised:
            observation.revise_namespaces(raw_events=[raw_event], insights=insights, namespaces=namespaces)
            insights.revised.notify_all()
        return
    await _KOPF_PROCESSOR(raw_event=raw_event, namespaces=namespaces, insights=insights, **kwargs)


def _until_emptied(raw_event: bodies.RawEvent) -> bodies.RawEvent:
    """The event as kopf should read it: a namespace marked for deletion that still lists its own finalizer
    (Kubernetes is deleting its content) without the mark; any other event as it is."""
    body = raw_event["object"]
    metadata = body.get("metadata", {})
    emptying = metadata.get("deletionTimestamp") and body.get("spec", {}).get("finalizers")
    if raw_event["type"] == "DELETED" or not emptying:
        return raw_event
    unmarked = {key: value for key, value in metadata.items() if key != "deletionTimestamp"}
    return bodies.RawEvent(type=raw_event["type"], object={**body, "metadata": unmarked})  # type: ignore[typeddict-item]


def notice_namespaces_listed_at_watch_start() -> None:
    """Install the processor; kopf's namespace observer looks it up when it starts its watch."""
    observation.process_discovered_namespace_event = process_namespace_event
