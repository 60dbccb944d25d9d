"""What the operator did not make it neither takes over nor believes (issue 34, items 8 and 10).

Whoever can create a SpeculativeModel in a namespace can also create Services and pods there: a Service that
happens to bear a model's name, or a pod that copies a model's labels, must change nothing the operator decides.
"""

from __future__ import annotations

import http.server
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from specdec_runtime import contract
from tests.e2e.kube import Kube, wait_for
from tests.e2e.lanes import NAMESPACE_PREFIX
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e



def model(name: str, **spec: Any) -> dict[str, Any]:
    # Autotune on (the default): a model that tunes has its pods scraped, so a pod it took for its own would be.
    spec = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 1}, **spec}
    return {"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name}, "spec": spec}


def degraded(kube: Kube, name: str) -> dict[str, Any] | None:
    status = (kube.get("sm", name) or {}).get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), None)


def test_a_service_someone_else_made_under_the_models_name_survives_the_model_and_is_named(
    kube: Kube, operator: OperatorProcess
) -> None:
    name = "owned-svc"
    kube.apply({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "labels": {"team": "platform"}},
                "spec": {"selector": {"app": "theirs"}, "ports": [{"name": "web", "port": 80, "targetPort": 8080}]}})
    theirs = kube.get("service", name)

    kube.apply(model(name))
    condition = wait_for(
        "Degraded naming the Service the model does not own",
        lambda: (c := degraded(kube, name)) and c["status"] == "True" and "ObjectNotOwned" in
        f"{c['reason']} {c['message']}" and f"Service/{name}" in c["message"] and c,
        90, describe=lambda: degraded(kube, name))
    assert condition["status"] == "True", condition
    kube.events_once(name, "ObjectNotOwned")
    # The model's other objects are made: only the Service is left alone.
    wait_for("the model's Deployment", lambda: kube.items("deployments", f"{contract.LABEL_MODEL}={name}"), 60)

    def unchanged() -> None:
        live = kube.get("service", name)
        assert live is not None, "the Service someone else made was deleted"
        assert live["metadata"]["uid"] == theirs["metadata"]["uid"]
        assert live["spec"]["selector"] == {"app": "theirs"}, live["spec"]
        assert live["spec"]["ports"] == theirs["spec"]["ports"]
        assert live["metadata"].get("labels") == {"team": "platform"}
        assert not live["metadata"].get("ownerReferences"), live["metadata"]

    unchanged()
    kube.run("delete", "sm", name, "--wait=true", "--timeout=90s")
    # The garbage collector removes what the model owned; what it never owned stays.
    wait_for("the model's Deployments garbage-collected",
             lambda: not kube.items("deployments", f"{contract.LABEL_MODEL}={name}"), 90)
    unchanged()


