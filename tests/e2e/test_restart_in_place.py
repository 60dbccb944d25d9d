"""Once its last model is gone, an operator with stranded heap restarts in place and keeps working.

The operator runs as the image runs it (glibc malloc for objects, two arenas) with a limit so low that any
stranded heap passes it: what is under test is the mechanism (kopf stops as on SIGTERM, the same process
execs its command line again, a new model is reconciled by it), not the figure, which the scale benchmark
measures. The session's operator, which would reconcile this namespace's models too, is paused meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

RESTART_LINE = "restarting in place to give memory back"
CONFIGURED_LINE = "specdec-operator configured"
# The release waits for its sampler (10 s) and a quiet period (30 s) after the last model goes.
RELEASE_WAIT_S = 90


def model(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": name, "tensorParallelSize": 1},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            "speculation": {"initialK": 3, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 1},
        },
    }


def ready(kube: Kube, name: str) -> bool:
    conditions = (kube.get("sm", name) or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture
def own_operator(cluster: LocalCluster, crds: None, operator: OperatorProcess,
                 namespace: str) -> Iterator[OperatorProcess]:
    operator.stop()
    process = OperatorProcess(
        cluster, name=f"operator-restart-{namespace}", SPECDEC_NAMESPACES=json.dumps([namespace]),
        SPECDEC_RESTART_WHEN_STRANDED_MIB="0.001", PYTHONMALLOC="malloc", MALLOC_ARENA_MAX="2",
    )
    try:
        yield process.start()
    finally:
        process.stop()
        operator.start()


def test_the_last_model_going_restarts_the_operator_in_place_once(
    kube: Kube, own_operator: OperatorProcess
) -> None:
    assert own_operator.process is not None
    pid = own_operator.process.pid
    kube.apply(model("before"))
    wait_for("the first model Ready", lambda: ready(kube, "before"), 90)
    assert RESTART_LINE not in own_operator.log_path.read_text()  # models left: never

    kube.run("delete", "sm", "before")
    wait_for("the restart in place", lambda: RESTART_LINE in own_operator.log_path.read_text(), RELEASE_WAIT_S,
             1, describe=own_operator.log_tail)
    wait_for("the operator configured again", lambda: own_operator.log_path.read_text().count(CONFIGURED_LINE) == 2,
             60, 1, describe=own_operator.log_tail)
    log = own_operator.log_path.read_text()
    after_request = log[log.index(RESTART_LINE):]
    # Kopf stopped as on SIGTERM: our cleanup handler ran before the exec.
    assert "Activity 'close' succeeded" in after_request.split(CONFIGURED_LINE)[0]
    # The same process, never exited: the kubelet would see no container restart.
    assert own_operator.process.poll() is None and own_operator.process.pid == pid
    wait_for("/metrics served again", own_operator.metrics, 30, 0.5)
    assert own_operator.total("specdec_restarts_in_place_total") == 1

    # The new process image manages models as the old one did.
    kube.apply(model("after"))
    wait_for("a model applied after the restart Ready", lambda: ready(kube, "after"), 90)
    assert own_operator.process.poll() is None
    # Once: the new process image had let no model go when its first release ran.
    assert own_operator.log_path.read_text().count(RESTART_LINE) == 1
