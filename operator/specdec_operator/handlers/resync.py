"""Whether a model's loop may read its owned objects and runtime pods from the watch cache yet.

Kopf holds every handler until its indices are filled, but only the first time (handlers/services/cache.py). After a
pause for a peer, a replica that takes over starts its model loops while each kind is still being listed
again: its indices then say "no stable Deployment" of a model whose stable Deployment runs, and a pass that
took that for absence rendered one (at the canary's revision, mid-canary). What has not been listed is
unknown, not absent, so after a pause each model's loop compares the indices with a LIST of the model's
objects, and trusts them only once they hold every listed object at its listed resourceVersion or newer.
Until then its passes hold (reconcile/plan.py) and retry soon, backing off while they stay held
(handlers/schedule.py): after a failover every model is held at once.

The comparison is with the last LIST first: an index that caught up with it is live, even if the objects
changed since (a rolling Deployment changes every few seconds, and a fresh LIST may be a watch event ahead).
Indexed objects that a LIST proves deleted (older than the LIST, and not in it) are left out of every read
of the cache: kopf's re-list never removes them.

One LIST per owned kind per model while the indices lag, none on a replica that never paused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specdec_operator import KIND
from specdec_operator.handlers.context import Logger, OperatorContext
from specdec_operator.handlers.model_memory import Listing
from specdec_operator.handlers.services.cache import CHILD_INDICES
from specdec_operator.render.names import label_value
from specdec_runtime import contract

LISTED_KINDS = (*CHILD_INDICES, "Pod")
Gone = tuple[str, str, str]  # (kind, uid, resourceVersion)


@dataclass(frozen=True)
class CacheCheck:
    behind: tuple[str, ...] = ()  # "Kind/name" listed but not in the index at that resourceVersion or newer
    gone: frozenset[Gone] = frozenset()  # indexed, older than the LIST and not in it: deleted

    @property
    def caught_up(self) -> bool:
        return not self.behind


def _version(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return -1


def _identity(body: Mapping[str, Any]) -> tuple[str, str]:
    return str(body.get("kind", "")), str(body.get("metadata", {}).get("uid", ""))


def compare(indexed: Iterable[Mapping[str, Any]], listing: Listing) -> CacheCheck:
    """How the indices' view of one model compares with a LIST of it (pure)."""
    held = {_identity(body): _version(body.get("metadata", {}).get("resourceVersion")) for body in indexed}
    behind = []
    for body in listing.items:
        meta = body.get("metadata", {})
        if held.get(_identity(body), -1) < _version(meta.get("resourceVersion")):
            behind.append(f"{body.get('kind')}/{meta.get('name')}")
    listed = {_identity(body) for body in listing.items}
    gone = frozenset(
        (kind, uid, str(version)) for (kind, uid), version in held.items()
        if (kind, uid) not in listed and kind in listing.versions
        and 0 <= version <= _version(listing.versions[kind])
    )
    return CacheCheck(tuple(sorted(behind)), gone)


def _owned_by(body: Mapping[str, Any], uid: str) -> bool:
    return any(owner.get("kind") == KIND and str(owner.get("uid")) == uid
               for owner in body.get("metadata", {}).get("ownerReferences", []) or [])


async def list_model(ctx: OperatorContext, namespace: str, name: str, uid: str) -> Listing:
    """What the indices should hold of the model: its owned objects (by owner, as indexed) and its pods."""
    selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY},{contract.LABEL_MODEL}={label_value(name)}"
    items: list[Mapping[str, Any]] = []
    versions: dict[str, str] = {}
    for kind in LISTED_KINDS:
        found, versions[kind] = await ctx.api.list_versioned(kind, namespace, selector)
        items += [body for body in found if kind == "Pod" or _owned_by(body, uid)]
    return Listing(items, versions)


async def cache_known(ctx: OperatorContext, namespace: str, name: str, uid: str, logger: Logger) -> bool:
    """Whether this pass may read the model's owned objects and pods from the indices (see the module's doc)."""
    if not ctx.cache.may_lag:
        return True
    memory = ctx.model(namespace, name)
    if memory.cache_trusted:
        return True
    label = label_value(name)

    def indexed() -> list[Mapping[str, Any]]:
        # Only what the LIST's selector could return is judged: nothing the LIST cannot see is taken for deleted.
        return [body for body in ctx.cache.indexed(namespace, uid, label)
                if (body.get("metadata", {}).get("labels") or {}).get(contract.LABEL_MODEL) == label]

    check = compare(indexed(), memory.listing) if memory.listing is not None else None
    if check is None or not check.caught_up:
        memory.listing = await list_model(ctx, namespace, name, uid)
        check = compare(indexed(), memory.listing)
    ctx.cache.bury(check.gone)
    if check.caught_up:
        memory.cache_trusted, memory.listing = True, None
        return True
    logger.info("watch cache not caught up with the API server after a pause (%s): holding this pass",
                ", ".join(check.behind[:5]) + (f" and {len(check.behind) - 5} more" if len(check.behind) > 5 else ""))
    return False
