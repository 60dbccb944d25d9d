"""Rollouts and placement against free GPUs, on a fleet of MI300X nodes each test adds for itself.

Each test brings its own kwok nodes, labelled for its namespace, and pins its models to them with
spec.placement.nodeSelector: "the whole fleet" is then exactly those nodes, whatever else the shared
cluster runs. The fleet driver makes the runtime pods Ready and serve, so readiness is real.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from specdec_runtime import contract
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import test_nodes, toleration_for_test_nodes  # noqa: F401 - fixture
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess

# Exclusive: a rollout's mode (Surge or InPlace) is decided from the operator's view of free GPUs the moment the
# revision changes; under the lanes' load its pod cache can still hold the pods of the rollout that just ended.
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

FLEET_LABEL = "specdec.io/e2e-fleet"
EAGLE_A = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE_B = "example-org/EAGLE3-LLaMA3.1-Instruct-8B-v2"
MI300X = {"deviceId": "74a1", "productName": "AMD_Instinct_MI300X_OAM", "vram": "192G", "family": "AI",
          "cuCount": 304, "simdCount": 1216}


@pytest.fixture
def gpu_nodes(test_nodes: Callable[[str, int], list[dict[str, Any]]]) -> Callable[[int], list[str]]:  # noqa: F811
    """Adds `count` 8-GPU MI300X nodes that only this test's models select (removed afterwards); their names."""
    return lambda count: [node["metadata"]["name"] for node in test_nodes("cap", count)]


def model(name: str, namespace: str, replicas: int = 2, **rollout: Any) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "tensorParallelSize": 8},
            "drafters": [{"method": "eagle3", "model": EAGLE_A}],
            "speculation": {"initialK": 3, "minK": 1, "maxK": 8, "autotune": {"enabled": False}},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": replicas,
                          "nodeSelector": {FLEET_LABEL: namespace},
                          "tolerations": [toleration_for_test_nodes(namespace)]},
            "runtime": {"simulatorProfile": "quick"},
            "rollout": {"strategy": "Rolling", **rollout},
        },
    }


CANARY = {
    "strategy": "Canary",
    "canary": {
        "steps": [{"weight": 50, "pauseSeconds": 15}, {"weight": 100, "pauseSeconds": 5}],
        "analysis": {"minDrafts": 200, "timeoutSeconds": 120, "minAcceptedLengthRatio": 0.9,
                     "minTokensPerSecondRatio": 0.8},
    },
}


def _ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def pods(kube: Kube, name: str) -> list[dict[str, Any]]:
    return kube.items("pods", f"specdec.io/model={name}")


def condition(kube: Kube, name: str, kind: str) -> dict[str, Any] | None:
    status = kube.get("sm", name).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


class ServingWatch:
    """Samples ready runtime pods per track while a rollout runs; remembers the fewest seen."""

    def __init__(self, kube: Kube, name: str) -> None:
        self.kube, self.name = kube, name
        self.fewest = 10**6
        self.samples: list[tuple[float, int, int, int]] = []  # (t, ready stable, ready canary, canary weight)
        self.started = time.monotonic()

    def sample(self) -> int:
        # The weight first, then the pods: a weight the operator set before the pods were read must be served by
        # them. (Read the other way round, a weight set between the two reads was charged to pods listed before
        # the canary pod that earned it was Ready: a failure of the test's own making under load.)
        status = self.kube.get("sm", self.name).get("status", {})
        weight = (status.get("canary") or {}).get("weight", 0) if (status.get("canary") or {}).get(
            "phase") in ("Progressing", "Paused") else 0
        listed = pods(self.kube, self.name)
        stable = sum(1 for p in listed if _ready(p) and p["metadata"]["labels"].get("specdec.io/track") == "stable")
        canary = sum(1 for p in listed if _ready(p) and p["metadata"]["labels"].get("specdec.io/track") == "canary")
        self.samples.append((time.monotonic() - self.started, stable, canary, weight))
        self.fewest = min(self.fewest, stable + canary)
        return stable + canary

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def settle(kube: Kube, name: str, replicas: int) -> None:
    wait_for(f"{name} Ready with {replicas} serving", lambda: (c := condition(kube, name, "Ready"))
             and c["status"] == "True" and sum(map(_ready, pods(kube, name))) == replicas, 120,
             describe=lambda: kube.get("sm", name).get("status", {}).get("conditions"))


