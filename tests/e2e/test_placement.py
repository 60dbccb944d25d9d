"""gfx-aware placement by the running operator on the simulated AMD fleet."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from tests.e2e.audit import operator_writes_since
from tests.e2e.kube import Kube, example_docs, wait_for
from tests.e2e.lanes import DEMO_FLEET_EXAMPLES
from tests.e2e.operator_process import OperatorFactory, OperatorProcess

# The lane of the tests that apply the shipped examples (tests/e2e/lanes.py).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(DEMO_FLEET_EXAMPLES)]

REPO = Path(__file__).resolve().parents[2]
GFX942_NODES = ("mi300x-", "mixed-")


def example(name: str) -> list[dict[str, Any]]:
    return example_docs(name)


def model(name: str, **spec: Any) -> dict[str, Any]:
    body = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec}
    return {"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name}, "spec": body}


def condition(kube: Kube, name: str, kind: str) -> dict[str, Any] | None:
    status = kube.get("sm", name).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


def running_pods(kube: Kube, selector: str, count: int) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        pods = [p for p in kube.items("pods", selector) if p["status"].get("phase") == "Running"]
        return pods if len(pods) == count else None

    def describe() -> list[str]:
        """Each pod's node, phase and waiting reasons (a kubelet-like refusal explains a pod that never runs)."""
        described = []
        for pod in kube.items("pods", selector):
            waiting = [(s.get("state") or {}).get("waiting", {}).get("reason", "")
                       for s in pod["status"].get("containerStatuses", [])]
            described.append(f"{pod['metadata']['name']} on {pod['spec'].get('nodeName')}: "
                             f"{pod['status'].get('phase')} {' '.join(filter(None, waiting))}")
        return described

    return wait_for(f"{count} Running pods for {selector}", probe, 120, describe=describe)


def ready(kube: Kube, name: str) -> dict[str, Any]:
    return wait_for(f"{name} Ready", lambda: (c := condition(kube, name, "Ready")) and c["status"] == "True" and c, 120)


def test_examples_land_on_their_gfx_nodes_only(kube: Kube, operator: OperatorProcess) -> None:
    for name in ("eagle3-mi300x.yaml", "draft-70b-mi300x-mi250x.yaml", "ngram-w7900.yaml"):
        kube.apply_with_secrets(example(name))
    expectations = {
        "specdec.io/pool=llama8b-eagle3-gfx942": (2, GFX942_NODES),
        "specdec.io/pool=llama70b-draft-gfx942": (2, GFX942_NODES),
        "specdec.io/pool=llama70b-draft-gfx90a": (2, ("mi250x-",)),
        "specdec.io/pool=qwen-coder-ngram-gfx1100": (2, ("w7900-",)),
    }
    for selector, (count, prefixes) in expectations.items():
        for pod in running_pods(kube, selector, count):
            node = pod["spec"]["nodeName"]
            assert node.startswith(prefixes), f"{selector} pod on {node}"
            assert node not in ("cpu-0", "unhealthy-0")
    for name in ("llama8b-eagle3", "llama70b-draft", "qwen-coder-ngram"):
        assert ready(kube, name)["reason"] == "PoolsReady"
    # The 70B example's MI300X pool runs at its own TP2 (spec.placement.pools), the MI250X pool at the model's TP4.
    for gfx, gpus in (("gfx942", "2"), ("gfx90a", "4")):
        [container] = kube.get("deployment", f"llama70b-draft-{gfx}")["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["amd.com/gpu"] == gpus, (gfx, container["resources"])
        assert container["args"][container["args"].index("--tensor-parallel-size") + 1] == gpus


def test_mixed_node_admits_gfx942_pool_and_refuses_others(kube: Kube, operator: OperatorProcess) -> None:
    """The rendered affinity is evaluated by the real scheduler, pinned to the mixed node."""
    kube.apply_with_secrets(example("draft-70b-mi300x-mi250x.yaml"))
    # Both pools' Deployments come from one pass (about a second here). The guard is long for a CI machine that
    # runs real engines beside five lanes; on a timeout the model's status says where the pass stood.
    deployments = {
        gfx: wait_for(f"{gfx} deployment", lambda g=gfx: kube.get("deployment", f"llama70b-draft-{g}"), 90,
                      describe=lambda: (kube.get("sm", "llama70b-draft") or {}).get("status"))
        for gfx in ("gfx942", "gfx90a")
    }
    for gfx, deployment in deployments.items():
        affinity = deployment["spec"]["template"]["spec"]["affinity"]
        pod = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"probe-{gfx}", "labels": {"probe": gfx}},
            "spec": {"affinity": affinity, "nodeSelector": {"kubernetes.io/hostname": "mixed-0"},
                     "containers": [{"name": "c", "image": "example.invalid/probe:1"}]},
        }
        kube.apply(pod)
    wait_for("gfx942 probe Running on mixed-0",
             lambda: kube.get("pod", "probe-gfx942")["status"].get("phase") == "Running", 60)
    assert kube.get("pod", "probe-gfx942")["spec"]["nodeName"] == "mixed-0"
    event = wait_for("FailedScheduling for the gfx90a probe", lambda: next(
        (e for e in kube.events("probe-gfx90a") if e["reason"] == "FailedScheduling"), None), 60)
    assert "didn't match Pod's node affinity/selector" in event["message"]


