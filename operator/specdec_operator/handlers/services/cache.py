"""What gather() and the scrape path read instead of LISTs: the kopf indices of handlers/services/watches.py.

Kopf fills every index before the first model loop starts, but only once in a process's life. A replica that
paused for a peer (kopf closes every watch) and resumes re-lists each kind on its own while the model loops
already run, so for a while an index holds what it held when the replica paused: objects created meanwhile
are missing and objects deleted meanwhile are still there (kopf never drops an object a re-list no longer
returns). After a pause a model's loop therefore checks the indices against a LIST before it trusts them
(handlers/resync.py); the objects a LIST proved deleted are left out of every read here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from specdec_operator import KIND
from specdec_operator.decisions.capacity import FleetClaims
from specdec_operator.gpu.inventory import NodeGpus, PodGpus
from specdec_operator.reconcile.rollout_limit import rolls_out

CHILD_INDICES = {"Deployment": "owned_deployments", "ConfigMap": "owned_configmaps", "Service": "owned_services",
                 "PodDisruptionBudget": "owned_pdbs"}


class WatchCache:
    """The kopf indices, bound from the first model loop's kwargs (kopf passes indices to handlers only)."""

    def __init__(self) -> None:
        self._indices: Mapping[str, Any] = {}
        # What last woke each model: its spec generation, labels, annotations and deletion mark.
        self._seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        # The replica paused since kopf filled the indices: they may lag the cluster (see the module's doc).
        self.may_lag = False
        # (kind, uid, resourceVersion) of indexed objects a LIST proved deleted: kopf keeps them, reads skip them.
        self._gone: set[tuple[str, str, str]] = set()

    def paused(self) -> None:
        """Kopf closed the watches for a peer: once resumed, each index catches up on its own."""
        self.may_lag = True

    def bury(self, gone: Iterable[tuple[str, str, str]]) -> None:
        self._gone.update(gone)

    def _live(self, body: Mapping[str, Any]) -> bool:
        if not self._gone:
            return True
        meta = body.get("metadata", {})
        return (str(body.get("kind", "")), str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))) \
            not in self._gone

    def bind(self, handler_kwargs: Mapping[str, Any]) -> None:
        if not self._indices:
            names = [*CHILD_INDICES.values(), "runtime_pods"]
            self._indices = {name: handler_kwargs[name] for name in names}

    @property
    def bound(self) -> bool:
        return bool(self._indices)

    def children(self, namespace: str, uid: str) -> dict[tuple[str, str], Mapping[str, Any]]:
        """The model's owned objects by (kind, name)."""
        found: dict[tuple[str, str], Mapping[str, Any]] = {}
        for kind, index_name in CHILD_INDICES.items():
            for body in _store(self._indices[index_name], (namespace, uid)):
                if self._live(body):
                    found[(kind, body["metadata"]["name"])] = body
        return found

    def indexed(self, namespace: str, uid: str, model_label: str) -> list[Mapping[str, Any]]:
        """Everything the indices hold of the model (owned objects and runtime pods), as kopf keeps it."""
        found = [body for index_name in CHILD_INDICES.values()
                 for body in _store(self._indices[index_name], (namespace, uid))]
        return found + list(_store(self._indices["runtime_pods"], (namespace, model_label)))

    def models_rolling_out(self) -> list[tuple[str, str]]:
        """(namespace, name) of the models whose owned Deployments show a rollout in flight (a canary Deployment,
        or pods not all of the current template): the slots they hold under the fleet's rollout limit."""
        found = []
        for (namespace, _uid), store in self._indices["owned_deployments"].items():
            bodies = [body for body in store if self._live(body)]
            owners = {ref.get("name") for body in bodies for ref in body["metadata"].get("ownerReferences", [])
                      if ref.get("kind") == KIND}
            if len(owners) == 1 and rolls_out({str(body["metadata"]["name"]): body for body in bodies}):
                found.append((str(namespace), str(owners.pop())))
        return found

    def count(self) -> int:
        """Objects in the bound indices (owned objects and runtime pods): how big the watched fleet is."""
        return sum(len(store) for index in self._indices.values() for store in index.values())

    def pods(self, namespace: str, model_label: str, uid: str) -> list[Mapping[str, Any]]:
        """The model's runtime pods: those carrying its labels AND made by one of its own Deployments (issue 34).

        Labels alone are anyone's to set: a pod someone else made with our labels would otherwise be scraped,
        counted as canary evidence and fed to the tuner. A pod is ours when its controller is a ReplicaSet named
        `<Deployment>-<pod-template-hash>` of a Deployment the model owns, with that hash in its own label (as
        the Deployment controller makes them); the garbage collector deletes a pod whose owner uid does not exist.
        """
        deployments = {str(body["metadata"]["name"]) for body in _store(self._indices["owned_deployments"],
                                                                        (namespace, uid))}
        return [body for body in _store(self._indices["runtime_pods"], (namespace, model_label))
                if self._live(body) and made_by(body, deployments)]

    def model_changed(self, key: tuple[str, str], event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Whether this watch event of a model is a change its loop must see (not just a status write)."""
        if event_type == "DELETED":
            self._seen.pop(key, None)
            return True
        meta = body.get("metadata", {})
        seen = (meta.get("generation"), meta.get("labels"), meta.get("annotations"), meta.get("deletionTimestamp"))
        if self._seen.get(key) == seen:
            return False
        self._seen[key] = seen
        return True

    def forget(self, key: tuple[str, str]) -> None:
        self._seen.pop(key, None)


def made_by(pod: Mapping[str, Any], deployments: Iterable[str]) -> bool:
    """Whether the pod's controller is a ReplicaSet one of `deployments` made for the pod's template hash."""
    meta = pod.get("metadata") or {}
    template_hash = (meta.get("labels") or {}).get("pod-template-hash")
    if not template_hash:
        return False
    replica_sets = {f"{name}-{template_hash}" for name in deployments}
    return any(ref.get("kind") == "ReplicaSet" and ref.get("controller") and ref.get("name") in replica_sets
               for ref in meta.get("ownerReferences") or [])


def _store(index: Mapping[Any, Iterable[Mapping[str, Any]]], key: Any) -> Iterable[Mapping[str, Any]]:
    return index.get(key, ())


class FleetSnapshot:
    """Every GPU node and every pod's GPU claim (summed per node, grouped by model), taken out of their kopf
    indices and shared by the model passes of the next `max_age_s`.

    Each full pass needs the whole fleet (free GPUs count every workload's pods). Flattening 2,000 pod
    claims per pass at ~17 passes a second (500 models, 30 s resync) was a sixth of the operator's CPU, and
    splitting them per model another tenth. The indices themselves trail the cluster by a watch event, so a
    snapshot a second old adds nothing a level-triggered pass can notice.
    """

    def __init__(self, max_age_s: float = 1.0) -> None:
        self.max_age_s = max_age_s
        self._taken_at: float | None = None
        self._nodes: list[NodeGpus] = []
        self._claims = FleetClaims()
        # uids of indexed nodes and pods a LIST proved deleted (handlers/services/fleet_audit.py): kopf keeps them.
        self._buried: frozenset[str] = frozenset()

    def read(self, node_index: Mapping[Any, Iterable[NodeGpus]], pod_index: Mapping[Any, Iterable[PodGpus]],
             now: float) -> tuple[list[NodeGpus], FleetClaims]:
        """(nodes, pod claims) as of at most `max_age_s` ago (monotonic `now`)."""
        if self._taken_at is None or now - self._taken_at >= self.max_age_s or now < self._taken_at:
            buried = self._buried
            self._nodes = [facts for store in node_index.values() for facts in store if facts.uid not in buried]
            self._claims = FleetClaims.of(claim for store in pod_index.values() for claim in store
                                          if claim.uid not in buried)
            self._taken_at = now
        return self._nodes, self._claims

    def bury(self, uids: Iterable[str]) -> None:
        """Leave these indexed nodes and pods out from now on (the last audit's ghosts: each audit replaces them)."""
        buried = frozenset(uids)
        if buried != self._buried:
            self._buried, self._taken_at = buried, None

    def clear(self) -> None:
        """Drop the snapshot (the last model went): nothing reads it, and it would pin the fleet's claims."""
        self._taken_at, self._nodes, self._claims = None, [], FleetClaims()