def k_change(kube: Kube, body: dict[str, Any], k: int, replicas: int) -> ServingWatch:
    """Move every pod to K=k (bounds clamp the effective K) and watch serving replicas until done."""
    body["spec"]["speculation"].update({"initialK": k, "minK": k, "maxK": k})
    kube.apply(body)
    watch = ServingWatch(kube, body["metadata"]["name"])

    def done() -> bool:
        watch.sample()
        listed = pods(kube, body["metadata"]["name"])
        deployment = kube.get("deployment", f"{body['metadata']['name']}-gfx942")
        available = any(c["type"] == "Available" and c["status"] == "True"
                        for c in deployment.get("status", {}).get("conditions", []))
        return (len(listed) == replicas and all(_ready(p) for p in listed) and available
                and all(p["metadata"]["annotations"].get(contract.ANNOTATION_K) == str(k) for p in listed))

    wait_for(f"every pod at K={k}, ready and Available", done, 240, 0.5,
             describe=lambda: [(p["metadata"]["name"], p["status"].get("phase"), p["metadata"]["annotations"].get(
                 contract.ANNOTATION_K)) for p in pods(kube, body["metadata"]["name"])])
    return watch


def canary_change(kube: Kube, body: dict[str, Any], replicas: int) -> ServingWatch:
    """Switch to the canary strategy and change the drafter; watch until the canary is promoted and gone."""
    name = body["metadata"]["name"]
    body["spec"]["rollout"] = {**body["spec"]["rollout"], **CANARY}
    kube.apply(body)
    body["spec"]["drafters"][0]["model"] = EAGLE_B
    kube.apply(body)
    watch = ServingWatch(kube, name)
    steps_seen: list[int] = []

    def promoted() -> bool:
        watch.sample()
        canary = kube.get("sm", name).get("status", {}).get("canary") or {}
        if canary.get("phase") == "Progressing" and canary.get("weight") and (
                not steps_seen or steps_seen[-1] != canary["weight"]):
            steps_seen.append(canary["weight"])
        listed = pods(kube, name)
        return (canary.get("phase") == "Promoted" and len(listed) == replicas and all(map(_ready, listed))
                and all(p["metadata"]["labels"].get("specdec.io/track") == "stable" for p in listed)
                and not kube.items("deployments", f"specdec.io/model={name},specdec.io/track=canary"))

    wait_for("canary promoted and handed back to the stable Deployment", promoted, 360, 0.5,
             describe=lambda: kube.get("sm", name).get("status", {}).get("canary"))
    assert steps_seen == [50, 100], steps_seen
    return watch


def step_promises_hold(watch: ServingWatch, replicas: int, floor: int) -> None:
    """While a step has traffic, both sides serve what its weight promises (up to the in-place budget)."""
    for t, stable, canary, weight in watch.samples:
        assert stable + canary >= floor, (t, stable, canary, weight)
        if weight == 50:
            assert canary >= 1 and stable + canary >= floor, (t, stable, canary, weight)


def test_full_pool_replaces_in_place_for_a_k_change_and_a_canary(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    gpu_nodes: Callable[[int], list[str]], namespace: str,
) -> None:
    gpu_nodes(2)  # 16 GPUs: a TP8 x 2 model fills every one
    body = model("full", namespace)
    kube.apply(body)
    settle(kube, "full", 2)

    watch = k_change(kube, body, 5, 2)
    strategy = kube.get("deployment", "full-gfx942")["spec"]["strategy"]["rollingUpdate"]
    assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (0, 1), strategy
    rollout = kube.get("sm", "full")["status"]["pools"][0]["rollout"]
    assert rollout["mode"] == "InPlace" and "0 of 16 gfx942 GPUs" in rollout["reason"], rollout
    assert watch.fewest >= 1, watch.samples  # maxUnavailable 1 of 2
    print(f"\nfull pool, K change in place: {watch.elapsed():.1f} s, fewest serving {watch.fewest}/2")
    events = wait_for("RolloutInPlace event", lambda: [e for e in kube.events("full")
                                                       if e["reason"] == "RolloutInPlace"], 30)
    assert "replaces in place" in events[0]["message"]

    watch = canary_change(kube, body, 2)
    step_promises_hold(watch, 2, 1)
    print(f"full pool, drafter canary 50/100 in place to promotion: {watch.elapsed():.1f} s, "
          f"fewest serving {watch.fewest}/2")
    assert not [p for p in pods(kube, "full") if p["status"].get("phase") == "Pending"]


