"""The model's conditions: one policy computes them, one helper keeps lastTransitionTime unless status flips.

`summarize` is the only place Ready, Progressing, Degraded and Reduced are decided. Each reconcile hands it
the facts it gathered (`ConditionFacts`); every fact that speaks to a condition is a candidate, and the
candidate of highest priority (the `*_PRIORITY` tuples below, first wins) names the reason, while the
others ride along in its message ("; also <Reason>: ..."), as cluster-api's summary does. So no writer
overwrites another, and the order is written down rather than being the order of the code.

- Degraded: the model does not serve what it should (bad spec or status, refused writes, a refused
  HTTPRoute, no pool, pods failing, nodes missing, a rolled-back canary, GPUs held by others, pods unschedulable).
- Reduced: it serves, with less than the spec's first choice by design (a drafter fallback, a gfx target
  skipped for want of nodes or memory). Health checks show it as Healthy with the message.
- Ready: every pool's stable Deployment serves its revision on every replica.
- Progressing: a revision or a canary is rolling out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specdec_operator.api.status import Condition, ConditionType

CONDITION_ORDER: tuple[ConditionType, ...] = ("Ready", "Progressing", "Degraded", "Reduced", "WeightsCached")

# Pod failures by the waiting/terminated reason the kubelet reports, most actionable first.
POD_FAILURE_REASONS = (
    "CreateContainerConfigError", "CreateContainerError", "InvalidImageName", "ErrImagePull", "ImagePullBackOff",
    "OOMKilled", "CrashLoopBackOff", "StartupProbeFailed", "Unschedulable",
)
# A Gateway that refuses the model's HTTPRoute (reconcile/route_status.py): no request reaches the model through it.
ROUTE_REASONS = ("HTTPRouteNotPermitted", "HTTPRouteUnreadable", "HTTPRouteNotAccepted", "HTTPRouteRefsNotResolved",
                 "HTTPRouteNotFound")
# Degraded reasons, first wins. A broken spec or status hides everything else; a failing pod outranks the
# nodes it waits for; capacity taken by other workloads comes last, as it heals without us.
DEGRADED_PRIORITY = (
    "StatusUnreadable", "InvalidSpec", "ObjectNotOwned", "WriteRefused", *ROUTE_REASONS, "UnknownModelSize",
    "NoCompatibleNodes", "InsufficientMemory", "NoReplicas", *POD_FAILURE_REASONS, "NodesMissing", "CanaryRolledBack",
    "CanaryAborted", "InsufficientGpus", "PodsUnschedulable", "PodMetricsExcluded",
)
REDUCED_PRIORITY = ("DrafterFallback", "NoCompatibleNodes", "InsufficientMemory", "InsufficientGpus", "NoReplicas")


@dataclass(frozen=True)
class ConditionUpdate:
    type: ConditionType
    status: bool | None  # None = Unknown
    reason: str
    message: str


def _status_text(status: bool | None) -> Literal["True", "False", "Unknown"]:
    return "Unknown" if status is None else ("True" if status else "False")


def set_condition(
    existing: Sequence[Condition], update: ConditionUpdate, generation: int, now: str
) -> list[Condition]:
    """Return the conditions with `update` applied; the transition time moves only when status flips."""
    status = _status_text(update.status)
    previous = next((c for c in existing if c.type == update.type), None)
    transition = previous.last_transition_time if previous and previous.status == status else now
    fresh = Condition(
        type=update.type,
        status=status,
        reason=update.reason,
        message=update.message,
        last_transition_time=transition,
        observed_generation=generation,
    )
    merged = [c for c in existing if c.type != update.type] + [fresh]
    return sorted(merged, key=lambda c: CONDITION_ORDER.index(c.type))


def apply_updates(
    existing: Sequence[Condition], updates: Sequence[ConditionUpdate], generation: int, now: str
) -> list[Condition]:
    """Apply updates in order; a later update of a type replaces an earlier one before anything is compared,
    so an intermediate value never resets a condition's lastTransitionTime."""
    last = {update.type: update for update in updates}
    conditions = list(existing)
    for update in last.values():
        conditions = set_condition(conditions, update, generation, now)
    return conditions


