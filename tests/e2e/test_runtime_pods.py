"""Runtime pods on the real API server: Pod Security levels, every pod knob through drift, the weights cache."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from localcluster.cluster import LocalCluster
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.decisions.runtime_env import plan_runtime
from specdec_operator.render import pool as render
from specdec_operator.render.names import pool_name
from specdec_operator.render.podspec import PodSettings
from specdec_operator.settings import DEFAULT_IMAGE_TARGETS, DEFAULT_IMAGES
from specdec_runtime import contract
from specdec_runtime.config import RuntimeConfig, serve_args
from tests.e2e.audit import operator_writes_since
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

LLAMA = {"name": "meta-llama/Llama-3.1-8B-Instruct"}
# Autotune off: K stays where the spec puts it, so the only revisions are the ones a test makes.
FIXED_K = {"initialK": 3, "minK": 3, "maxK": 3, "autotune": {"enabled": False}}


def model(name: str, **spec: Any) -> dict[str, Any]:
    body = {"model": LLAMA, "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 1},
            "speculation": FIXED_K, **spec}
    return {"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name}, "spec": body}


def enforce(cluster: LocalCluster, namespace: str, level: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "--overwrite", f"pod-security.kubernetes.io/enforce={level}",
                    "pod-security.kubernetes.io/enforce-version=latest")


def running(kube: Kube, selector: str, count: int, timeout_s: float = 90) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        pods = [p for p in kube.items("pods", selector)
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == count else None

    return wait_for(f"{count} Running pods for {selector}", probe, timeout_s,
                    describe=lambda: [e["message"] for e in kube.events()][-5:])


def failed_creates(kube: Kube) -> list[str]:
    return [e["message"] for e in kube.events() if e.get("reason") == "FailedCreate"]


def test_default_pods_are_created_and_run_where_restricted_is_enforced(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    enforce(cluster, namespace, "restricted")
    kube.apply(model("psa-restricted", placement={"gfxTargets": ["gfx942"], "replicasPerPool": 2}))
    pods = running(kube, "specdec.io/pool=psa-restricted-gfx942", 2)
    for pod in pods:
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert failed_creates(kube) == []


def baseline_deployment(namespace: str) -> list[dict[str, Any]]:
    """The ConfigMap and Deployment the operator renders with the root opt-down, applied without a
    SpeculativeModel (and so without an owner), so that no operator running on the cluster rewrites them. The
    pods run (the fleet driver serves them, as a kubelet would) only with their config mounted."""
    spec = SpeculativeModelSpec.model_validate(model("psa-baseline")["spec"])
    ctx = render.PoolIdentity(namespace, "psa-baseline", "uid", pool_name("psa-baseline", "gfx942"), "gfx942")
    image = DEFAULT_IMAGES["gfx942"]
    runtime = plan_runtime("gfx942", image, DEFAULT_IMAGE_TARGETS[image], {})
    config = render.with_attention_backend(render.runtime_config(spec, spec.drafters[0], 3),
                                           runtime.attention_backend, runtime.mla_attention_backend)
    config_map = render.config_map(ctx, config)
    template = render.pod_template(ctx, spec, runtime, render.PoolTrack("stable", 3, config_map["metadata"]["name"]),
                                   pod_settings=PodSettings(security="baseline", supplemental_groups=(44, 109)))
    deployment = render.deployment(ctx, template, 2, "stable")
    for rendered in (config_map, deployment):
        del rendered["metadata"]["ownerReferences"]
    return [config_map, deployment]


def test_root_opt_down_runs_where_baseline_is_enforced_and_not_where_restricted_is(
    cluster: LocalCluster, kube: Kube, namespace: str, crds: None
) -> None:
    enforce(cluster, namespace, "baseline")
    kube.apply(baseline_deployment(namespace))
    pods = running(kube, "specdec.io/pool=psa-baseline-gfx942", 2)
    assert all("runAsNonRoot" not in pod["spec"]["securityContext"] for pod in pods)
    assert failed_creates(kube) == []

    restricted = f"{namespace}-r"
    cluster.kubectl("create", "namespace", restricted)
    try:
        enforce(cluster, restricted, "restricted")
        strict = Kube(cluster, restricted)
        strict.apply(baseline_deployment(restricted))
        refusal = wait_for("the ReplicaSet's FailedCreate", lambda: failed_creates(strict), 60)
        assert "violates PodSecurity" in refusal[0] and "runAsNonRoot" in refusal[0], refusal
        assert strict.items("pods") == []
    finally:
        cluster.kubectl("delete", "namespace", restricted, "--wait=false", check=False)


KNOBS: dict[str, Any] = {
    "env": [
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}},
        {"name": "TUNING", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "profile", "optional": True}}},
    ],
    "resources": {"requests": {"cpu": "0.5", "memory": "1.5Gi"}, "limits": {"memory": "2Gi"}},
    "pod": {
        "labels": {"team": "inference"},
        "annotations": {"example.com/owner": "ml-platform"},
        "serviceAccountName": "vllm",
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [
            {"name": "certs", "mountPath": "/etc/certs", "readOnly": True, "secret": {"secretName": "api"}},
            {"name": "templates", "mountPath": "/templates", "configMap": {"name": "tuning", "optional": True}},
            {"name": "scratch", "mountPath": "/scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1.5Gi"}},
        ],
        "affinity": {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In",
                                                                    "values": ["linux"]}]}}]},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                    "labelSelector": {"matchLabels": {"team": "inference"}}}}]},
        },
    },
}


def deployment_writes(cluster: LocalCluster, since: str, name: str) -> list[str]:
    return [w for w in operator_writes_since(cluster.paths.logs / "audit.log", since)
            if w.startswith(("patch deployments/", "update deployments/", "create deployments/")) and f"/{name} " in w]


def test_every_pod_knob_is_rendered_stays_quiet_and_survives_drift_correction(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    priority = f"{namespace}-high"
    cluster.kubectl("create", "priorityclass", priority, "--value=1000")
    try:
        enforce(cluster, namespace, "restricted")
        kube.run("create", "serviceaccount", "vllm")
        kube.run("create", "secret", "generic", "api", "--from-literal=key=s3cret")
        kube.run("create", "configmap", "tuning", "--from-literal=profile=fast")
        knobs = {**KNOBS, "pod": {**KNOBS["pod"], "priorityClassName": priority}}
        kube.apply(model("pod-knobs", runtime=knobs))
        [pod] = running(kube, "specdec.io/pool=pod-knobs-gfx942", 1)

        spec = pod["spec"]
        assert pod["metadata"]["labels"]["team"] == "inference"
        assert pod["metadata"]["annotations"]["example.com/owner"] == "ml-platform"
        assert (spec["serviceAccountName"], spec["priorityClassName"]) == ("vllm", priority)
        assert spec["imagePullSecrets"] == [{"name": "registry"}]
        container = spec["containers"][0]
        assert {e["name"] for e in container["env"]} >= {"API_KEY", "TUNING"}
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/etc/certs", "/templates", "/scratch"}
        assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1536Mi", "amd.com/gpu": "1"}
        assert spec["affinity"]["podAntiAffinity"] == KNOBS["pod"]["affinity"]["podAntiAffinity"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" in spec["affinity"]["nodeAffinity"]

        # Steady state: three whole reconcile passes without a single write to an owned object (the API
        # server's defaults on what we render must not look like drift). The pass that saw the pod run ends first.
        operator.wait_passes(namespace, "pod-knobs", 1)
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        operator.wait_passes(namespace, "pod-knobs", 4)
        owned_writes = [w for w in operator_writes_since(cluster.paths.logs / "audit.log", since)
                        if "/pod-knobs" in w and not w.split()[1].startswith("speculativemodels")]
        assert owned_writes == [], operator.log_tail()

        # Drift: strip knobs by hand; the operator puts every one back.
        strip = [
            {"op": "remove", "path": "/spec/template/metadata/labels/team"},
            {"op": "remove", "path": "/spec/template/spec/serviceAccountName"},
            {"op": "remove", "path": "/spec/template/spec/imagePullSecrets"},
            {"op": "remove", "path": "/spec/template/spec/containers/0/volumeMounts/4"},
            {"op": "remove", "path": "/spec/template/spec/volumes/4"},
        ]
        stripped_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        kube.run("patch", "deployment", "pod-knobs-gfx942", "--type=json", "-p", json.dumps(strip))

        def restored() -> bool:
            template = kube.get("deployment", "pod-knobs-gfx942")["spec"]["template"]
            volumes = [v["name"] for v in template["spec"]["volumes"]]
            return (template["metadata"]["labels"].get("team") == "inference"
                    and template["spec"].get("serviceAccountName") == "vllm"
                    and template["spec"].get("imagePullSecrets") == [{"name": "registry"}]
                    and "scratch" in volumes)

        wait_for("every knob restored", restored, 30)
        running(kube, "specdec.io/pool=pod-knobs-gfx942", 1)
        operator.wait_passes(namespace, "pod-knobs", 3)  # two whole passes after the restore: quiet again
        restoring = deployment_writes(cluster, stripped_at, "pod-knobs-gfx942")
        assert len(restoring) == 1, restoring  # one apply restored them all, then quiet again
        assert failed_creates(kube) == []
    finally:
        cluster.kubectl("delete", "priorityclass", priority, "--wait=false", check=False)


def test_a_k_change_revision_mounts_the_same_cache_claim(
    cluster: LocalCluster, kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    volume = f"{namespace}-hf"
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": "/var/lib/specdec-e2e/hf"}},
    }))
    try:
        kube.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "hf-cache"},
                    "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
                             "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for("hf-cache Bound", lambda: kube.get("pvc", "hf-cache")["status"].get("phase") == "Bound", 60)
        replicas = {"gfxTargets": ["gfx942"], "replicasPerPool": 2}
        kube.apply(model("cached", placement=replicas, runtime={"weightsCache": {"claimName": "hf-cache"}}))
        selector = "specdec.io/pool=cached-gfx942"
        before = running(kube, selector, 2)

        kube.apply(model("cached", placement=replicas, runtime={"weightsCache": {"claimName": "hf-cache"}},
                         speculation={**FIXED_K, "initialK": 5, "minK": 5, "maxK": 5}))

        def new_revision_pods() -> list[dict[str, Any]] | None:
            pods = [p for p in kube.items("pods", selector) if not p["metadata"].get("deletionTimestamp")]
            at_k = [p for p in pods if p["metadata"]["annotations"].get(contract.ANNOTATION_K) == "5"
                    and p["status"].get("phase") == "Running"]
            return at_k if len(pods) == len(at_k) == 2 else None

        after = wait_for("both pods at K=5 and Running", new_revision_pods, 120)
        revisions = {pod["metadata"]["labels"][contract.LABEL_REVISION] for pod in before + after}
        assert len(revisions) == 2
        for pod in before + after:
            claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                      if v["name"] == "hf-cache"]
            assert claims == ["hf-cache"], pod["metadata"]["name"]
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["HF_HOME"] == "/var/cache/huggingface"
    finally:
        kube.run("delete", "sm", "cached", "--wait=true", check=False)
        kube.run("delete", "pvc", "hf-cache", "--wait=false", check=False)
        cluster.kubectl("delete", "pv", volume, "--wait=false", check=False)



UPSTREAM_IMAGE = "vllm/vllm-openai-rocm:v0.33.0"


def test_a_model_on_the_upstream_vllm_image_runs_that_images_vllm_with_the_rendered_arguments(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    """spec.runtime.image names the upstream vLLM ROCm image, unmodified (issue 32, item 1): the Deployment's container
    is that image running its own `vllm` with the `vllm serve` arguments of the pool's mounted config, the list the
    contract suite hands to vLLM 0.33 (tests/contract/test_vllm_runtime.py); no launcher of ours is needed in it."""
    kube.apply(model("upstream", runtime={"image": UPSTREAM_IMAGE}))
    deployment = wait_for("the pool's Deployment", lambda: kube.get("deployment", "upstream-gfx942"), 60)
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == UPSTREAM_IMAGE and container["command"] == ["vllm"], container
    [config_volume] = [v for v in pod["volumes"] if v["name"] == contract.CONFIG_VOLUME]
    stored = kube.get("configmap", config_volume["configMap"]["name"])
    config = RuntimeConfig.model_validate_json(stored["data"][contract.CONFIG_KEY])
    assert container["args"] == serve_args(config)
    assert container["args"][:2] == ["serve", LLAMA["name"]] and "--speculative-config" in container["args"]
    print("container:", container["command"], container["args"])
