"""The chart's RBAC is exactly what the operator needs: no wildcard, no Secrets, cluster-wide only where it must."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.unit.shipping.chart import RELEASE_NAMESPACE, Manifest, of_kind, one, render

# What the operator does against the API, per (group, resource); the chart comments say why. Kept in step
# with the code by hand and proven sufficient by tests/e2e/test_rbac.py; nothing here is granted "in case".
WORKLOAD_VERBS: dict[tuple[str, str], set[str]] = {
    ("specdec.io", "speculativemodels"): {"get", "list", "watch", "patch"},
    ("specdec.io", "speculativemodels/status"): {"patch"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"list", "watch"},
    ("", "events"): {"create"},
    ("gateway.networking.k8s.io", "httproutes"): {"get", "patch"},
    ("gateway.networking.k8s.io", "referencegrants"): {"list"},
}
CLUSTER_VERBS: dict[tuple[str, str], set[str]] = {
    ("", "nodes"): {"list", "watch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    # Authenticated /metrics (metrics.auth.enabled, the default): handlers/services/metrics_server.py.
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
}
PEERING_VERBS = {"get", "list", "watch", "patch", "create"}
# get (does it exist yet?) and patch are narrowed to the peering object's own name; list, watch and
# create cannot be.
NAMED_PEERING_VERBS = {"get", "patch"}

Grants = dict[tuple[str, str], set[str]]


def _grants(role: Manifest) -> Grants:
    grants: Grants = defaultdict(set)
    for rule in role["rules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule["resources"]:
                grants[(group, resource)] |= set(rule["verbs"])
    return dict(grants)


def _named_grants(role: Manifest) -> Grants:
    grants: Grants = defaultdict(set)
    for rule in role["rules"]:
        if "resourceNames" in rule:
            assert rule["resourceNames"] == ["specdec-operator"]
            for resource in rule["resources"]:
                grants[(rule["apiGroups"][0], resource)] |= set(rule["verbs"])
    return dict(grants)


def _bound_roles(manifests: list[Manifest], binding_kind: str) -> list[Manifest]:
    """Roles of `binding_kind` bindings whose subject is the chart's ServiceAccount, resolved to the roles."""
    account = one(manifests, "ServiceAccount")["metadata"]["name"]
    roles = {(role["kind"], role["metadata"].get("namespace"), role["metadata"]["name"]): role for role in manifests}
    bound = []
    for binding in of_kind(manifests, binding_kind):
        if binding["roleRef"]["name"].endswith("-metrics-reader"):
            continue  # who may read /metrics: never the operator's own account (test_metrics_reader_*)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}]
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        bound.append(roles[(ref["kind"], namespace, ref["name"])])
    return bound


def _all_rules(manifests: list[Manifest]) -> list[dict[str, list[str]]]:
    return [rule for kind in ("ClusterRole", "Role") for role in of_kind(manifests, kind) for rule in role["rules"]
            if "nonResourceURLs" not in rule]


def test_metrics_reader_grants_get_on_metrics_only(default_manifests: list[Manifest]) -> None:
    readers = [r for r in of_kind(default_manifests, "ClusterRole")
               if r["metadata"]["name"].endswith("-metrics-reader")]
    assert [r["rules"] for r in readers] == [[{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]]


@pytest.mark.parametrize("fixture", ["default_manifests", "namespaced_manifests"])
def test_no_wildcards_and_no_secrets(fixture: str, request: pytest.FixtureRequest) -> None:
    for rule in _all_rules(request.getfixturevalue(fixture)):
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert "secrets" not in rule["resources"]
        assert not {"escalate", "bind", "impersonate", "deletecollection", "update"} & set(rule["verbs"]), rule


def test_cluster_wide_install_grants_exactly_the_operators_verbs(default_manifests: list[Manifest]) -> None:
    cluster_roles = _bound_roles(default_manifests, "ClusterRoleBinding")
    assert of_kind(default_manifests, "Role") == []
    merged: Grants = defaultdict(set)
    for role in cluster_roles:
        for key, verbs in _grants(role).items():
            merged[key] |= verbs
    expected = {**WORKLOAD_VERBS, **CLUSTER_VERBS, ("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS}
    assert dict(merged) == expected
    named = {key: verbs for role in cluster_roles for key, verbs in _named_grants(role).items()}
    assert named == {("kopf.dev", "clusterkopfpeerings"): NAMED_PEERING_VERBS}


def test_watching_namespaces_keeps_workload_rights_inside_them(namespaced_manifests: list[Manifest]) -> None:
    roles = _bound_roles(namespaced_manifests, "RoleBinding")
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _grants(role) == {**WORKLOAD_VERBS, ("kopf.dev", "kopfpeerings"): PEERING_VERBS}
        assert _named_grants(role) == {("kopf.dev", "kopfpeerings"): NAMED_PEERING_VERBS}
    (cluster_role,) = _bound_roles(namespaced_manifests, "ClusterRoleBinding")
    # Nodes and CRDs are cluster-scoped, so a ClusterRole stays; it grants nothing else.
    assert _grants(cluster_role) == CLUSTER_VERBS


def test_standalone_install_has_no_peering_rights(helm: str) -> None:
    manifests = render(helm, "peering.enabled=false", "replicaCount=1", "watchNamespaces={team-a}")
    for rule in _all_rules(manifests):
        assert "kopf.dev" not in rule["apiGroups"]