@dataclass(frozen=True)
class Finding:
    """One fact that speaks to a condition: its reason and the words, with numbers, that explain it."""

    reason: str
    message: str


@dataclass(frozen=True)
class ConditionFacts:
    """What a reconcile knows that the conditions summarise; every field defaults to "nothing to say"."""

    status_unreadable: str | None = None
    invalid_spec: str | None = None
    inventory_empty: str | None = None  # no node at all: hold, and say so
    no_pools: Finding | None = None  # nothing placed: why
    pending: str | None = None  # pools whose stable Deployment does not serve its revision yet
    held_waiting: str | None = None  # pools held through missing nodes whose replicas are not all ready
    ready: str = ""  # every pool ready: the summary
    pod_failures: tuple[Finding, ...] = ()  # failing runtime pods, per cause (kubelet's reason and message)
    nodes_missing: tuple[str, ...] = ()  # pools held through missing nodes
    canary_progress: Finding | None = None
    canary_failed: Finding | None = None
    capacity: tuple[Finding, ...] = ()  # InsufficientGpus / PodsUnschedulable
    reduced: tuple[Finding, ...] = ()  # DrafterFallback, skipped targets
    refusals: tuple[str, ...] = ()  # the API server's words for owned objects it refused
    # Objects under names we compute that exist without the model's owner reference: left alone (issue 34).
    not_owned: tuple[str, ...] = ()
    route: Finding | None = None  # the Gateway refuses the HTTPRoute we weight, in its words
    pod_metrics_excluded: Finding | None = None  # pods whose /metrics vLLM cannot produce (tuner/window.py)
    frozen: Finding | None = None  # a change freeze holds rollouts and K changes (reconcile/freeze.py)
    # Whether new pods start from weights on a volume, and why (reconcile/weights_cache.py); None: not said.
    weights_cache: tuple[bool, Finding] | None = None


def _ranked(findings: Sequence[Finding], priority: Sequence[str]) -> list[Finding]:
    def rank(finding: Finding) -> int:
        return priority.index(finding.reason) if finding.reason in priority else len(priority)

    return sorted(findings, key=rank)  # stable: equal reasons keep their order


def _merge(findings: Sequence[Finding]) -> tuple[str, str]:
    """The first finding's reason, and every message: same-reason ones joined, others as `also <Reason>`."""
    reason = findings[0].reason
    same = [f.message for f in findings if f.reason == reason]
    others = [f"also {f.reason}: {f.message}" for f in findings if f.reason != reason]
    return reason, "; ".join([*same, *others])


def degraded_findings(facts: ConditionFacts) -> list[Finding]:
    found: list[Finding] = []
    if facts.status_unreadable:
        found.append(Finding("StatusUnreadable", facts.status_unreadable))
    if facts.invalid_spec:
        found.append(Finding("InvalidSpec", facts.invalid_spec))
    if facts.not_owned:
        found.append(Finding("ObjectNotOwned", "; ".join(facts.not_owned)))
    if facts.refusals:
        found.append(Finding("WriteRefused", "; ".join(facts.refusals)))
    if facts.route is not None:
        found.append(facts.route)
    if facts.no_pools is not None:
        found.append(facts.no_pools)
    found += facts.pod_failures
    if facts.nodes_missing:
        found.append(Finding("NodesMissing", "; ".join(facts.nodes_missing)))
    if facts.canary_failed is not None:
        found.append(facts.canary_failed)
    found += facts.capacity
    if facts.pod_metrics_excluded is not None:
        found.append(facts.pod_metrics_excluded)
    return _ranked(found, DEGRADED_PRIORITY)


