"""`hack/cluster restart <component>`: same flags, a new process group, and back only once it is healthy.

Real processes on loopback stand in for etcd (/health over HTTP) and kube-apiserver (/readyz over TLS with
the cluster's client certificate), so the restart's health waits are exercised as they run for real.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import certs, processes
from localcluster.__main__ import main
from localcluster.cluster import LocalCluster, Ports
from localcluster.errors import ClusterError

FAKE = str(Path(__file__).with_name("fake_component.py"))


def use_free_port_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """Point SPECDEC_CLUSTER_PORT_BASE at a base whose derived ports are all free on loopback right now."""
    for _ in range(50):
        monkeypatch.setenv("SPECDEC_CLUSTER_PORT_BASE", str(random.randrange(40_000, 60_000, 100)))
        try:
            for port in Ports.from_env().__dict__.values():
                processes.check_port_free(port, "test")
        except ClusterError:
            continue
        return
    raise AssertionError("no free port base found")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.ClusterCerts:
    return certs.generate_certs(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def cluster(tmp_path: Path, pki: certs.ClusterCerts, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    use_free_port_base(monkeypatch)
    monkeypatch.setenv("SPECDEC_CLUSTER_DIR", str(tmp_path / "cluster"))
    messages: list[str] = []
    local = LocalCluster(log=messages.append)
    etcd, apiserver = local.ports.etcd_client, local.ports.apiserver
    for directory in (local.paths.root, local.paths.logs, local.paths.pids):
        directory.mkdir(parents=True)
    shutil.copytree(pki.ca_cert.parent, local.paths.root / "pki")
    local._write_kubeconfig(pki)
    local._start("etcd", [sys.executable, FAKE, "--port", str(etcd), "--path", "/health"], (etcd,))
    local._start("kube-apiserver", [sys.executable, FAKE, "--port", str(apiserver), "--path", "/readyz",
                                    "--tls-cert", str(pki.serving_cert), "--tls-key", str(pki.serving_key),
                                    "--client-ca", str(pki.ca_cert)], (apiserver,))
    local._wait("fake kube-apiserver /readyz", "kube-apiserver", local.is_ready, 20)
    yield local
    local.down(quiet=True)


def pids(cluster: LocalCluster) -> dict[str, int]:
    return processes.running_components(cluster.paths.pids)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(("name", "component"), [("apiserver", "kube-apiserver"), ("etcd", "etcd")])
@pytest.mark.parametrize("kill", [False, True])
def test_restart_starts_the_same_command_again_and_waits_for_health(
    cluster: LocalCluster, name: str, component: str, kill: bool
) -> None:
    before = pids(cluster)
    recorded = json.loads(processes.command_file(cluster.paths.pids, component).read_text())

    seconds = cluster.restart(name, kill=kill)

    after = pids(cluster)
    assert after[component] != before[component] and not alive(before[component])
    # The other component was left alone.
    other = "etcd" if component == "kube-apiserver" else "kube-apiserver"
    assert after[other] == before[other]
    assert json.loads(processes.command_file(cluster.paths.pids, component).read_text()) == recorded
    assert cluster.is_ready() and cluster._etcd_healthy()
    assert seconds > 0


def test_restart_can_stay_down_for_a_while(cluster: LocalCluster) -> None:
    seconds = cluster.restart("etcd", down_seconds=1.0)
    assert seconds >= 1.0 and cluster._etcd_healthy()


def test_unknown_or_never_started_components_are_refused_with_the_remedy(cluster: LocalCluster) -> None:
    with pytest.raises(ClusterError, match=r"unknown component 'kubelet': one of etcd, kube-apiserver"):
        cluster.restart("kubelet")
    with pytest.raises(ClusterError, match=r"no record of how kwok was started .*is the cluster up"):
        cluster.restart("kwok")


def test_the_cli_restarts_by_short_name(cluster: LocalCluster) -> None:
    # The CLI finds the cluster from the same environment (directory and port base) as the fixture.
    before = pids(cluster)["kube-apiserver"]
    assert main(["restart", "apiserver", "--kill"]) == 0
    assert pids(cluster)["kube-apiserver"] != before and cluster.is_ready()
