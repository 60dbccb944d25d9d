"""Session-scoped local control plane and a fresh namespace per test, on the same code as hack/cluster."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.build import prometheus_operator_crd_files
from localcluster.cluster import LocalCluster
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorFactory, OperatorProcess

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster()
    started_here = not local.is_ready()
    local.up()
    os.environ["KUBECONFIG"] = str(local.paths.kubeconfig)
    os.environ["PATH"] = f"{local.binaries['kubectl'].parent}{os.pathsep}{os.environ['PATH']}"
    yield local
    if started_here and os.environ.get("SPECDEC_KEEP_CLUSTER") != "1":
        local.down()


@pytest.fixture(scope="session")
def crds(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/speculativemodels.specdec.io", "--timeout=30s")


@pytest.fixture(scope="session")
def operator(cluster: LocalCluster, crds: None) -> Iterator[OperatorProcess]:
    """One operator for the session; tests that restart it use their own OperatorProcess."""
    process = OperatorProcess(cluster).start()
    yield process
    process.stop()


@pytest.fixture
def scoped_operator(cluster: LocalCluster, crds: None, operator: OperatorProcess,
                    namespace: str) -> Iterator[OperatorFactory]:
    """Starts operators of this test's own, watching only its namespace, with the settings it names
    (`scoped_operator(SPECDEC_STATUS_STATS_PERIOD_SECONDS="10")`): the fast pattern for a test that waits out
    an operator period. The session operator stops meanwhile (a second one would act on the same models) and
    comes back afterwards. docs/testing.md."""
    started: list[OperatorProcess] = []

    def start(**settings: str) -> OperatorProcess:
        if not started:
            operator.stop()
        process = OperatorProcess(cluster, f"operator-{namespace}-{len(started)}", None,
                                  SPECDEC_NAMESPACES=json.dumps([namespace]), **settings)
        started.append(process)
        return process.start()

    try:
        yield start
    finally:
        for process in started:
            process.stop()
        if started:
            operator.start()


@pytest.fixture(scope="session")
def fleet_driver(cluster: LocalCluster) -> Iterator[FleetDriverProcess]:
    driver = FleetDriverProcess(cluster).start()
    yield driver
    driver.stop()


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:40].strip("-")
    name = f"e2e-{base}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(f"default ServiceAccount in {name}",
             lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False), 30)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def kube(cluster: LocalCluster, namespace: str, crds: None) -> Kube:
    return Kube(cluster, namespace)


@pytest.fixture
def monitoring_crds(cluster: LocalCluster) -> None:
    """The Prometheus Operator's PrometheusRule, PodMonitor and ServiceMonitor CRDs, from its module."""
    for path in prometheus_operator_crd_files():
        if path.name.split("_")[1] in ("prometheusrules.yaml", "podmonitors.yaml", "servicemonitors.yaml"):
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for crd in ("prometheusrules", "podmonitors", "servicemonitors"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.monitoring.coreos.com", "--timeout=30s")
