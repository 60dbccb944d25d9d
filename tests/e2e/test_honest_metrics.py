"""Honest series, end to end: the chart installs with the Prometheus Operator's CRDs present (its
PrometheusRule, PodMonitor and ServiceMonitor accepted by the real API server), two peered operators
run, a model is deleted and the leader is killed; then both replicas' /metrics are read: no series of the
deleted model, none from the standby, exactly one replica with specdec_active 1.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.helm import Helm, Release, unique_name
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.test_ha import PEERING_LIFETIME_S, TAKEOVER_SLACK_S

pytestmark = [pytest.mark.e2e, pytest.mark.long]

KEPT, DELETED = "kept", "deleted"
PEERING = "specdec-operator"  # the operator's peering_name: a KopfPeering in each namespace it watches


def _model(name: str) -> dict[str, object]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            "speculation": {"initialK": 3, "minK": 1, "maxK": 8,
                            "autotune": {"intervalSeconds": 15, "minSamples": 100, "cooldownSeconds": 60}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 1},
            "runtime": {"simulatorProfile": "quick"},
        },
    }


def model_series(process: OperatorProcess, model: str | None = None) -> list[str]:
    """Samples of /metrics labelled with a model (any model when None)."""
    samples = process.metrics() or {}
    return [key for key in samples if ("model=" in key) and (model is None or f"model={model}," in key
                                                               or key.endswith(f"model={model}}}"))]


def active(process: OperatorProcess) -> float | None:
    return (process.metrics() or {}).get("specdec_active{}")


@pytest.fixture
def pair(cluster: LocalCluster, crds: None, monitoring_crds: None, operator: OperatorProcess,
         namespace: str) -> Iterator[tuple[Release, list[OperatorProcess]]]:
    values = {"watchNamespaces": [namespace], "replicaCount": 1,
              "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                          "prometheusRule": {"enabled": True}}}
    release = Release(Helm(cluster), unique_name("honest"), unique_name("e2e-honest-sys"), values)
    operator.stop()
    processes: list[OperatorProcess] = []
    try:
        release.install()
        # POD_ID: kopf's peer identity, as the chart sets it, so the peering object names each process.
        processes = [OperatorProcess(cluster, name=name, SPECDEC_STANDALONE="false", POD_ID=name,
                                     SPECDEC_NAMESPACES=json.dumps([namespace]))
                     for name in (f"operator-{release.name}-{replica}" for replica in ("a", "b"))]
        for process in processes:
            process.start()
        yield release, processes
    finally:
        for process in processes:
            process.stop()
        operator.start()
        release.cleanup()


def test_no_series_of_deleted_models_none_from_the_standby_and_one_active_replica(
    kube: Kube, pair: tuple[Release, list[OperatorProcess]], fleet_driver: FleetDriverProcess
) -> None:
    release, processes = pair
    kinds = {doc["kind"] for doc in release.manifest()}
    assert {"PrometheusRule", "PodMonitor", "ServiceMonitor"} <= kinds
    for kind in ("prometheusrule", "podmonitor", "servicemonitor"):
        assert kube.cluster.kubectl("get", kind, "-n", release.namespace, "-o", "name").strip(), kind

    # A replica that starts alone acts until it sees its peer: settled once both have announced themselves.
    leader = wait_for("both replicas in the peering object, the higher priority acting, the other standing by",
                      lambda: _acting_by_priority(kube, processes), 90, 1)
    (standby,) = [process for process in processes if process is not leader]
    kube.apply([_model(KEPT), _model(DELETED)])
    wait_for("the leader exports both models' series",
             lambda: model_series(leader, KEPT) and model_series(leader, DELETED), 150, 2)
    assert model_series(standby) == [], model_series(standby)[:5]

    kube.run("delete", "sm", DELETED, "--wait=true", "--timeout=60s")
    wait_for("the deleted model's series gone from the leader", lambda: not model_series(leader, DELETED), 30)
    assert model_series(leader, KEPT)

    leader.stop(signal.SIGKILL)
    killed = time.monotonic()
    wait_for("the standby takes over", lambda: active(standby) == 1, PEERING_LIFETIME_S + TAKEOVER_SLACK_S, 0.5)
    print(f"\nfailover: specdec_active=1 on the standby {time.monotonic() - killed:.1f}s after kill -9")
    restarted = datetime.now(UTC)
    leader.start()
    # The restarted replica draws a new random priority (cli.py): half the time it outranks the survivor and
    # takes over again, which pauses the survivor. Either way the end state is one replica acting with the
    # kept model's series and one standing by with none. Its entry in the peering object is this run's once its
    # lastseen is past the restart (until then it is the killed process's).
    acting = wait_for("one replica acts again by priority and exports the kept model",
                      lambda: (found := _acting_by_priority(kube, processes, (leader, restarted)))
                      and _settled(processes) and found, 120, 1)
    print(f"after the restart {acting.name} acts (the {'survivor' if acting is standby else 'restarted replica'})")

    both = {process.name: process.metrics() or {} for process in processes}
    assert sorted(active(p) for p in processes) == [0, 1], {n: m.get("specdec_active{}") for n, m in both.items()}
    (idle,) = [process for process in processes if process is not acting]
    assert model_series(idle) == [], model_series(idle)[:5]  # the standby exports no model series
    assert model_series(acting, DELETED) == []
    assert model_series(acting, KEPT)
    assert all("model=" not in key or f"namespace={kube.namespace}" in key for key in both[acting.name])


def _settled(processes: list[OperatorProcess]) -> OperatorProcess | None:
    """The acting replica once exactly one acts, it exports the kept model and the other no model at all."""
    verdicts = [(active(process), process) for process in processes]
    acting = [process for verdict, process in verdicts if verdict == 1]
    idle = [process for verdict, process in verdicts if verdict == 0]
    if len(acting) != 1 or len(idle) != 1:
        return None
    return acting[0] if model_series(acting[0], KEPT) and not model_series(idle[0]) else None


def _acting_by_priority(kube: Kube, processes: list[OperatorProcess],
                        restarted: tuple[OperatorProcess, datetime] | None = None) -> OperatorProcess | None:
    """The replica that acts once the pair settled: both have announced themselves in the peering object (a
    `restarted` one since its restart: until then its entry is the killed process's), the one with the higher
    priority acts and the other stands by. Kopf never pauses the highest live peer nor resumes one below it, so
    the verdict holds until a peer leaves: nothing to watch for a while."""
    text = kube.run("get", "kopfpeering", PEERING, "-o", "json", check=False)
    peers = (json.loads(text).get("status") or {}) if text else {}
    fresh = {name: peer for name, peer in peers.items() if isinstance(peer, dict) and "priority" in peer}
    if restarted is not None and restarted[0].name in fresh and \
            datetime.fromisoformat(fresh[restarted[0].name]["lastseen"]) < restarted[1]:
        del fresh[restarted[0].name]
    if set(fresh) != {process.name for process in processes}:
        return None
    top = max(processes, key=lambda process: int(fresh[process.name]["priority"]))
    standing_by = all(active(process) == 0 for process in processes if process is not top)
    return top if active(top) == 1 and standing_by else None
