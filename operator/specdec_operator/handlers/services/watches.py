"""Watch caches of everything the operator owns, and the events that wake a model's loop.

A reconcile used to LIST Deployments, ConfigMaps, Services, PDBs and Pods for its model on every tick:
five requests per model every ~15 s, ~175 LISTs/s at 500 models for a fleet in which nothing changed.
Now kopf keeps one watch per kind, filtered on the API server by our managed-by label
(`filter_watches`; pods excepted, as free-GPU counts need every pod), and indexes the objects by
owning model; gather() and the scrape path read the indices (handlers/services/cache.py). Kopf fills every
index before any model loop starts, so a restarted operator never mistakes "not listed yet" for
"missing"; but only once per process: after a pause for a peer the indices are checked against a LIST
before a model's loop trusts them (handlers/resync.py).

What wakes a model's loop: a change of its spec, metadata or deletion (not of its status: our own
status writes must not echo into another reconcile), and any change of an object it owns. Pods do not
wake it; they only change whom the scrape scheduler scrapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from specdec_operator import GROUP, KIND, PLURAL
from specdec_operator.decisions.pod_failures import pod_failure
from specdec_runtime import contract

OWNED_SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
OWNED = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
# Kind -> plural, for every kind the operator owns (gather's children) plus its runtime pods.
OWNED_KINDS = {"Deployment": "deployments", "ConfigMap": "configmaps", "Service": "services",
               "PodDisruptionBudget": "poddisruptionbudgets"}
LIST_CHUNK = 500  # initial LISTs come in pages of this many objects

ChildKey = tuple[str, str]  # (namespace, owning model's uid)
PodKey = tuple[str, str]  # (namespace, the model's label value)


def filter_watches(settings: kopf.OperatorSettings, model_selector: str | None) -> None:
    """Server-side label selectors for every watch, and paginated initial LISTs."""
    # Not pods: the free-GPU count (register.gpu_pods) must see every pod that holds a GPU, ours or not;
    # our runtime pods are picked out of that one watch by the runtime_pods index's own label filter.
    for plural in OWNED_KINDS.values():
        settings.watching.label_selectors[plural] = OWNED_SELECTOR
    if model_selector:
        settings.watching.label_selectors[GROUP, PLURAL] = model_selector
    settings.watching.chunk_size = LIST_CHUNK


def _slim(body: Mapping[str, Any], kind: str, api_version: str) -> dict[str, Any]:
    """The object as a LIST item would be, minus managedFields, which nothing reads and which dominate size."""
    meta = {key: value for key, value in body["metadata"].items() if key != "managedFields"}
    return {"apiVersion": api_version, "kind": kind, **{k: v for k, v in body.items() if k != "metadata"},
            "metadata": meta}


def _owning_models(meta: Mapping[str, Any]) -> list[str]:
    return [str(owner["uid"]) for owner in meta.get("ownerReferences", []) or [] if owner.get("kind") == KIND]


def _index_child(kind: str, api_version: str, body: Mapping[str, Any]) -> dict[ChildKey, dict[str, Any]] | None:
    meta = body["metadata"]
    owners = _owning_models(meta)
    if not owners:
        return None
    slim = _slim(body, kind, api_version)
    return {(str(meta["namespace"]), uid): slim for uid in owners}


def index_deployment(body: Mapping[str, Any]) -> dict[ChildKey, dict[str, Any]] | None:
    return _index_child("Deployment", "apps/v1", body)


def index_configmap(body: Mapping[str, Any]) -> dict[ChildKey, dict[str, Any]] | None:
    return _index_child("ConfigMap", "v1", body)


def index_service(body: Mapping[str, Any]) -> dict[ChildKey, dict[str, Any]] | None:
    return _index_child("Service", "v1", body)


def index_pdb(body: Mapping[str, Any]) -> dict[ChildKey, dict[str, Any]] | None:
    return _index_child("PodDisruptionBudget", "policy/v1", body)


# What the scrape path and the canary read of a runtime pod (reconcile/tuning_inputs.py scrape_targets,
# canary/evidence.py pod_restarts). The rest, its spec above all, is most of a pod's size, and 2,000 of them
# held for nothing were both resident memory and, once freed, heap the allocator could not give back.
# The resourceVersion tells a lagging index from a current one (handlers/resync.py).
# Its ownerReferences tell the model's own pods from look-alikes carrying its labels (handlers/services/cache.py pods).
POD_METADATA_KEYS = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "deletionTimestamp",
                     "ownerReferences")


def runtime_pod_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime pod as the operator reads it: identity, labels, annotations, readiness (and since when), IP,
    start time, restarts."""
    meta, status = body["metadata"], body.get("status") or {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {key: meta[key] for key in POD_METADATA_KEYS if key in meta},
        "status": {
            "phase": status.get("phase"),
            "podIP": status.get("podIP"),
            # With the Ready condition's lastTransitionTime: the pool's start-to-Ready time, which the tuner charges
            # to a K change (reconcile/tuning_inputs.py pool_ready_seconds).
            "startTime": status.get("startTime"),
            "conditions": [_condition_view(c) for c in status.get("conditions") or []],
            "containerStatuses": [_container_view(c) for c in status.get("containerStatuses") or []],
        },
    }


