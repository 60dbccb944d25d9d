"""SIGTERM and SIGINT stop the operator promptly, as a kubelet's stop or a Ctrl+C expects.

The operator runs as the chart runs it (peering on, kopf's peering CRDs from the chart), with no model. It
gets the signal as a kubelet sends it (to the process), with the API server up, and with the API server
stopped right after the signal (an upgrade of the control plane, a lost node). The bounds are the
acceptance bounds, checked as a process wait with a timeout; the measured exit time is printed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.helm import Helm, existing_peering_crds, unique_name
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorProcess

# Exclusive: stops kube-apiserver while the operator shuts down.
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

EXIT_BOUND_S = {"up": 5.0, "stopped": 10.0}


@pytest.fixture(scope="module")
def peering_crds(cluster: LocalCluster) -> None:
    """kopf's peering CRDs as the chart renders them, unless another release installed them already."""
    if existing_peering_crds(cluster):
        return
    manifests = Helm(cluster).template(unique_name("shutdown"), "default", {"clusterWide": True})
    crds = [m for m in manifests if m["kind"] == "CustomResourceDefinition" and m["spec"]["group"] == "kopf.dev"]
    assert len(crds) == 2
    for crd in crds:
        cluster.kubectl("apply", "--server-side", "-f", "-", input_text=json.dumps(crd))
        cluster.wait_crd_established(crd["metadata"]["name"])


def _live_peers(kube: Kube) -> int:
    peering = kube.run("get", "kopfpeering", "specdec-operator", "-o", "json", check=False)
    return len(json.loads(peering).get("status") or {}) if peering else 0


@pytest.mark.parametrize("api_server", ["up", "stopped"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_the_operator_promptly(
    cluster: LocalCluster, kube: Kube, peering_crds: None, sig: signal.Signals, api_server: str,
) -> None:
    assert kube.namespace is not None
    own = OperatorProcess(cluster, name=f"operator-{kube.namespace}", SPECDEC_STANDALONE="false",
                          SPECDEC_NAMESPACES=json.dumps([kube.namespace]))
    own.start()
    stopper: threading.Thread | None = None
    try:
        assert own.process is not None
        wait_for("its keep-alive in the peering object", lambda: _live_peers(kube) == 1, 60)
        wait_for("its handlers running (it acts: specdec_active 1)", lambda: own.total("specdec_active") == 1, 90)
        signalled = time.monotonic()
        own.process.send_signal(sig)  # as the kubelet does: to the process, not to its group
        if api_server == "stopped":
            stopper = threading.Thread(target=cluster.stop_component, args=("kube-apiserver", signal.SIGKILL))
            stopper.start()
        try:
            own.process.wait(EXIT_BOUND_S[api_server])
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {time.monotonic() - signalled:.1f}s after {sig.name} with the API server "
                        f"{api_server}; log tail:\n{own.log_tail(60)}")
        exited_s = time.monotonic() - signalled
        print(f"\n{sig.name}, API server {api_server}: exited in {exited_s:.2f}s (rc {own.process.returncode})")
        log = own.log_path.read_text(errors="replace")
        assert f"{sig.name} received: the operator stops" in log  # the graceful path, not a kill
        if api_server == "up":
            # It said goodbye: a standby would take over now, not a peering lifetime later.
            assert _live_peers(kube) == 0, own.log_tail(60)
    finally:
        own.stop(signal.SIGKILL)
        if stopper is not None:
            stopper.join()
            cluster.start_component("kube-apiserver")
