"""Reading the local cluster's audit log: rollouts are pod-template changes, refusals are kept apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from localcluster.cluster import AUDIT_POLICY
from tests.e2e.audit import AuditLog, recorded_sequence, rollouts, route_weights, status_writes, written_status


def deployment(k: int, replicas: int = 2) -> dict[str, Any]:
    return {"kind": "Deployment", "metadata": {"name": "m-gfx942"},
            "spec": {"replicas": replicas, "template": {"metadata": {
                "labels": {"specdec.io/revision": f"rev{k}"},
                "annotations": {"specdec.io/num-speculative-tokens": str(k)}}}}}


def entry(at: int, verb: str, resource: str, name: str, code: int = 200, subresource: str = "",
          request: Any = None, response: Any = None, agent: str = "specdec-operator") -> dict[str, Any]:
    ref = {"resource": resource, "namespace": "ns", "name": name, **({"subresource": subresource} if subresource
                                                                     else {})}
    return {"stage": "ResponseComplete", "verb": verb, "objectRef": ref, "responseStatus": {"code": code},
            "userAgent": agent, "requestReceivedTimestamp": f"2026-01-01T00:00:{at:02d}.000000Z",
            "requestObject": request, "responseObject": response}


def write_log(path: Path, entries: list[dict[str, Any]]) -> None:
    with path.open("a") as log:
        for item in entries:
            log.write(json.dumps(item) + "\n")


def test_only_template_changes_after_the_cursor_count_as_rollouts(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    write_log(path, [entry(1, "patch", "deployments", "m-gfx942", response=deployment(7))])
    audit = AuditLog(path)
    write_log(path, [
        entry(2, "patch", "deployments", "m-gfx942", response=deployment(5, replicas=3)),  # scale: no rollout
        entry(3, "patch", "deployments", "m-gfx942", code=422, request=deployment(2)),  # refused
        entry(4, "update", "deployments", "m-gfx942", response=deployment(2), agent="kube-controller-manager"),
        entry(5, "patch", "deployments", "m-gfx942", response=deployment(5)),  # a revert
        {**entry(6, "patch", "deployments", "m-gfx942", response=deployment(9)),
         "requestURI": "/apis/apps/v1/namespaces/ns/deployments/m-gfx942?dryRun=All"},  # stores nothing
        {"stage": "ResponseStarted", "verb": "patch"},
        "not json",
    ])
    with path.open("a") as log:
        log.write('{"half a line')
    changes = rollouts(audit.entries("ns"), "m-gfx942", deployment(5)["spec"]["template"])
    assert [(c.k, c.created) for c in changes] == [(2, False), (5, False)]
    assert [c.k for c in rollouts(audit.entries("ns"), "m-gfx942")] == [5, 2, 5]
    assert rollouts(audit.entries("other"), "m-gfx942") == []


def test_decisions_come_from_stored_status_and_refusals_from_what_was_tried(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.touch()
    audit = AuditLog(path)

    def status(k: int) -> dict[str, Any]:
        return {"status": {"pools": [{"name": "m-gfx942", "effectiveK": k}]}}

    write_log(path, [
        entry(1, "patch", "speculativemodels", "m", subresource="status", response=status(5)),
        entry(2, "patch", "speculativemodels", "m", subresource="status", code=422, request=status(2)),
        entry(3, "patch", "speculativemodels", "m", subresource="status", response=status(5)),
        entry(4, "patch", "speculativemodels", "m", subresource="status", response=status(2)),
        entry(5, "patch", "speculativemodels", "m", response={"metadata": {}}),  # not the status subresource
        entry(6, "patch", "speculativemodels", "m", subresource="status", code=409, request=status(7)),
    ])
    writes = status_writes(audit.entries(), "m")
    assert [w.ok for w in writes] == [True, False, True, True, False]
    assert [w.denied for w in writes] == [False, True, False, False, False], "a conflict is not a refusal"
    assert written_status(writes[1])["pools"][0]["effectiveK"] == 2
    assert recorded_sequence(writes, lambda s: s["pools"][0]["effectiveK"]) == [5, 2]


def test_route_weights_of_one_backend_in_order(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.touch()
    audit = AuditLog(path)

    def route(weight: int | None) -> dict[str, Any]:
        refs = [{"name": "m-stable", "weight": 100 - (weight or 0)}]
        if weight is not None:
            refs.append({"name": "m-canary", "weight": weight})
        return {"spec": {"rules": [{"backendRefs": refs}]}}

    write_log(path, [entry(i, "patch", "httproutes", "m-route", response=route(w))
                     for i, w in enumerate([None, 10, 10, 50, 100, 0])])
    assert route_weights(audit.entries(), "m-route", "m-canary") == [0, 10, 50, 100, 0]


def test_the_audit_policy_keeps_bodies_of_the_writes_the_fault_tests_count() -> None:
    policy = yaml.safe_load(AUDIT_POLICY)
    with_bodies = next(rule for rule in policy["rules"] if rule["level"] == "RequestResponse")
    resources = {(group["group"], name) for group in with_bodies["resources"] for name in group["resources"]}
    assert resources == {("apps", "deployments"), ("specdec.io", "speculativemodels/status"),
                         ("gateway.networking.k8s.io", "httproutes")}
    assert policy["rules"][-1] == {"level": "None"}