def _condition_view(condition: Mapping[str, Any]) -> dict[str, Any]:
    view = {"type": condition.get("type"), "status": condition.get("status")}
    if condition.get("type") == "Ready":
        view["lastTransitionTime"] = condition.get("lastTransitionTime")
    if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
        # The scheduler's reason and words, for an Unschedulable pool (decisions/pod_failures.py).
        view.update(reason=condition.get("reason"), message=condition.get("message"))
    return view


def _container_view(container: Mapping[str, Any]) -> dict[str, Any]:
    """Restarts, and only when something is wrong, the waiting and last-terminated reasons and messages:
    a healthy pod's view stays as small as before (decisions/pod_failures.py reads these)."""
    view: dict[str, Any] = {"name": container.get("name"), "restartCount": container.get("restartCount", 0)}
    state = container.get("state") or {}
    waiting = state.get("waiting")
    if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
        view["state"] = {"waiting": {"reason": waiting.get("reason"), "message": waiting.get("message")}}
    elif state.get("running") is not None and container.get("started") is False:
        view["state"] = {"running": {}}
        view["started"] = False
    terminated = (container.get("lastState") or {}).get("terminated")
    if terminated and "state" in view:
        view["lastState"] = {"terminated": {key: terminated.get(key) for key in ("reason", "message", "exitCode")}}
    return view


def index_runtime_pod(body: Mapping[str, Any]) -> dict[PodKey, dict[str, Any]] | None:
    meta = body["metadata"]
    model = (meta.get("labels") or {}).get(contract.LABEL_MODEL)
    if not model:
        return None
    return {(str(meta["namespace"]), str(model)): runtime_pod_view(body)}


# One index per kind: kopf passes each to handlers under its function's name. Async although they never
# wait: kopf runs a sync handler in its thread pool, a thread hop per watch event (thousands of pod
# events on a large fleet), and every pool thread gets a glibc malloc arena that keeps its memory.
@kopf.index("apps", "v1", "deployments", labels=OWNED)
async def owned_deployments(body: kopf.Body, **_: Any) -> dict[ChildKey, dict[str, Any]] | None:
    return index_deployment(body)


@kopf.index("", "v1", "configmaps", labels=OWNED)
async def owned_configmaps(body: kopf.Body, **_: Any) -> dict[ChildKey, dict[str, Any]] | None:
    return index_configmap(body)


@kopf.index("", "v1", "services", labels=OWNED)
async def owned_services(body: kopf.Body, **_: Any) -> dict[ChildKey, dict[str, Any]] | None:
    return index_service(body)


@kopf.index("policy", "v1", "poddisruptionbudgets", labels=OWNED)
async def owned_pdbs(body: kopf.Body, **_: Any) -> dict[ChildKey, dict[str, Any]] | None:
    return index_pdb(body)


@kopf.index("", "v1", "pods", labels=OWNED)
async def runtime_pods(body: kopf.Body, **_: Any) -> dict[PodKey, dict[str, Any]] | None:
    return index_runtime_pod(body)


@kopf.on.event("", "v1", "pods", labels=OWNED)
async def runtime_pod_failing(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    """Wake a model when one of its pods starts or stops failing (an image pull, a missing Secret key, a crash
    loop): the condition then names it within a reconcile. Other pod changes wake nothing."""
    meta = body["metadata"]
    model = (meta.get("labels") or {}).get(contract.LABEL_MODEL)
    if not model:
        return
    failing: dict[str, str] = memo.context.failing_pods
    uid = str(meta.get("uid", ""))
    failure = None if type == "DELETED" else pod_failure(runtime_pod_view(body), contract.LABEL_POOL)
    cause = failure.reason if failure is not None else None
    if failing.get(uid) == cause:
        return
    if cause is None:
        failing.pop(uid, None)
    else:
        failing[uid] = cause
    memo.context.nudge_by_label(str(meta.get("namespace", "")), str(model))


# Index name (as handlers receive it) -> the kind it indexes and its pure function; for tests that index a
# fake API.
INDEX_HANDLERS = {
    "owned_deployments": ("Deployment", index_deployment),
    "owned_configmaps": ("ConfigMap", index_configmap),
    "owned_services": ("Service", index_service),
    "owned_pdbs": ("PodDisruptionBudget", index_pdb),
    "runtime_pods": ("Pod", index_runtime_pod),
}


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
@kopf.on.event("", "v1", "configmaps", labels=OWNED)
@kopf.on.event("", "v1", "services", labels=OWNED)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=OWNED)
async def owned_changed(namespace: str | None, meta: kopf.Meta, memo: Any, **_: Any) -> None:
    # Async, so it runs on the event loop: asyncio.Event.set() is not safe from kopf's thread pool.
    # The owner reference carries the model's real name; the label may be a shortened form of it.
    for owner in meta.get("ownerReferences", []):
        if owner.get("kind") == KIND and namespace:
            memo.context.nudge(namespace, owner["name"])