def test_spare_capacity_still_surges(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    gpu_nodes: Callable[[int], list[str]], namespace: str,
) -> None:
    gpu_nodes(5)  # 40 GPUs: 16 serve, 24 are free (3 surge slots of TP8)
    body = model("roomy", namespace)
    kube.apply(body)
    settle(kube, "roomy", 2)

    watch = k_change(kube, body, 5, 2)
    strategy = kube.get("deployment", "roomy-gfx942")["spec"]["strategy"]["rollingUpdate"]
    assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (1, 0), strategy
    assert kube.get("sm", "roomy")["status"]["pools"][0]["rollout"]["mode"] == "Surge"
    assert watch.fewest >= 2, watch.samples
    print(f"\nspare capacity, K change with surge: {watch.elapsed():.1f} s, fewest serving {watch.fewest}/2")

    watch = canary_change(kube, body, 2)
    assert kube.get("sm", "roomy")["status"]["pools"][0]["rollout"]["mode"] == "Surge"
    step_promises_hold(watch, 2, 2)
    assert watch.fewest >= 2, watch.samples
    print(f"spare capacity, drafter canary 50/100 with surge to promotion: {watch.elapsed():.1f} s, "
          f"fewest serving {watch.fewest}/2")


def test_two_models_competing_for_one_pool_report_the_shortfall(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    gpu_nodes: Callable[[int], list[str]], namespace: str,
) -> None:
    gpu_nodes(2)  # 16 GPUs; the two models together ask for 32
    kube.apply([model("first", namespace), model("second", namespace)])

    def settled() -> dict[str, dict[str, Any]] | None:
        listed = {name: pods(kube, name) for name in ("first", "second")}
        pending = {name for name, items in listed.items() if any(
            p["status"].get("phase") == "Pending" for p in items)}
        degraded = {name: condition(kube, name, "Degraded") or {} for name in listed}
        for name in pending:  # a Pending pod is only acceptable with a condition saying why
            if degraded[name].get("reason") not in ("InsufficientGpus", "PodsUnschedulable"):
                return None
        running = sum(p["status"].get("phase") == "Running" for items in listed.values() for p in items)
        short = [d for d in degraded.values() if d.get("reason") == "InsufficientGpus"]
        return degraded if running == 2 and not pending and short else None

    degraded = wait_for("two replicas running, no Pending pod, the shortfall reported", settled, 120, 1,
                        describe=lambda: {n: (condition(kube, n, "Degraded"), [
                            (p["metadata"]["name"], p["status"].get("phase")) for p in pods(kube, n)])
                            for n in ("first", "second")})
    messages = [d["message"] for d in degraded.values() if d.get("reason") == "InsufficientGpus"]
    assert any("need 16 GPUs" in m and "of the 16 GPUs on 2 nodes" in m for m in messages), messages
    print(f"\ncompeting models: {[(n, d.get('reason'), d.get('message')) for n, d in degraded.items()]}")
    # Stable: nothing flips back to Pending once settled, over two whole passes of each model.
    for name in ("first", "second"):
        operator.wait_passes(namespace, name, 3)
    assert settled() is not None


def test_a_pending_pod_on_a_full_pool_is_reported_with_the_schedulers_reason(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess,
    gpu_nodes: Callable[[int], list[str]], namespace: str,
) -> None:
    """maxUnavailable 0 forbids replacing in place, so on a full pool the surge pod must wait: it says why."""
    gpu_nodes(2)
    body = model("waiting", namespace, maxSurge=1, maxUnavailable=0)
    kube.apply(body)
    settle(kube, "waiting", 2)
    body["spec"]["speculation"].update({"initialK": 5, "minK": 5, "maxK": 5})
    kube.apply(body)
    degraded = wait_for("Degraded PodsUnschedulable", lambda: (c := condition(kube, "waiting", "Degraded"))
                        and c["reason"] == "PodsUnschedulable" and c, 90,
                        describe=lambda: condition(kube, "waiting", "Degraded"))
    assert "Insufficient amd.com/gpu" in degraded["message"], degraded
    rollout = kube.get("sm", "waiting")["status"]["pools"][0]["rollout"]
    assert rollout["mode"] == "Surge" and "maxUnavailable is 0" in rollout["reason"], rollout
    assert sum(map(_ready, pods(kube, "waiting"))) == 2  # nothing was taken out of service
    print(f"\npending surge pod reported: {degraded['message']}")
