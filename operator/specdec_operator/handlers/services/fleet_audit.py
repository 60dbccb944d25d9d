"""Ghost capacity: nodes and GPU pods deleted during a watch gap, found by a LIST and left out of the fleet.

Kopf fills the node and pod indices from watch events. When a watch breaks (410 Gone after a long gap, or a
replica that resumes after a pause for a peer) kopf lists the kind again and indexes what the list returns,
but never drops an object the new list lacks: its DELETED event fell in the gap. For nodes and GPU pods that
is capacity that does not exist (issue 34, item 11): placement would count a deleted node's GPUs as free, or a
deleted pod's GPUs as taken, for as long as the process lives.

Kopf does not say when it re-lists, so the audit runs after every pause and at a slow period
(`fleet_audit_interval_seconds`, 10 minutes by default): it notes the uids the indices hold, then LISTs the
nodes and the pods of every namespace those pods are in, and buries the noted uids the LISTs lack. A LIST
without a resourceVersion is a consistent read, so an object indexed before it and absent from it was deleted;
a uid is never reused, so a burial never hides an object created later under the same name. Each audit
replaces the burials, so they shrink with the ghosts. Two LISTs plus one per namespace every 10 minutes is the
whole cost in steady state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from specdec_operator.gpu.inventory import NodeGpus, PodGpus
from specdec_operator.handlers.services.cache import FleetSnapshot
from specdec_operator.kube.api import KubeApi, KubeApiError

LOG = logging.getLogger(__name__)


class FleetAudit:
    """When the fleet indices are next checked against a LIST, and the check itself (one at a time)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next_at: float | None = None  # monotonic; None until the first model pass starts the period
        self._after_pause = False
        self._running = asyncio.Lock()

    def paused(self) -> None:
        """Kopf closed the watches for a peer: check the indices on the first pass after it resumes."""
        self._after_pause = True

    def due(self, now: float) -> bool:
        if self._next_at is None:
            # Kopf filled every index with a fresh LIST before the first loop started: nothing to check yet.
            self._next_at = now + self.interval_s
        return not self._running.locked() and (self._after_pause or now >= self._next_at)

    async def run_if_due(
        self, api: KubeApi, node_index: Mapping[Any, Iterable[NodeGpus]], pod_index: Mapping[Any, Iterable[PodGpus]],
        fleet: FleetSnapshot, now: float,
    ) -> None:
        """Audit the indices if due (one model's pass does it; the others go on with the snapshot as it is)."""
        if not self.due(now):
            return
        async with self._running:
            self._after_pause, self._next_at = False, now + self.interval_s
            try:
                ghosts = await find_ghosts(api, node_index, pod_index)
            except KubeApiError as error:
                # The indices stay as they are until the next period; placement is no worse than before.
                LOG.warning("fleet audit skipped, the API server refused a LIST: %s", error)
                return
            if ghosts:
                LOG.warning("watch caches hold %d node(s)/GPU pod(s) deleted during a watch gap, left out of "
                            "placement: %s", len(ghosts), ", ".join(sorted(ghosts.values())[:10]))
            fleet.bury(ghosts)


async def find_ghosts(
    api: KubeApi, node_index: Mapping[Any, Iterable[NodeGpus]], pod_index: Mapping[Any, Iterable[PodGpus]],
) -> dict[str, str]:
    """uid -> `Node/<name>` or `Pod/<namespace>/<name>` of what the indices hold and the API server does not."""
    # Noted before any LIST: only what was indexed before a LIST can be proved gone by it.
    nodes = {facts.uid: f"Node/{facts.name}" for store in node_index.values() for facts in store if facts.uid}
    pods: dict[str, dict[str, str]] = {}
    for store in pod_index.values():
        for claim in store:
            if claim.uid:
                pods.setdefault(claim.namespace, {})[claim.uid] = f"Pod/{claim.namespace}/{claim.name}"
    ghosts: dict[str, str] = {}
    if nodes:
        listed = _uids((await api.list_versioned("Node", "", ""))[0])
        ghosts.update({uid: what for uid, what in nodes.items() if uid not in listed})
    for namespace, held in sorted(pods.items()):
        listed = _uids((await api.list_versioned("Pod", namespace, ""))[0])
        ghosts.update({uid: what for uid, what in held.items() if uid not in listed})
    return ghosts


def _uids(items: Iterable[Mapping[str, Any]]) -> set[str]:
    return {str((item.get("metadata") or {}).get("uid", "")) for item in items}
