"""The fleet's limit on rollouts in flight at once (settings.max_concurrent_rollouts; pure).

Every change of a pool's pod template restarts its pods, and an operator upgrade that changes the template of every
pool would restart the whole fleet at once. With a limit, a model starts a rollout (a pod template change, or a
canary) only while fewer than `limit` other models of this install have one in flight; otherwise it waits as a
change freeze holds (reconcile/freeze.py: its pod templates stay as they run, no canary starts, the tuner records
no K change) with Progressing=False, reason RolloutQueued, naming the models in flight. A rollout in flight is
never stopped by the limit, and scaling, new pools and status are not held.

Which models have a rollout in flight is gathered by the handlers (handlers/services/rollout_slots.py): each pass
says whether its model rolls out (`rolls_out`) before its first write, so two passes cannot both take the last
slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specdec_operator.api.status import CanaryStatus
from specdec_operator.canary.plan import IN_FLIGHT_PHASES
from specdec_operator.render.pool import deployment_revision
from specdec_runtime import contract

# How status names the limit: the setting and the chart value that set it.
LIMIT_SOURCE = "the fleet's rollout limit SPECDEC_MAX_CONCURRENT_ROLLOUTS (chart value maxConcurrentRollouts)"
# Models named in the condition before "and N more" (the message stays short in a large fleet).
NAMED_MODELS = 5


@dataclass(frozen=True)
class RolloutsInFlight:
    """Gathered for one pass: the other models of this install with a rollout in flight, and the limit."""

    limit: int
    others: tuple[str, ...]  # "namespace/name", sorted
    holds_slot: bool  # this model's own rollout is in flight (it keeps its slot until the rollout ends)

    @property
    def full(self) -> bool:
        return self.limit > 0 and not self.holds_slot and len(self.others) >= self.limit


def queue_source(in_flight: RolloutsInFlight | None) -> str | None:
    """What keeps the model's next rollout waiting (the limit, with the models in flight); None when it may start."""
    if in_flight is None or not in_flight.full:
        return None
    named = ", ".join(in_flight.others[:NAMED_MODELS])
    more = len(in_flight.others) - NAMED_MODELS
    if more > 0:
        named += f" and {more} more"
    return f"{LIMIT_SOURCE}: {len(in_flight.others)} of {in_flight.limit} in flight ({named})"


def rolls_out(
    live: Mapping[str, Mapping[str, Any]],
    applied: Iterable[Mapping[str, Any]] = (),
    canary: CanaryStatus | None = None,
) -> bool:
    """Whether the model has a rollout in flight once this pass's Deployments are applied: a canary in flight or
    a canary Deployment still there, a stable Deployment whose pod template this pass changes, or one whose pods
    are not all of its current template yet. A pool created from nothing is not a rollout (nothing restarts)."""
    if canary is not None and canary.phase in IN_FLIGHT_PHASES:
        return True
    for body in applied:
        name = str(body["metadata"]["name"])
        if _track(body) == "canary":
            return True
        running = live.get(name)
        if running is not None and deployment_revision(running) != deployment_revision(body):
            return True
    return any(_track(body) == "canary" or _mid_rollout(body) for body in live.values())


def _track(deployment: Mapping[str, Any]) -> str:
    return str(deployment.get("metadata", {}).get("labels", {}).get(contract.LABEL_TRACK, "stable"))


def _mid_rollout(deployment: Mapping[str, Any]) -> bool:
    """Pods of an older template may still run: the controller has not seen the template yet, not every replica
    is of it, or old pods are still there. Readiness is left out: a pod that crashes is not a rollout."""
    meta, spec, status = deployment.get("metadata", {}), deployment.get("spec", {}), deployment.get("status", {})
    replicas = int(spec.get("replicas", 1) or 0)
    return (
        int(status.get("observedGeneration", 0) or 0) < int(meta.get("generation", 0) or 0)
        or int(status.get("updatedReplicas", 0) or 0) < replicas
        or int(status.get("replicas", 0) or 0) > replicas
    )
