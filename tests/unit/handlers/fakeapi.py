"""An in-memory stand-in for OUR API seam (specdec_operator.kube.api.KubeApi), with the server rules the
operator relies on: resourceVersion preconditions (409), merge-patch semantics, generations, refusals."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import kopf
from kopf._core.engines import posting

from specdec_operator.handlers.services.watches import INDEX_HANDLERS, OWNED
from specdec_operator.kube.api import KubeApi, KubeApiError

Key = tuple[str, str, str]  # kind, namespace, name


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies a merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


@dataclass(frozen=True)
class Call:
    verb: str
    kind: str
    name: str
    body: Any = None


class FakeKubeApi(KubeApi):
    def __init__(self) -> None:  # no HTTP client: every public method is overridden
        self.field_manager = "specdec-operator"
        self.objects: dict[Key, dict[str, Any]] = {}
        self.calls: list[Call] = []
        self._versions = itertools.count(100)
        self.version = 99  # the last resourceVersion handed out: what a LIST now is "as of"
        # (verb, kind) -> a function of the request body that returns an error to raise, or None to accept.
        self.refuse: dict[tuple[str, str], Callable[[Any], KubeApiError | None]] = {}

    def _stamp(self, obj: dict[str, Any]) -> None:
        self.version = next(self._versions)
        obj["metadata"]["resourceVersion"] = str(self.version)

    def _check(self, verb: str, kind: str, body: Any) -> None:
        rule = self.refuse.get((verb, kind))
        error = rule(body) if rule is not None else None
        if error is not None:
            raise error

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store an object as if someone else created it."""
        stored = copy.deepcopy(dict(obj))
        meta = stored["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("generation", 1)
        self._stamp(stored)
        self.objects[(stored["kind"], meta.get("namespace", ""), meta["name"])] = stored
        return copy.deepcopy(stored)

    def writes(self, verb: str | None = None, kind: str | None = None) -> list[Call]:
        return [c for c in self.calls if (verb is None or c.verb == verb) and (kind is None or c.kind == kind)]

    def roll_out(self) -> None:
        """The Deployment controller: every Deployment becomes fully ready at its generation."""
        for (kind, _, _), obj in self.objects.items():
            if kind == "Deployment":
                replicas = obj["spec"].get("replicas", 1)
                obj["status"] = {"observedGeneration": obj["metadata"]["generation"], "replicas": replicas,
                                 "updatedReplicas": replicas, "readyReplicas": replicas}
                self._stamp(obj)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def list(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        wanted = dict(term.split("=", 1) for term in label_selector.split(",") if term)
        return [
            copy.deepcopy(obj) for (k, ns, _), obj in sorted(self.objects.items())
            if k == kind and ns == namespace
            and all(obj["metadata"].get("labels", {}).get(key) == value for key, value in wanted.items())
        ]

    async def list_versioned(
        self, kind: str, namespace: str, label_selector: str
    ) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(Call("list", kind, label_selector))
        self._check("list", kind, None)
        return await self.list(kind, namespace, label_selector), str(self.version)

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        self.calls.append(Call("apply", obj["kind"], meta["name"], copy.deepcopy(dict(obj))))
        self._check("apply", obj["kind"], obj)
        key = (obj["kind"], meta["namespace"], meta["name"])
        existing = self.objects.get(key)
        stored = copy.deepcopy(dict(obj))
        stored["metadata"] = {**(existing or {}).get("metadata", {}), **stored["metadata"]}
        stored["metadata"].setdefault("uid", f"uid-{meta['name']}")
        changed = existing is None or existing.get("spec") != stored.get("spec")
        stored["metadata"]["generation"] = (existing or {}).get("metadata", {}).get("generation", 0) + (
            1 if changed else 0)
        if existing is not None and "status" in existing:
            stored["status"] = existing["status"]
        self._stamp(stored)
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def create_if_absent(self, obj: Mapping[str, Any]) -> bool:
        meta = obj["metadata"]
        if (obj["kind"], meta.get("namespace", ""), meta["name"]) in self.objects:
            return False
        self.calls.append(Call("create", obj["kind"], meta["name"]))
        self.put(obj)
        return True

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        self.calls.append(Call("delete", kind, name))
        if self.objects.pop((kind, namespace, name), None) is not None:
            self.version = next(self._versions)  # a deletion is a point in the server's history too

    async def patch_merge(self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.calls.append(Call("patch", kind, name, copy.deepcopy(dict(patch))))
        obj = self.objects[(kind, namespace, name)]
        merge(obj, patch)
        self._stamp(obj)

    async def patch_status(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        self.calls.append(Call("patch-status", kind, name, copy.deepcopy(dict(patch))))
        self._check("patch-status", kind, patch)
        obj = self.objects.get((kind, namespace, name))
        if obj is None:
            raise KubeApiError(404, "NotFound", f"{kind} {name} not found")
        if resource_version and resource_version != obj["metadata"]["resourceVersion"]:
            raise KubeApiError(409, "Conflict", "the object has been modified; please apply your changes to the "
                                                "latest version and try again")
        obj["status"] = merge(dict(obj.get("status") or {}), patch)
        self._stamp(obj)
        return copy.deepcopy(obj)

    async def close(self) -> None:
        return None


class KopfView:
    """The objects kopf's indices are built from on a replica that paused: what they were when kopf closed its
    watches, until its re-list catches up with the API; and, after that too, objects deleted meanwhile, which a
    re-list never drops from kopf's indices."""

    def __init__(self, api: FakeKubeApi, at_pause: dict[Key, dict[str, Any]]) -> None:
        self.api = api
        self.frozen: dict[Key, dict[str, Any]] | None = copy.deepcopy(at_pause)
        self.ghosts: dict[Key, dict[str, Any]] = {}

    @property
    def objects(self) -> dict[Key, dict[str, Any]]:
        return {**(self.api.objects if self.frozen is None else self.frozen), **self.ghosts}

    def catch_up(self) -> None:
        self.frozen = None


class LiveIndex(Mapping[Any, list[dict[str, Any]]]):
    """One kopf index as it stands once kopf's watch has caught up with the fake API's objects."""

    def __init__(self, api: FakeKubeApi | KopfView, kind: str, handler: Callable[..., Any]) -> None:
        self._api, self._kind, self._handler = api, kind, handler

    def _entries(self) -> dict[Any, list[dict[str, Any]]]:
        entries: dict[Any, list[dict[str, Any]]] = {}
        for (kind, _, _), obj in sorted(self._api.objects.items()):
            labels = obj["metadata"].get("labels", {})
            # The watch is filtered on the server by our managed-by label.
            if kind != self._kind or any(labels.get(key) != value for key, value in OWNED.items()):
                continue
            for key, value in (self._handler(kopf.Body(copy.deepcopy(obj))) or {}).items():
                entries.setdefault(key, []).append(value)
        return entries

    def __getitem__(self, key: Any) -> list[dict[str, Any]]:
        return self._entries()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._entries())

    def __len__(self) -> int:
        return len(self._entries())


def live_indices(api: FakeKubeApi | KopfView) -> dict[str, LiveIndex]:
    """What kopf hands a model loop: every index the operator declares, over the fake API's objects."""
    return {name: LiveIndex(api, kind, handler) for name, (kind, handler) in INDEX_HANDLERS.items()}


class PostedEvents:
    def __init__(self, queue: asyncio.Queue[Any]) -> None:
        self._queue = queue
        self.posted: list[tuple[str, str, str]] = []

    def drain(self) -> list[tuple[str, str, str]]:
        """Everything posted since the last drain, as (type, reason, message)."""
        fresh = []
        while not self._queue.empty():
            event = self._queue.get_nowait()
            fresh.append((event.type, event.reason, event.message))
        self.posted += fresh
        return fresh


@contextmanager
def kopf_events() -> Iterator[PostedEvents]:
    """Collect what kopf.event/kopf.warn post, from kopf's own posting queue."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    variables = (posting.settings_var, posting.event_queue_var, posting.event_queue_loop_var)
    values = (kopf.OperatorSettings(), queue, asyncio.get_running_loop())
    tokens = [var.set(value) for var, value in zip(variables, values, strict=True)]  # type: ignore[attr-defined]
    try:
        yield PostedEvents(queue)
    finally:
        for var, token in zip(variables, tokens, strict=True):
            var.reset(token)  # type: ignore[attr-defined]