def pod_metrics_finding(excluded: Sequence[tuple[str, str]], shown: int = 3) -> Finding | None:
    """PodMetricsExcluded naming the pods (the first `shown`, and how many more) and what each broke."""
    if not excluded:
        return None
    named = "; ".join(f"pod {pod}: {reason}" for pod, reason in excluded[:shown])
    more = f"; and {len(excluded) - shown} more" if len(excluded) > shown else ""
    return Finding("PodMetricsExcluded", f"{named}{more}: their /metrics is not what vLLM produces, so their "
                   "counters are left out of K tuning and canary analysis")


def summarize(facts: ConditionFacts) -> list[ConditionUpdate]:
    """Ready, Progressing, Degraded, Reduced and WeightsCached from the facts, by the priorities above.

    With an unreadable status only Degraded is decided (nothing else can be trusted); with no node at all,
    Ready is Unknown and the rest is left as it was.
    """
    degraded = degraded_findings(facts)
    if facts.status_unreadable:
        return [ConditionUpdate("Degraded", True, *_merge(degraded))]
    if facts.inventory_empty:
        return [ConditionUpdate("Ready", None, "NodeInventoryEmpty", facts.inventory_empty)]
    updates: list[ConditionUpdate] = []
    blocking = facts.invalid_spec is not None or facts.no_pools is not None
    if facts.invalid_spec is not None:
        updates.append(ConditionUpdate("Ready", False, "InvalidSpec", facts.invalid_spec))
    elif facts.no_pools is not None:
        updates += [ConditionUpdate("Ready", False, facts.no_pools.reason, facts.no_pools.message),
                    ConditionUpdate("Progressing", False, facts.no_pools.reason, "nothing to roll out")]
    elif facts.pending is not None or facts.held_waiting is not None:
        waiting = ", ".join(w for w in (facts.pending, facts.held_waiting) if w)
        failures = _ranked(facts.pod_failures, DEGRADED_PRIORITY)
        if failures:
            reason, message = _merge(failures)
            updates.append(ConditionUpdate("Ready", False, reason, f"{message}; waiting for {waiting}"))
        elif facts.pending is None:
            updates.append(ConditionUpdate("Ready", False, "NodesMissing", f"waiting for {waiting}"))
        else:
            updates.append(ConditionUpdate("Ready", False, "RolloutInProgress", f"waiting for {waiting}"))
    else:
        updates.append(ConditionUpdate("Ready", True, "PoolsReady", facts.ready))
    if not blocking:
        if facts.frozen is not None:
            # Above a canary's progress: a frozen canary keeps its step, and nothing moves until the freeze ends.
            updates.append(ConditionUpdate("Progressing", False, facts.frozen.reason, facts.frozen.message))
        elif facts.canary_progress is not None:
            updates.append(ConditionUpdate("Progressing", True, facts.canary_progress.reason,
                                           facts.canary_progress.message))
        elif facts.pending is not None:
            updates.append(ConditionUpdate("Progressing", True, "NewRevision", f"rolling out {facts.pending}"))
        else:
            updates.append(ConditionUpdate("Progressing", False, "RolloutComplete",
                                           "every pool runs its desired revision"))
    if degraded:
        updates.append(ConditionUpdate("Degraded", True, *_merge(degraded)))
    else:
        updates.append(ConditionUpdate("Degraded", False, "AsExpected", "every pool serves what the spec asks"))
    if facts.invalid_spec is None:
        reduced = _ranked(facts.reduced, REDUCED_PRIORITY)
        if reduced:
            updates.append(ConditionUpdate("Reduced", True, *_merge(reduced)))
        else:
            updates.append(ConditionUpdate("Reduced", False, "AsExpected",
                                           "every allowed gfx target has a pool with its preferred drafter"))
        if facts.weights_cache is not None:
            cached, finding = facts.weights_cache
            updates.append(ConditionUpdate("WeightsCached", cached, finding.reason, finding.message))
    return updates
