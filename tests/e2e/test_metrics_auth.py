"""The operator's /metrics with authentication on (the chart's default, metrics.auth.enabled): an unauthenticated
GET is refused, a ServiceAccount without the metrics-reader grant is forbidden, and one bound to it scrapes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.kube import Kube
from tests.e2e.operator_process import OperatorProcess


def get_metrics(port: int, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def reader_role(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    """The chart's metrics-reader ClusterRole (templates/rbac.yaml), bound to a `scraper` ServiceAccount."""
    role = f"metrics-reader-{namespace}"
    objects = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
         "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}]},
    ]
    for account in ("scraper", "stranger"):
        cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    yield role
    cluster.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)


def test_metrics_refuse_unauthenticated_and_unauthorized_requests_and_serve_the_reader(
    cluster: LocalCluster, kube: Kube, namespace: str, reader_role: str
) -> None:
    scraper = cluster.kubectl("create", "token", "scraper", "-n", namespace).strip()
    stranger = cluster.kubectl("create", "token", "stranger", "-n", namespace).strip()
    # Watches only this test's namespace, which holds no model: it acts on nothing the session operator owns.
    process = OperatorProcess(cluster, f"operator-{namespace}-metrics-auth", None,
                              SPECDEC_NAMESPACES=json.dumps([namespace]), SPECDEC_METRICS_AUTH="true")
    process.metrics_token = scraper
    try:
        process.start()  # waits until the scraper's token reads /metrics
        status, body = get_metrics(process.metrics_port, None)
        assert status == 401 and "bearer token is required" in body, (status, body)
        status, body = get_metrics(process.metrics_port, "not-a-token")
        assert status == 401 and "not authenticated" in body, (status, body)
        status, body = get_metrics(process.metrics_port, stranger)
        assert status == 403 and f"system:serviceaccount:{namespace}:stranger may not get /metrics" in body, body
        status, body = get_metrics(process.metrics_port, scraper)
        assert status == 200 and "specdec_reconcile" in body, (status, body[:200])
    finally:
        process.stop()
