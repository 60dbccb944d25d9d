"""The KWOK stages the local cluster runs: runtime pods are left to the fleet driver, everything else to KWOK."""

from __future__ import annotations

import pytest
import yaml

from localcluster import build
from localcluster.errors import ClusterError
from specdec_runtime import contract

KWOK_POD_READY = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      phase: Running
"""


def test_the_runtime_label_is_the_contracts() -> None:
    assert build.RUNTIME_POD_LABEL == (contract.LABEL_NAME, contract.RUNTIME_NAME)


def test_kwoks_pod_stages_skip_runtime_pods_only() -> None:
    stage = yaml.safe_load(build.stage_without_runtime_pods(KWOK_POD_READY))
    expressions = stage["spec"]["selector"]["matchExpressions"]
    assert sorted(expressions, key=str) == sorted([
        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
        {"key": f'.metadata.labels."{contract.LABEL_NAME}"', "operator": "NotIn", "values": [contract.RUNTIME_NAME]},
    ], key=str)
    assert stage["spec"]["next"]["statusTemplate"] == "phase: Running\n"


def test_a_changed_kwok_stage_is_refused_loudly() -> None:
    with pytest.raises(ClusterError, match="changed shape"):
        build.stage_without_runtime_pods(KWOK_POD_READY.replace("    matchExpressions:\n", ""))


def test_the_runtime_pod_start_stage_gives_an_ip_and_leaves_readiness_to_the_driver() -> None:
    text = build.RUNTIME_POD_START_STAGE.format(labels='{"a": "b"}')
    stage = yaml.safe_load(text)
    selector = stage["spec"]["selector"]
    assert selector["matchLabels"] == {"a": "b"}
    assert {"key": ".status.podIP", "operator": "DoesNotExist"} in selector["matchExpressions"]
    template = stage["spec"]["next"]["statusTemplate"]
    assert "phase: Pending" in template and "podIP:" in template
    for kind in ("Ready", "ContainersReady"):
        assert f'status: "False"\n  reason: ContainersNotReady\n  type: {kind}\n' in template
    assert "ready: false" in template and "reason: ContainerCreating" in template


def test_runtime_pods_are_deleted_by_kwok_only_when_their_grace_period_ends() -> None:
    """Without a fleet driver to terminate them, runtime pods stay Terminating until their deletionTimestamp, as on
    a node whose kubelet kills what still runs then; KWOK's own pod-delete stage no longer matches them."""
    stage = yaml.safe_load(build.RUNTIME_POD_DELETE_STAGE.format(labels='{"a": "b"}'))
    spec = stage["spec"]
    assert spec["selector"]["matchLabels"] == {"a": "b"}
    assert {"key": ".metadata.deletionTimestamp", "operator": "Exists"} in spec["selector"]["matchExpressions"]
    assert spec["delay"]["durationFrom"] == {"expressionFrom": ".metadata.deletionTimestamp"}
    assert "jitterDurationFrom" not in spec["delay"]
    assert spec["next"] == {"delete": True}