class CountingMetrics(http.server.ThreadingHTTPServer):
    """A /metrics no vLLM could serve (NaN counters), counting every request: the impostor pod's."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                body = (b"# TYPE vllm:spec_decode_num_drafts counter\n"
                        b'vllm:spec_decode_num_drafts_total{model_name="x"} NaN\n'
                        b"# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
                        b'vllm:spec_decode_num_accepted_tokens_total{model_name="x"} 1e308\n')
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(address, Handler)


@pytest.fixture
def served_on() -> Iterator[list[CountingMetrics]]:
    servers: list[CountingMetrics] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def metric_total(operator: OperatorProcess, name: str) -> float:
    samples = operator.metrics() or {}
    return sum(value for key, value in samples.items() if key == name or key.startswith(name + "{"))


def test_a_pod_with_the_models_labels_that_its_deployment_did_not_make_is_never_scraped_nor_counted(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess,
    served_on: list[CountingMetrics],
) -> None:
    name = "owned-pods"
    kube.apply(model(name))
    selector = f"{contract.LABEL_MODEL}={name}"

    def ready_pods() -> list[dict[str, Any]] | None:
        pods = [p for p in kube.items("pods", selector)
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
        return pods or None

    real = wait_for("the model's pod Ready", ready_pods, 120)[0]
    wait_for("the model Ready", lambda: (c := next((c for c in (kube.get("sm", name).get("status") or {}).get(
        "conditions", []) if c["type"] == "Ready"), None)) and c["status"] == "True", 90)
    before = [(p["name"], p["replicas"]) for p in kube.get("sm", name)["status"]["pools"]]

    # The impostor: the real pod's labels and annotations (the K annotation included), on the same node, made by
    # the test. Not its pod-template-hash: a pod that matches a ReplicaSet's selector is adopted by it (and, one
    # too many, deleted), so the platform itself already settles that case.
    impostor = "owned-pods-impostor"
    meta = real["metadata"]
    labels = {key: value for key, value in meta["labels"].items() if key != "pod-template-hash"}
    kube.apply({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": impostor, "labels": labels, "annotations": meta.get("annotations", {})},
                "spec": {"nodeName": real["spec"]["nodeName"], "tolerations": real["spec"].get("tolerations", []),
                         "containers": [{"name": "vllm", "image": real["spec"]["containers"][0]["image"]}]}})
    ip = wait_for("the impostor's loopback IP",
                  lambda: (kube.get("pod", impostor) or {}).get("status", {}).get("podIP"), 60)
    assert ip.startswith("127."), ip  # network safety: serve on loopback only
    served_on.append(CountingMetrics((ip, 8000)))
    threading.Thread(target=served_on[0].serve_forever, daemon=True).start()
    # As a kubelet would once its container answered: Running and Ready (the fleet driver serves only pods whose
    # runtime config it can read, and this one mounts none).
    kube.run("patch", "pod", impostor, "--subresource=status", "--type=merge", "-p", """{"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
        "containerStatuses": [{"name": "vllm", "image": "x", "imageID": "", "ready": true, "started": true,
                               "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}""")
    wait_for("the impostor Ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in kube.get("pod", impostor)["status"].get("conditions", [])), 30)

    # Wait on the operator, not on a clock: a pass after the impostor's Ready (its event nudges the model) and
    # three whole scrape rounds after that pass (a pass tells the scheduler which pods the model wants).
    reconciles = metric_total(operator, "specdec_reconcile_total")
    wait_for("a pass after the impostor turned Ready",
             lambda: metric_total(operator, "specdec_reconcile_total") > reconciles, 60)
    rounds = metric_total(operator, "specdec_scrape_round_duration_seconds_count")
    wait_for("3 scrape rounds after that pass",
             lambda: metric_total(operator, "specdec_scrape_round_duration_seconds_count") >= rounds + 3, 120,
             describe=lambda: {k: v for k, v in (operator.metrics() or {}).items() if "scrape" in k})

    assert served_on[0].requests == [], "the operator scraped a pod its Deployment did not make"
    status = kube.get("sm", name)["status"]
    assert [(p["name"], p["replicas"]) for p in status["pools"]] == before
    assert not any(impostor in c.get("message", "") for c in status.get("conditions", [])), status["conditions"]
    assert not any(impostor in e.get("message", "") for e in kube.events(name))
    samples = operator.metrics() or {}
    assert not [key for key in samples if impostor in key], "a metric series names the impostor"


@pytest.fixture
def route_namespace(cluster: LocalCluster) -> Iterator[str]:
    """A namespace of its own for a route, as a platform team's gateway namespace (in this lane's watch)."""
    name = f"{NAMESPACE_PREFIX}routes-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_a_route_in_another_namespace_is_neither_read_nor_weighted_until_that_namespace_grants_it(
    cluster: LocalCluster, kube: Kube, namespace: str, route_namespace: str, operator: OperatorProcess
) -> None:
    name = "grant-route"
    routes = Kube(cluster, route_namespace)
    routes.apply({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name},
                  "spec": {"parentRefs": [{"name": "inference-gateway"}],
                           "rules": [{"backendRefs": [{"name": f"{name}-stable", "namespace": namespace,
                                                       "port": 8000, "weight": 100}]}]}})
    theirs = routes.get("httproutes.gateway.networking.k8s.io", name)
    kube.apply(model(name, rollout={"strategy": "Canary", "canary": {
        "traffic": {"httpRouteRef": {"name": name, "namespace": route_namespace}}}}))

    condition = wait_for(
        "Degraded/HTTPRouteNotPermitted", lambda: (c := degraded(kube, name)) and c["status"] == "True"
        and c["reason"] == "HTTPRouteNotPermitted" and c, 90, describe=lambda: degraded(kube, name))
    assert route_namespace in condition["message"] and "ReferenceGrant" in condition["message"], condition
    kube.events_once(name, "HTTPRouteNotPermitted")
    # Nothing of the model's is applied while its route is in doubt, and the route is as its owners left it.
    assert kube.items("deployments", f"{contract.LABEL_MODEL}={name}") == []
    assert routes.get("httproutes.gateway.networking.k8s.io", name)["metadata"]["resourceVersion"] == \
        theirs["metadata"]["resourceVersion"]

    routes.apply({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
                  "metadata": {"name": "models-may-weight-routes"},
                  "spec": {"from": [{"group": "specdec.io", "kind": "SpeculativeModel", "namespace": namespace}],
                           "to": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": name}]}})
    wait_for("the grant honoured: the model's Deployment applied and no HTTPRouteNotPermitted",
             lambda: kube.items("deployments", f"{contract.LABEL_MODEL}={name}")
             and (c := degraded(kube, name)) is not None and c["reason"] != "HTTPRouteNotPermitted", 90,
             describe=lambda: degraded(kube, name))
