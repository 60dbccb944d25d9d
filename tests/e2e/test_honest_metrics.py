"""Honest series, end to end: the chart installs with the Prometheus Operator's CRDs present (its
PrometheusRule, PodMonitor and ServiceMonitor accepted by the real API server), two peered operators
run, a model is deleted and the leader is killed; then both replicas' /metrics are read: no series of the
deleted model, none from the standby, exactly one replica with specdec_active 1.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.helm import Helm, Release, unique_name
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.test_ha import PEERING_LIFETIME_S, TAKEOVER_SLACK_S

pytestmark = [pytest.mark.e2e, pytest.mark.long]

KEPT, DELETED = "kept", "deleted"


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
        processes = [OperatorProcess(cluster, name=f"operator-{release.name}-{replica}", SPECDEC_STANDALONE="false",
                                     SPECDEC_NAMESPACES=json.dumps([namespace])) for replica in ("a", "b")]
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

    # A replica that starts alone acts until it sees its peer; the verdict must hold for a while.
    leader = wait_for("exactly one replica acting, the same one 5 s apart", lambda: _stable_leader(processes), 90)
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
    leader.start()
    # The restarted replica draws a new random priority (cli.py): half the time it outranks the survivor and
    # takes over again, which pauses the survivor. Either way the end state is one replica acting with the
    # kept model's series and one standing by with none.
    # Settled: the same replica acts 5 s apart (under load the restarted replica can act alone for a moment
    # before its first keep-alive shows it the survivor).
    acting = wait_for("one replica acts again and exports the kept model, the same one 5 s apart",
                      lambda: _stable(lambda: _settled(processes)), 120, 2)
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


def _stable(verdict: Callable[[], OperatorProcess | None]) -> OperatorProcess | None:
    """The replica `verdict` names, if it names the same one again 5 s later."""
    first = verdict()
    if first is None:
        return None
    time.sleep(5)
    return first if verdict() is first else None


def _stable_leader(processes: list[OperatorProcess]) -> OperatorProcess | None:
    def one_acting() -> OperatorProcess | None:
        verdicts = sorted(((active(process) or 0, process.name, process) for process in processes),
                          key=lambda item: item[:2])
        return verdicts[-1][2] if [v for v, _, _ in verdicts] == [0, 1] else None

    return _stable(one_acting)
