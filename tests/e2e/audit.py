"""Reading the API server's audit log: who wrote what, and what the written objects looked like.

The local cluster logs every write at Metadata level, and the writes that carry a K decision and its
rollout (Deployments, SpeculativeModel status, HTTPRoutes) with their request and response bodies
(hack/localcluster/cluster.py AUDIT_POLICY). A rollout is a write that changed a Deployment's pod
template: that is what restarts vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_runtime import contract

OPERATOR_AGENTS = ("specdec-operator", "kopf/")
WRITE_VERBS = ("create", "update", "patch", "delete")


def _operator_entries(audit_log: Path, since_iso: str, namespace: str | None = None) -> Iterable[dict[str, Any]]:
    """Completed requests by the operator (our client or kopf's) received at or after `since_iso`; with
    `namespace`, only those on objects in it (so a test need not wait for other tests' namespaces to go)."""
    for line in audit_log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("stage") != "ResponseComplete" or entry.get("requestReceivedTimestamp", "") < since_iso:
            continue
        if namespace is not None and entry.get("objectRef", {}).get("namespace") != namespace:
            continue
        if str(entry.get("userAgent", "")).startswith(OPERATOR_AGENTS) and entry.get("verb") in WRITE_VERBS:
            yield entry


def operator_writes_since(audit_log: Path, since_iso: str, namespace: str | None = None) -> list[str]:
    """Writes by the operator received at or after `since_iso` (in `namespace`, if given), one line each."""
    return [f"{entry['verb']} {entry.get('objectRef', {}).get('resource')}/{entry.get('objectRef', {}).get('name')} "
            f"({entry['userAgent']})" for entry in _operator_entries(audit_log, since_iso, namespace)]


def operator_write_entries(audit_log: Path, since_iso: str, namespace: str | None = None) -> list[dict[str, str]]:
    """The operator's writes at or after `since_iso` (in `namespace`, if given), each with its time, verb,
    resource, subresource and name."""
    entries = []
    for entry in _operator_entries(audit_log, since_iso, namespace):
        ref = entry.get("objectRef", {})
        entries.append({
            "at": entry["requestReceivedTimestamp"], "verb": entry["verb"],
            "code": str(entry.get("responseStatus", {}).get("code", "")),
            "resource": ref.get("resource", ""), "subresource": ref.get("subresource", ""),
            "name": ref.get("name", ""), "agent": entry.get("userAgent", ""),
        })
    return entries


def resource_version_test_failed(request: Any) -> bool:
    """Whether a refused request was a JSON patch guarded by a `test` of metadata.resourceVersion."""
    return (isinstance(request, list) and bool(request) and isinstance(request[0], dict)
            and request[0].get("op") == "test" and request[0].get("path") == "/metadata/resourceVersion")


@dataclass(frozen=True)
class AuditEntry:
    verb: str
    user: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    user_agent: str
    received: str  # requestReceivedTimestamp, RFC 3339 with microseconds: sorts as text
    request: dict[str, Any] | None
    response: dict[str, Any] | None
    message: str  # the API server's message on a refusal

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> AuditEntry:
        ref = raw.get("objectRef", {})
        status = raw.get("responseStatus", {})
        return cls(
            verb=str(raw.get("verb", "")), user=str(raw.get("user", {}).get("username", "")),
            resource=str(ref.get("resource", "")),
            subresource=str(ref.get("subresource", "")), namespace=str(ref.get("namespace", "")),
            name=str(ref.get("name", "")), code=int(status.get("code", 0)), user_agent=str(raw.get("userAgent", "")),
            received=str(raw.get("requestReceivedTimestamp", "")), request=raw.get("requestObject"),
            response=raw.get("responseObject"), message=str(status.get("message", "")),
        )

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300

    @property
    def denied(self) -> bool:
        """Refused by admission (a policy or webhook said no: 403, or 422 for an invalid object); a 409
        conflict, or kopf's failed resourceVersion test, is optimistic concurrency doing its job, not a refusal."""
        return self.code in (403, 422) and not self.lost_a_race

    @property
    def lost_a_race(self) -> bool:
        """Someone wrote in between: a 409, or a 422 on a JSON patch whose resourceVersion test failed (kopf
        writes finalizers that way; the API server answers a failed `test` op with 422, not 409)."""
        return self.code == 409 or (self.code == 422 and resource_version_test_failed(self.request))

    @property
    def by_operator(self) -> bool:
        return self.user_agent.startswith(OPERATOR_AGENTS)

    def is_write_of(self, resource: str, name: str | None = None, subresource: str = "") -> bool:
        return (self.verb in WRITE_VERBS and self.resource == resource and self.subresource == subresource
                and (name is None or self.name == name))


class AuditLog:
    """The entries the API server logs from the moment this object is made (a cursor into the file).

    A restarted API server appends to the same file, so entries from both sides of a restart are read.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def entries(self, namespace: str | None = None) -> list[AuditEntry]:
        with self.path.open("rb") as log:
            size = log.seek(0, 2)
            # Rotated (the file restarted below our cursor): everything in the new file is newer.
            log.seek(self.offset if size >= self.offset else 0)
            lines = log.read().decode(errors="replace").splitlines()
        entries = []
        for line in lines:
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written right now
            if not isinstance(raw, dict) or raw.get("stage") != "ResponseComplete":
                continue
            if "dryRun=" in str(raw.get("requestURI", "")):
                continue  # a server-side dry run (the fault tests' probes) stores nothing
            entry = AuditEntry.parse(raw)
            if namespace is None or entry.namespace == namespace:
                entries.append(entry)
        return sorted(entries, key=lambda entry: entry.received)


# --- what the entries say about a K change --------------------------------------------------------------


def template_of(deployment: dict[str, Any] | None) -> dict[str, Any] | None:
    if not deployment or deployment.get("kind") != "Deployment":
        return None
    template = deployment.get("spec", {}).get("template")
    return dict(template) if template else None


def k_of(template: dict[str, Any] | None) -> int | None:
    if template is None:
        return None
    value = template.get("metadata", {}).get("annotations", {}).get(contract.ANNOTATION_K)
    return int(value) if value is not None else None


@dataclass(frozen=True)
class TemplateWrite:
    """A write that gave a Deployment a pod template it did not have just before: a rollout."""

    received: str
    deployment: str
    k: int | None
    revision: str | None
    user_agent: str
    created: bool  # the Deployment did not exist before this write


def rollouts(entries: Iterable[AuditEntry], deployment: str,
             baseline: dict[str, Any] | None = None) -> list[TemplateWrite]:
    """Template changes of one Deployment, in order, starting from `baseline` (its template before the
    window; None when it did not exist). A write that leaves the template as it was is not a rollout."""
    current = _fingerprint(baseline) if baseline is not None else None
    changes = []
    for entry in entries:
        if not entry.is_write_of("deployments", deployment) or not entry.ok:
            continue
        if entry.verb == "delete":
            current = None
            continue
        template = template_of(entry.response)
        if template is None:
            continue
        fingerprint = _fingerprint(template)
        if fingerprint != current:
            revision = template.get("metadata", {}).get("labels", {}).get(contract.LABEL_REVISION)
            changes.append(TemplateWrite(entry.received, deployment, k_of(template), revision, entry.user_agent,
                                         created=current is None))
        current = fingerprint
    return changes


def deployment_writes(entries: Iterable[AuditEntry], deployment: str, by_operator: bool = True) -> list[AuditEntry]:
    """Write requests to a Deployment (refused ones included), by the operator unless told otherwise."""
    return [entry for entry in entries if entry.is_write_of("deployments", deployment)
            and (entry.by_operator or not by_operator)]


def status_writes(entries: Iterable[AuditEntry], model: str) -> list[AuditEntry]:
    """Write requests to a SpeculativeModel's status subresource (refused ones included)."""
    return [entry for entry in entries if entry.is_write_of("speculativemodels", model, "status")]


def written_status(entry: AuditEntry) -> dict[str, Any]:
    """The status a status write left (its response) or, for a refused one, tried to write (its request)."""
    body = entry.response if entry.ok and entry.response else entry.request
    return dict((body or {}).get("status") or {})


def recorded_sequence(entries: Iterable[AuditEntry], read: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """`read(status)` over the successful status writes, consecutive repeats collapsed: how a recorded
    value moved (for example a pool's K, or the canary's step)."""
    values: list[Any] = []
    for entry in entries:
        if entry.ok:
            value = read(written_status(entry))
            if value is not None and (not values or values[-1] != value):
                values.append(value)
    return values


def route_weights(entries: Iterable[AuditEntry], route: str, backend: str) -> list[int]:
    """The weight of `backend` in each successful write of an HTTPRoute, consecutive repeats collapsed."""
    weights: list[int] = []
    for entry in entries:
        if not entry.is_write_of("httproutes", route) or not entry.ok or not entry.response:
            continue
        refs = [ref for rule in entry.response.get("spec", {}).get("rules", []) for ref in rule.get("backendRefs", [])]
        weight = next((int(ref.get("weight", 1)) for ref in refs if ref.get("name") == backend), 0)
        if not weights or weights[-1] != weight:
            weights.append(weight)
    return weights


def _fingerprint(template: dict[str, Any]) -> str:
    return json.dumps(template, sort_keys=True)