def test_draft_model_too_big_for_w7900_falls_back_to_ngram_there_only(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply(model(
        "fallback",
        drafters=[{"method": "draft_model", "model": "Qwen/Qwen2.5-14B-Instruct"}],
        placement={"gfxTargets": ["gfx942", "gfx1100"]},
    ))
    # A fallback serves: it is Reduced, not Degraded (issue 22).
    degraded = wait_for("Reduced DrafterFallback", lambda: (c := condition(kube, "fallback", "Reduced"))
                        and c["reason"] == "DrafterFallback" and c, 60)
    assert "fallback-gfx1100" in degraded["message"] and "GiB" in degraded["message"]
    pools = {p["gfxTarget"]: p for p in kube.get("sm", "fallback")["status"]["pools"]}
    assert pools["gfx942"]["drafter"] == {**pools["gfx942"]["drafter"], "method": "draft_model", "fallback": False}
    assert pools["gfx1100"]["drafter"]["method"] == "ngram" and pools["gfx1100"]["drafter"]["fallback"] is True
    events = wait_for("DrafterFallback event", lambda: [e for e in kube.events("fallback")
                                                        if e["reason"] == "DrafterFallback"], 30)
    assert "falling back to ngram" in events[0]["message"]


def test_gfx_target_without_nodes_is_not_ready_and_does_not_hot_loop(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply(model("nowhere", placement={"gfxTargets": ["gfx950"]}))
    not_ready = wait_for("Ready=False", lambda: (c := condition(kube, "nowhere", "Ready")) and c, 60)
    assert (not_ready["status"], not_ready["reason"]) == ("False", "NoCompatibleNodes")
    # A hot loop is a pass whose own write starts the next one. A model that cannot be placed settles like any
    # other: once its status says so, its passes (the interval's, counted, not a clock) write nothing.
    namespace = str(kube.namespace)
    operator.wait_passes(namespace, "nowhere", 2)
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    operator.wait_passes(namespace, "nowhere", 3)
    writes = operator_writes_since(kube.cluster.paths.logs / "audit.log", since, namespace)
    assert writes == [], writes


def test_spec_change_rolls_and_revert_returns_to_the_same_revision(kube: Kube, operator: OperatorProcess) -> None:
    body = model("rolling", placement={"gfxTargets": ["gfx942"]}, speculation={"initialK": 3, "minK": 0, "maxK": 8},
                 drafters=[{"method": "ngram"}])
    body["spec"]["speculation"]["autotune"] = {"enabled": False}
    kube.apply(body)

    def revision() -> str:
        labels = kube.get("deployment", "rolling-gfx942")["spec"]["template"]["metadata"]["labels"]
        return str(labels["specdec.io/revision"])

    first = wait_for("deployment", lambda: kube.get("deployment", "rolling-gfx942") and revision(), 60)
    body["spec"]["model"]["maxModelLen"] = 8192
    kube.apply(body)
    second = wait_for("a new revision", lambda: (r := revision()) != first and r, 60)
    del body["spec"]["model"]["maxModelLen"]
    kube.apply(body)
    wait_for("the first revision again", lambda: revision() == first, 60)
    assert second != first


def test_manual_edit_of_an_owned_deployment_is_reverted(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply_with_secrets(example("ngram-w7900.yaml"))
    wait_for("deployment", lambda: kube.get("deployment", "qwen-coder-ngram-gfx1100"), 60)
    ready(kube, "qwen-coder-ngram")
    kube.run("scale", "deployment", "qwen-coder-ngram-gfx1100", "--replicas=5")
    kube.run("set", "image", "deployment/qwen-coder-ngram-gfx1100", "vllm=example.invalid/hand-edited:1")
    wait_for("replicas and image restored", lambda: (d := kube.get("deployment", "qwen-coder-ngram-gfx1100"))
             and d["spec"]["replicas"] == 2
             and d["spec"]["template"]["spec"]["containers"][0]["image"].startswith("ghcr.io/specdec/"), 60)


def test_a_deleted_namespace_with_a_model_goes_away_under_a_namespace_pattern(
    cluster: LocalCluster, kube: Kube, namespace: str, scoped_operator: OperatorFactory
) -> None:
    """An operator watching namespaces by pattern (SPECDEC_NAMESPACES=["team-*"]) finalizes the models of a namespace
    being deleted. kopf stopped watching such a namespace when its deletion began, so the model's finalizer stayed
    and the namespace was Terminating for good (handlers/services/namespace_discovery.py)."""
    scoped_operator(SPECDEC_NAMESPACES=json.dumps([f"{namespace}*"]))
    kube.apply(model("doomed", placement={"gfxTargets": ["gfx942"], "replicasPerPool": 1}))
    ready(kube, "doomed")
    assert kube.get("sm", "doomed")["metadata"].get("finalizers"), "kopf finalizes a model with a daemon"
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    wait_for(f"namespace {namespace} gone", lambda: not cluster.kubectl(
        "get", "namespace", namespace, "--ignore-not-found", "-o", "name", check=False).strip(), 120, 1,
        describe=lambda: cluster.kubectl("get", "namespace", namespace, "-o", "jsonpath={.status}", check=False))


def test_deleting_the_model_garbage_collects_children(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply_with_secrets(example("eagle3-mi300x.yaml"))
    ready(kube, "llama8b-eagle3")
    kube.run("delete", "sm", "llama8b-eagle3", "--wait=true", "--timeout=60s")
    for kind in ("deployments", "configmaps", "poddisruptionbudgets", "services"):
        wait_for(f"{kind} collected", lambda k=kind: not kube.items(k, "specdec.io/model=llama8b-eagle3"), 60)
