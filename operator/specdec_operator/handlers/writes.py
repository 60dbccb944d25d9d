"""The writes of a reconcile, in the order that keeps status the one source of truth.

Status first, with a resourceVersion precondition (a 409 means someone wrote in between: re-read,
re-evaluate, never overwrite); the server's answer becomes the next pass's baseline, because kopf's
`body` only moves with watch events and can be older than our own last write. Owned objects follow,
rendered from that status. An owned object the API server refuses is reported (Degraded condition and
a Warning event with the server's message) and retried with exponential backoff.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any

import kopf

from specdec_operator import KIND
from specdec_operator.handlers.context import Logger, OperatorContext
from specdec_operator.handlers.model_memory import ModelKey, Refusals
from specdec_operator.kube.api import KubeApiError, NotOwnedError
from specdec_operator.kube.retry import DownstreamBackoff
from specdec_operator.metrics import STATUS_WRITES
from specdec_operator.reconcile.status_write import merge_patch, status_to_write, write_cause

# The API server's words for a namespace being deleted: every write is refused, the model goes with it.
TERMINATING = "because it is being terminated"


def _resource_version(body: Mapping[str, Any] | None) -> str:
    """An opaque string: compared for equality only, never ordered (the API server promises no order)."""
    return str((body or {}).get("metadata", {}).get("resourceVersion", ""))


# How many superseded resourceVersions a model remembers: a watch lags by a few of our writes, not more.
SUPERSEDED_KEPT = 16


def remember_written(
    ctx: OperatorContext, key: ModelKey, written: dict[str, Any], over: Mapping[str, Any] | None
) -> None:
    """Keep the object a write returned, and the versions it is known to be newer than: the one it was written
    over and the earlier written ones. Status writes are conditional on `over`'s resourceVersion, so nothing
    came between them."""
    memory = ctx.model(*key)
    for older in (memory.written, over):
        if older is not None:
            memory.superseded[_resource_version(older)] = None
    memory.superseded.pop(_resource_version(written), None)
    for version in list(memory.superseded)[:-SUPERSEDED_KEPT]:
        del memory.superseded[version]
    memory.written = written


def newest_body(ctx: OperatorContext, key: ModelKey, body: Mapping[str, Any]) -> dict[str, Any]:
    """Whichever is newer: kopf's view of the object, or the object our own last write returned.

    Ours, while kopf's body is one our writes superseded; once the watch shows any other version (the echo of
    our write, or someone's later one: watch events come in order) kopf's body is the baseline again.
    """
    known = ctx.known(*key)
    written = known.written if known is not None else None
    if written is not None and known is not None and _resource_version(body) in known.superseded:
        return written
    if known is not None:
        known.written = None  # the watch caught up (or someone else wrote): kopf's body is the baseline
    return {k: v for k, v in dict(body).items()}


# A model's first statistics come from its first tuner window, which began before traffic reached every pod,
# so they are provisional: one refresh may follow this soon (two default tuner evaluations), and from then on
# at most one per statusStatsPeriodSeconds. A fleet's one-off convergence is over minutes after it is Ready.
FIRST_REFRESH_S = 120.0


def stats_due(ctx: OperatorContext, key: ModelKey, now: float) -> bool:
    """Whether a statistics refresh may go out now. The first period starts when we first see a model, so a
    restarted operator does not rewrite them either."""
    memory = ctx.model(*key)
    if memory.stats_due_at is None:
        memory.stats_due_at = now + ctx.settings.status_stats_period_seconds
    return now >= memory.stats_due_at


async def write_status(
    ctx: OperatorContext,
    baseline: Mapping[str, Any],
    computed: Mapping[str, Any],
    logger: Logger,
    *,
    force_stats: bool = False,
) -> dict[str, Any] | None:
    """Write `computed` over the stored status; returns the stored object, or None when nothing changed."""
    meta = baseline["metadata"]
    key = (meta["namespace"], meta["name"])
    stored = dict(baseline.get("status") or {})
    now = ctx.clock()
    due = force_stats or stats_due(ctx, key, now)
    wanted, fresh_stats = status_to_write(stored, computed, due)
    patch = merge_patch(stored, wanted)
    if not patch:
        return None
    logger.info("status changed: %s", sorted(_leaf_paths(patch, "status")))
    conflict: KubeApiError | None = None
    result: dict[str, Any] | None
    try:
        result = await ctx.api.patch_status(KIND, key[0], key[1], patch, str(meta.get("resourceVersion") or ""))
    except KubeApiError as error:
        if error.status != 409:
            raise
        # Someone wrote in between. Re-read now; the next pass re-evaluates from what is really stored.
        conflict, result = error, await ctx.api.get(KIND, key[0], key[1])
        if result is not None and not merge_patch(dict(result.get("status") or {}), wanted):
            # The "someone" was this write: stored, its answer lost, and the client's retry met it (a 409). It
            # counts as written, so the events that announce it are posted (the next pass starts from it).
            logger.info("status write stored although its answer was lost: %s", error)
            conflict = None
    if result is not None:
        remember_written(ctx, key, result, baseline)
    if conflict is not None:
        ctx.nudge(*key)
        raise conflict
    cause = write_cause(stored, wanted)
    STATUS_WRITES.labels(cause=cause).inc()
    if fresh_stats:
        period = ctx.settings.status_stats_period_seconds
        ctx.model(*key).stats_due_at = now + (min(FIRST_REFRESH_S, period) if cause == "first_statistics" else period)
    return result


def _leaf_paths(patch: Mapping[str, Any], prefix: str) -> list[str]:
    paths: list[str] = []
    for key, value in patch.items():
        if isinstance(value, Mapping) and value:
            paths += _leaf_paths(value, f"{prefix}.{key}")
        else:
            paths.append(f"{prefix}.{key}")
    return paths


def refusals_of(ctx: OperatorContext, key: ModelKey) -> Refusals:
    memory = ctx.model(*key)
    if memory.refusals is None:
        memory.refusals = Refusals(DownstreamBackoff(
            ctx.settings.refused_write_backoff_seconds, ctx.settings.refused_write_backoff_max_seconds))
    return memory.refusals


def _attempt_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """("Kind/name", the same plus a digest of the body): a changed body is a new attempt, tried at once."""
    name = f"{obj['kind']}/{obj['metadata']['name']}"
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return name, f"{name}@{digest}"


async def apply_owned(
    ctx: OperatorContext, body: kopf.Body, key: ModelKey, objects: list[dict[str, Any]], logger: Logger,
    owned: Collection[tuple[str, str]] = (),
) -> bool:
    """Apply each object; returns whether the set of refusals changed (then the condition must follow).

    `owned`: (kind, name) of the objects the watch cache holds with the model's owner reference; any other is
    read before it is applied, and left alone if it exists without that reference (kube/api.py apply_owned).
    """
    refusals = refusals_of(ctx, key)
    before = (dict(refusals.messages), dict(refusals.not_owned))
    uid = str(body["metadata"].get("uid", ""))
    attempts = [_attempt_key(obj) for obj in objects]
    refusals.backoff.forget_except({attempt for _, attempt in attempts})
    now = ctx.clock()
    for obj, (name, attempt) in zip(objects, attempts, strict=True):
        if not refusals.backoff.ready(attempt, now):
            continue
        try:
            await ctx.api.apply_owned(obj, uid, (obj["kind"], obj["metadata"]["name"]) in owned)
        except NotOwnedError as error:
            wait = refusals.backoff.refused(attempt, ctx.clock())
            refusals.messages.pop(name, None)
            if refusals.not_owned.get(name) != str(error):
                logger.warning("%s", error)
                kopf.warn(body, reason="ObjectNotOwned", message=str(error)[:1000])
            refusals.not_owned[name] = str(error)
            continue
        except KubeApiError as error:
            if not error.refused or error.status == 409 or TERMINATING in error.message:
                raise  # not about this object: a conflict, or its namespace is going away with the model
            # The wait counts from the refusal, not from the pass's start: a slow answer must not shorten it.
            wait = refusals.backoff.refused(attempt, ctx.clock())
            refusals.messages[name] = error.message
            failures = refusals.backoff.failures(attempt)
            logger.warning("%s refused by the API server (%d in a row, next try in %.1fs): %s",
                           name, failures, wait, error.message)
            kopf.warn(body, reason="WriteRefused",
                      message=f"{name} refused ({failures} in a row, next try in {wait:.1f}s): {error.message}"[:1000])
            continue
        refusals.backoff.succeeded(attempt)
        refusals.messages.pop(name, None)
        refusals.not_owned.pop(name, None)
    # Objects no longer desired cannot stay refused.
    wanted = {name for name, _ in attempts}
    refusals.messages = {name: message for name, message in refusals.messages.items() if name in wanted}
    refusals.not_owned = {name: message for name, message in refusals.not_owned.items() if name in wanted}
    return (refusals.messages, refusals.not_owned) != before
