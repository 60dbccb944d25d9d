"""Session-scoped local control plane and a fresh namespace per test, on the same code as hack/cluster.

Lanes (pytest-xdist, `-n N`): every worker is a lane with its own session operator watching only its own
namespaces (`e2e-<lane>-*`), so lanes share the cluster without acting on each other's models. The fleet driver
is one per cluster (a kubelet serves every pod): the first lane that needs it starts it. Tests marked
`exclusive` disturb the whole cluster (a control-plane restart, a CRD upgrade, the chart's cluster-scoped
objects) and refuse to run in a lane; hack/test runs them one by one on a second cluster of their own, beside
the lanes. docs/testing.md.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.build import prometheus_operator_crd_files
from localcluster.cluster import LocalCluster
from tests.e2e.kube import Kube, reader, wait_for
from tests.e2e.lanes import DEMO_FLEET_EXAMPLES, LANE, NAMESPACE_PREFIX
from tests.e2e.operator_process import FleetDriverProcess, OperatorFactory, OperatorProcess

# How long a demo-fleet test's namespace may take to go (its pods drain first: docs/runtime-pods.md).
EXAMPLES_RELEASED_S = 180

REPO = Path(__file__).resolve().parents[2]


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    exclusive = [item.nodeid for item in items if item.get_closest_marker("exclusive")]
    if LANE and exclusive:
        raise pytest.UsageError(
            f"{len(exclusive)} exclusive e2e test(s) selected in lane {LANE} (e.g. {exclusive[0]}): they disturb "
            "every lane; run them without -n, or deselect them with -m 'not exclusive' (hack/test does both)")
    # Long tests first (a stable sort: the same order in every lane, as xdist requires), so that lanes hand them
    # out before the short ones and end together instead of waiting on one long test started last.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster()
    local.paths.root.mkdir(parents=True, exist_ok=True)
    with (local.paths.root / "e2e-up.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # lanes start together; one of them brings the cluster up
        started_here = not local.is_ready()
        local.up()
    os.environ["KUBECONFIG"] = str(local.paths.kubeconfig)
    os.environ["PATH"] = f"{local.binaries['kubectl'].parent}{os.pathsep}{os.environ['PATH']}"
    yield local
    # Another lane may still be running: lanes leave the cluster to whoever started the run (hack/test).
    if started_here and not LANE and os.environ.get("SPECDEC_KEEP_CLUSTER") != "1":
        local.down()


@pytest.fixture(scope="session")
def crds(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    cluster.wait_crd_established("speculativemodels.specdec.io")


@pytest.fixture(scope="session")
def operator(cluster: LocalCluster, crds: None, fleet_driver: FleetDriverProcess) -> Iterator[OperatorProcess]:
    """One operator for the session (in a lane: for the lane's namespaces only); tests that restart it use
    their own OperatorProcess."""
    lane = {"SPECDEC_NAMESPACES": json.dumps([f"{NAMESPACE_PREFIX}*"])} if LANE else {}
    process = OperatorProcess(cluster, f"operator-{LANE}" if LANE else "operator", **lane).start()
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
        # Its namespace unless the test names its own scope (a pattern, say).
        scope = {"SPECDEC_NAMESPACES": json.dumps([namespace]), **settings}
        process = OperatorProcess(cluster, f"operator-{namespace}-{len(started)}", None, **scope)
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
    """The kubelet stand-in, one per cluster. A plain run stops the one it started; lanes leave it to the
    cluster's teardown (hack/cluster down stops every process it has a pid file for), as another lane may
    still be using it."""
    driver = FleetDriverProcess(cluster)
    with (cluster.paths.pids / "fleet-driver.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = driver.running_pid() is None
        if started:
            driver.start()
    yield driver
    if started and not LANE:
        driver.stop()


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:40].strip("-")
    name = f"{NAMESPACE_PREFIX}{base}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(f"default ServiceAccount in {name}",
             lambda: reader(cluster).get("serviceaccount", "default", name, None), 30)
    yield name
    group = request.node.get_closest_marker("xdist_group")
    if group is not None and group.args[:1] == (DEMO_FLEET_EXAMPLES,):
        # The group's tests place the shipped examples on the shared demo fleet, one after another in one lane: the
        # next one finds the GPUs only once this one's pods are gone (two 70B examples' MI250X pools fill all 16).
        cluster.kubectl("delete", "namespace", name, "--wait=true", f"--timeout={EXAMPLES_RELEASED_S}s",
                        check=False)
    else:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def kube(cluster: LocalCluster, namespace: str, crds: None, fleet_driver: FleetDriverProcess) -> Kube:
    """The fleet driver is the local cluster's kubelet for runtime pods: without it none is ever Ready."""
    return Kube(cluster, namespace)


@pytest.fixture
def monitoring_crds(cluster: LocalCluster) -> None:
    """The Prometheus Operator's PrometheusRule, PodMonitor and ServiceMonitor CRDs, from its module."""
    for path in prometheus_operator_crd_files():
        if path.name.split("_")[1] in ("prometheusrules.yaml", "podmonitors.yaml", "servicemonitors.yaml"):
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for crd in ("prometheusrules", "podmonitors", "servicemonitors"):
        cluster.wait_crd_established(f"{crd}.monitoring.coreos.com")
