"""`strategy: Canary` and nothing else: the default steps and analysis promote a healthy change.

The model has no `canary:` block and no HTTPRoute, as a newcomer writes it first. Its requests go to the
model's Service (`Host: <model>.<namespace>.svc`), where the stand-in spreads them over the Service's ready
pods as kube-proxy would: without a route, the canary's share is its share of the replicas. The simulators have
no virtual load (profile e2e-traffic), so every count the analysis reads comes from these requests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from specdec_operator.api.spec import Canary
from tests.e2e.kube import Kube, wait_for
from tests.e2e.nodes_fixture import FLEET_LABEL, test_nodes, toleration_for_test_nodes  # noqa: F401 - fixture
from tests.e2e.operator_process import FleetDriverProcess, OperatorProcess
from tests.e2e.traffic import BackgroundLoad, GatewayStandIn

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.xdist_group("test_canary_defaults")]

EAGLE_A = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE_B = "example-org/EAGLE3-LLaMA3.1-Instruct-8B-v2"
DEFAULTS = Canary()
# The default steps' pauses and, for the steps that have to wait for requests, the default timeout.
DECISION_BOUND_S = sum(step.pause_seconds for step in DEFAULTS.steps) + 2 * DEFAULTS.analysis.timeout_seconds


@pytest.fixture(scope="module")
def service_proxy(cluster: LocalCluster) -> Iterator[GatewayStandIn]:
    """A stand-in of a class no Gateway here has: it carries only Service-host requests (the kube-proxy half)
    and writes no route status, so it never competes with the Gateway stand-in of the route tests."""
    proxy = GatewayStandIn(cluster, name="service-proxy", gateway_class="specdec-e2e-services-only").start()
    yield proxy
    proxy.stop()


def model(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "drafters": [{"method": "eagle3", "model": EAGLE_A}],
            # Autotune off: the change under test is the drafter's alone (a K the tuner explored meanwhile would
            # ride in the same canary and be judged with it; test_canary_traffic covers tuner K changes).
            "speculation": {"initialK": 3, "minK": 1, "maxK": 8, "autotune": {"enabled": False}},
            # On a node of the test's own: the demo fleet's gfx942 nodes are shared by every lane.
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 2, "nodeSelector": {FLEET_LABEL: namespace},
                          "tolerations": [toleration_for_test_nodes(namespace)]},
            "runtime": {"simulatorProfile": "e2e-traffic"},
            "rollout": {"strategy": "Canary"},
        },
    }


def phase(kube: Kube, name: str) -> str | None:
    canary = (kube.get("sm", name) or {}).get("status", {}).get("canary")
    return canary.get("phase") if canary else None


def ready(kube: Kube, name: str) -> bool:
    conditions = (kube.get("sm", name) or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_strategy_canary_alone_promotes_a_healthy_drafter_change_on_the_default_steps(
    kube: Kube, operator: OperatorProcess, fleet_driver: FleetDriverProcess, service_proxy: GatewayStandIn,
    test_nodes: Callable[[str, int], list[dict[str, Any]]],  # noqa: F811
) -> None:
    name = "defaults"
    test_nodes("defaults", 1)
    body = model(name, str(kube.namespace))
    kube.apply(body)
    wait_for(f"{name} Ready", lambda: ready(kube, name), 180)
    # The served name defaults to the hub id (spec.model.name).
    with BackgroundLoad(service_proxy.url, f"{name}.{kube.namespace}.svc", seed=11,
                        model=body["spec"]["model"]["name"]) as load:
        body["spec"]["drafters"][0]["model"] = EAGLE_B
        kube.apply(body)
        wait_for("canary decided", lambda: phase(kube, name) in ("Promoted", "RolledBack", "Aborted"),
                 DECISION_BOUND_S, 1,
                 describe=lambda: ((kube.get("sm", name) or {}).get("status", {}).get("canary"),
                                   [e["message"] for e in kube.events(name)][-4:]))
    events = kube.events(name)
    assert phase(kube, name) == "Promoted", [f"{e['reason']}: {e['message']}" for e in events
                                             if e["reason"].startswith("Canary")]
    passed = [e["message"] for e in events if e["reason"] == "CanaryStepPassed"]
    # The default steps (10%, 50%, then 100%) each passed on the default analysis: every gated comparison
    # met, over at least the default minimum of finished requests on each side.
    # Events come back in no particular order.
    assert sorted(m.split(" passed")[0] for m in passed) == ["step 1/3 (10%)", "step 2/3 (50%)"], passed
    for message in passed:
        assert "TPOT p90" in message and "goodput per sequence" in message, message
        samples = re.search(r"(\d+) canary and (\d+) stable requests", message)
        assert samples and min(map(int, samples.groups())) >= DEFAULTS.analysis.min_requests, message
    print(f"step verdicts: {passed}; answers by HTTP status: {load.report.statuses if load.report else None}")
