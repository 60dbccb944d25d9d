"""RBAC proven: the operator runs as the chart's ServiceAccount, with a TokenRequest token, and still works.

The chart is installed watching one namespace, so its namespaced rules land in a Role there. The
operator process then authenticates with a token for the chart's ServiceAccount instead of the admin
certificate, and the placement and tuning scenarios run under that identity. Whatever the role leaves
out (Secrets, other namespaces) the API server refuses with 403.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.cluster import LocalCluster
from tests.e2e.audit import AuditEntry
from tests.e2e.helm import REPO, Helm, Release, unique_name
from tests.e2e.kube import Kube, wait_for
from tests.e2e.lanes import DEMO_FLEET_EXAMPLES
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.tier import period

# One lane for the whole file (its module fixture installs one Helm release and one ServiceAccount operator for
# every test here), the lane of the tests that apply the shipped examples (tests/e2e/lanes.py).
pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.xdist_group(DEMO_FLEET_EXAMPLES)]

TOKEN_TTL = "1h"


@dataclass
class ServiceAccountOperator:
    """The operator process acting as the chart's ServiceAccount in one watched namespace."""

    workload_namespace: str
    release: Release
    account: str
    token: str
    kubeconfig: Path
    process: OperatorProcess

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.release.namespace}:{self.account}"

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        kubectl = self.release.helm.cluster.binaries["kubectl"]
        return subprocess.run([str(kubectl), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=30, check=False)


def token_kubeconfig(cluster: LocalCluster, user: str, token: str, path: Path) -> Path:
    """The admin kubeconfig's server and CA, with a bearer token instead of the admin client certificate."""
    admin = yaml.safe_load(cluster.paths.kubeconfig.read_text())
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": admin["clusters"][0]["name"], "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def api_get_status(cluster: LocalCluster, path: str, token: str) -> int:
    """HTTP status of a GET on the API server (loopback only) with a bearer token."""
    admin = yaml.safe_load(cluster.paths.kubeconfig.read_text())["clusters"][0]["cluster"]
    assert admin["server"].startswith("https://127.0.0.1:"), admin["server"]
    context = ssl.create_default_context(cafile=admin["certificate-authority"])
    request = urllib.request.Request(admin["server"] + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture(scope="module")
def sa_operator(cluster: LocalCluster, crds: None, operator: OperatorProcess) -> Iterator[ServiceAccountOperator]:
    workload = unique_name("e2e-rbac")
    cluster.kubectl("create", "namespace", workload)
    release = Release(Helm(cluster), unique_name("rbac"), unique_name("e2e-rbac-sys"),
                      # One replica: the chart's pod lands on a KWOK node and never runs; the process below
                      # stands in for it with the same ServiceAccount.
                      {"watchNamespaces": [workload], "replicaCount": 1,
                       # A Prometheus scraping with its own ServiceAccount's token: the documented reader binding.
                       "metrics": {"auth": {"readers": [
                           {"kind": "ServiceAccount", "name": "prometheus", "namespace": workload}]}}})
    # The session operator acts cluster-wide without peering and would race the ServiceAccount's operator.
    operator.stop()
    process: OperatorProcess | None = None
    try:
        release.install()
        account = next(o for o in release.manifest() if o["kind"] == "ServiceAccount")["metadata"]["name"]
        token = cluster.kubectl("create", "token", account, "-n", release.namespace, f"--duration={TOKEN_TTL}").strip()
        kubeconfig = token_kubeconfig(cluster, account, token, cluster.paths.root / f"kubeconfig-{release.name}")
        cluster.kubectl("create", "serviceaccount", "prometheus", "-n", workload)
        # As the chart runs it: peered (it creates its KopfPeering in the namespace), not standalone, and
        # serving /metrics to authenticated readers only (metrics.auth.enabled, the chart's default).
        process = OperatorProcess(cluster, name=f"operator-{release.name}", kubeconfig=kubeconfig,
                                  SPECDEC_NAMESPACES=json.dumps([workload]), SPECDEC_STANDALONE="false",
                                  SPECDEC_METRICS_AUTH="true")
        process.metrics_token = cluster.kubectl("create", "token", "prometheus", "-n", workload).strip()
        process.start()  # returns once the Prometheus token has read /metrics
        yield ServiceAccountOperator(workload, release, account, token, kubeconfig, process)
    finally:
        if process is not None:
            process.stop()
        operator.start()
        cluster.kubectl("delete", "namespace", workload, "--wait=false", check=False)
        release.cleanup()


@pytest.fixture
def sa_kube(cluster: LocalCluster, sa_operator: ServiceAccountOperator) -> Kube:
    return Kube(cluster, sa_operator.workload_namespace)


def _ready(kube: Kube, name: str) -> dict[str, Any] | None:
    conditions = kube.get("sm", name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "Ready" and c["status"] == "True"), None)


def _operator_writes(cluster: LocalCluster, namespace: str) -> list[AuditEntry]:
    """Every operator write into `namespace`, from the audit log."""
    writes = []
    for line in (cluster.paths.logs / "audit.log").read_text(errors="replace").splitlines():
        raw = json.loads(line)
        if raw.get("stage") == "ResponseComplete":
            entry = AuditEntry.parse(raw)
            if entry.namespace == namespace and entry.by_operator:
                writes.append(entry)
    return writes


def test_the_chart_grants_a_role_in_the_watched_namespace_only(sa_operator: ServiceAccountOperator) -> None:
    kinds = {(o["kind"], o["metadata"].get("namespace")) for o in sa_operator.release.manifest()}
    workload = sa_operator.workload_namespace
    assert ("Role", workload) in kinds and ("RoleBinding", workload) in kinds
    assert ("ClusterRole", None) in kinds  # nodes, CRDs: cluster-scoped by nature
    whoami = json.loads(sa_operator.kubectl("auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["username"] == sa_operator.username


def test_placement_under_the_service_account(cluster: LocalCluster, sa_operator: ServiceAccountOperator,
                                             sa_kube: Kube) -> None:
    sa_kube.apply((REPO / "examples" / "ngram-w7900.yaml").read_text())

    def running_pods() -> list[dict[str, Any]] | None:
        pods = [pod for pod in sa_kube.items("pods", "specdec.io/pool=qwen-coder-ngram-gfx1100")
                if pod["status"].get("phase") == "Running"]
        return pods if len(pods) == 2 else None

    pods = wait_for("2 Running qwen-coder-ngram pods", running_pods, 90)
    assert all(pod["spec"]["nodeName"].startswith("w7900-") for pod in pods), [p["spec"]["nodeName"] for p in pods]
    assert wait_for("qwen-coder-ngram Ready", lambda: _ready(sa_kube, "qwen-coder-ngram"), 60)["reason"] == "PoolsReady"
    # Every write the operator made here was the ServiceAccount's, and the API server accepted all of them.
    writes = _operator_writes(cluster, sa_operator.workload_namespace)
    assert writes and {w.user for w in writes} == {sa_operator.username}, writes
    # Losing a race is optimistic concurrency doing its job, never a permission issue: our status writes carry
    # a resourceVersion precondition (409), and kopf's finalizer JSON patch tests the resourceVersion (422)
    # when our status write lands first. Both are re-read and retried.
    refused = [(w.verb, w.resource, w.subresource, w.code, w.message) for w in writes
               if w.code >= 400 and not w.lost_a_race]
    assert not refused, refused


def test_tuning_under_the_service_account(sa_operator: ServiceAccountOperator, sa_kube: Kube,
                                          fleet_driver: FleetDriverProcess) -> None:
    sa_kube.apply({
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": "tuned"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            # What is tested is that tuning works under the chart's Role, not the tuner's pace: the fast tier's
            # periods (test_tuner.py's), the production-like ones in the thorough tier.
            "speculation": {"initialK": 5, "minK": 0, "maxK": 10,
                            "autotune": {"intervalSeconds": int(period(fast=5, thorough=15)), "minSamples": 2000,
                                         "cooldownSeconds": int(period(fast=20, thorough=60))}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 2},
            "runtime": {"simulatorProfile": "e2e-opt-k2"},
        },
    })

    def effective_k() -> int | None:
        pools = sa_kube.get("sm", "tuned").get("status", {}).get("pools", [])
        return pools[0]["effectiveK"] if pools else None

    wait_for("K tuned from 5 to the profile's optimum 2", lambda: effective_k() == 2, 240, 2)
    decision = sa_kube.get("sm", "tuned")["status"]["speculation"]["lastDecision"]
    assert decision["toK"] == 2, decision
    assert sa_operator.process.total("specdec_scrapes_total") > 0


def test_actions_outside_the_role_are_forbidden(cluster: LocalCluster, sa_operator: ServiceAccountOperator) -> None:
    workload = sa_operator.workload_namespace
    allowed = sa_operator.kubectl("auth", "can-i", "patch", "deployments", "-n", workload)
    assert allowed.stdout.strip() == "yes", allowed
    for verb, resource, namespace in (("get", "secrets", "kube-system"), ("list", "secrets", workload),
                                      ("create", "deployments", "default"), ("delete", "nodes", None)):
        scope = ["-n", namespace] if namespace else []
        answer = sa_operator.kubectl("auth", "can-i", verb, resource, *scope)
        assert (answer.returncode, answer.stdout.strip()) == (1, "no"), (verb, resource, namespace, answer)
    # Not just the authorizer's opinion: the real requests come back 403.
    assert api_get_status(cluster, "/api/v1/namespaces/kube-system/secrets", sa_operator.token) == 403
    assert api_get_status(cluster, "/api/v1/namespaces/default/configmaps", sa_operator.token) == 403
    denied = sa_operator.kubectl("get", "secrets", "-n", "default")
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied
    # ...while the same token reads what the role grants.
    assert api_get_status(cluster, f"/api/v1/namespaces/{workload}/pods", sa_operator.token) == 200


def test_the_operator_never_hits_a_403(sa_operator: ServiceAccountOperator) -> None:
    """Runs after the scenarios above: nothing the operator did needed more than the role grants."""
    log = sa_operator.process.log_path.read_text(errors="replace")
    assert "Forbidden" not in log, [line[:200] for line in log.splitlines() if "Forbidden" in line][:3]


@pytest.mark.parametrize("resource", ["configmaps", "services", "deployments.apps"])
def test_nothing_outside_the_watched_namespace_can_be_touched(
    cluster: LocalCluster, sa_operator: ServiceAccountOperator, resource: str
) -> None:
    """ConfigMaps, Services and Deployments the operator does not own, outside its namespaces: no verb at all."""
    outside = unique_name("e2e-rbac-outside")
    cluster.kubectl("create", "namespace", outside)
    try:
        cluster.kubectl("create", "configmap", "platform-config", "-n", outside, "--from-literal=a=b")
        for verb in ("get", "list", "watch", "create", "patch", "update", "delete"):
            answer = sa_operator.kubectl("auth", "can-i", verb, resource, "-n", outside)
            assert (answer.returncode, answer.stdout.strip()) == (1, "no"), (verb, resource, answer)
        # Real requests, not only the authorizer's opinion: read and overwrite attempts come back Forbidden.
        path = {"configmaps": "/api/v1/namespaces/{ns}/configmaps", "services": "/api/v1/namespaces/{ns}/services",
                "deployments.apps": "/apis/apps/v1/namespaces/{ns}/deployments"}[resource].format(ns=outside)
        assert api_get_status(cluster, path, sa_operator.token) == 403
        patched = sa_operator.kubectl("patch", "configmap", "platform-config", "-n", outside, "--type=merge",
                                      "-p", '{"data":{"a":"operator-was-here"}}')
        assert patched.returncode != 0 and "Forbidden" in patched.stderr, patched
        assert json.loads(cluster.kubectl("get", "configmap", "platform-config", "-n", outside,
                                          "-o", "json"))["data"] == {"a": "b"}
    finally:
        cluster.kubectl("delete", "namespace", outside, "--wait=false", check=False)


def test_the_role_grants_only_what_the_chart_declares(sa_operator: ServiceAccountOperator) -> None:
    """The verbs dropped as unused really are absent in the watched namespace (and the rest present)."""
    workload = sa_operator.workload_namespace
    expectations = {
        ("get", "pods"): "no", ("watch", "httproutes.gateway.networking.k8s.io"): "no",
        # get: an owned kind's object not in the cache as the model's is read once before its first apply, so
        # one someone else made under the same name is never taken over (ObjectNotOwned, kube/api.py).
        ("get", "configmaps"): "yes", ("get", "services"): "yes", ("get", "deployments.apps"): "yes",
        ("list", "pods"): "yes", ("watch", "pods"): "yes",  # the runtime-pod and GPU-claim pod indices
        # kopf's indices of owned objects: the reconcile reads these caches instead of listing
        ("watch", "deployments.apps"): "yes", ("watch", "configmaps"): "yes", ("watch", "services"): "yes",
        ("watch", "poddisruptionbudgets.policy"): "yes", ("patch", "speculativemodels.specdec.io"): "yes",
    }
    for (verb, resource), expected in expectations.items():
        answer = sa_operator.kubectl("auth", "can-i", verb, resource, "-n", workload)
        assert answer.stdout.strip() == expected, (verb, resource, answer.stdout)


def test_metrics_refuse_an_unauthenticated_get_and_serve_the_documented_reader(
    sa_operator: ServiceAccountOperator,
) -> None:
    # The chart's RBAC lets the operator's ServiceAccount review tokens; the reader binding lets Prometheus in.
    port = sa_operator.process.metrics_port
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            status = int(response.status)
    except urllib.error.HTTPError as error:
        status = error.code
    assert status == 401
    samples = sa_operator.process.metrics()
    assert samples is not None and any(name.startswith("specdec_") for name in samples), samples
