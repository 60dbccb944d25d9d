"""Admission refuses exactly what the API server would refuse downstream, value by value.

Each case puts one raw value where the renderer would put it in the runtime Deployment and asks the real
API server twice, with server-side dry runs: would it take the SpeculativeModel (our CEL rules), and
would it take the Deployment (its own validation)? The Python models must agree with admission. Cases
where we refuse more than the API server does (what the kubelet would refuse later, or names no object
can have) are listed in STRICTER with the reason.
"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
from pydantic import ValidationError

from localcluster.cluster import LocalCluster
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.decisions.runtime_env import plan_runtime
from specdec_operator.render import pool as render
from specdec_operator.render.names import pool_name
from specdec_operator.settings import DEFAULT_IMAGE_TARGETS, DEFAULT_IMAGES, OperatorEnvSettings

pytestmark = pytest.mark.e2e

BASE: dict[str, Any] = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "placement": {"gfxTargets": ["gfx942"]}}


def base_deployment(namespace: str) -> dict[str, Any]:
    spec = SpeculativeModelSpec.model_validate(BASE)
    ctx = render.PoolIdentity(namespace, "probe", "uid", pool_name("probe", "gfx942"), "gfx942")
    image = DEFAULT_IMAGES["gfx942"]
    runtime = plan_runtime("gfx942", image, DEFAULT_IMAGE_TARGETS[image], {})
    template = render.pod_template(ctx, spec, runtime, render.PoolTrack("stable", 3, "probe-config"),
                                   pod_settings=OperatorEnvSettings().pod_settings)
    deployment = render.deployment(ctx, template, 1, "stable")
    del deployment["metadata"]["ownerReferences"]
    return deployment


def raw_into(deployment: dict[str, Any], runtime: dict[str, Any], placement: dict[str, Any]) -> dict[str, Any]:
    """The renderer's placement of each value, without any validation in between."""
    out = copy.deepcopy(deployment)
    template = out["spec"]["template"]
    pod, container = template["spec"], template["spec"]["containers"][0]
    user = runtime.get("resources", {})
    for which in ("requests", "limits"):
        container["resources"][which].update(user.get(which, {}))
    # As the renderer does: a user's limit below the derived request lowers the request to it, and a user's
    # memory request is also the memory limit (the runtime pod's memory is never overcommitted).
    for name in ("cpu", "memory"):
        if name in user.get("limits", {}) and name not in user.get("requests", {}):
            container["resources"]["requests"][name] = user["limits"][name]
    if "memory" in user.get("requests", {}) and "memory" not in user.get("limits", {}):
        container["resources"]["limits"]["memory"] = user["requests"]["memory"]
    container["env"] += runtime.get("env", [])
    knobs = runtime.get("pod", {})
    template["metadata"]["labels"].update(knobs.get("labels", {}))
    template["metadata"]["annotations"].update(knobs.get("annotations", {}))
    if "image" in runtime:
        container["image"] = runtime["image"]
    for key in ("serviceAccountName", "priorityClassName", "imagePullSecrets"):
        if key in knobs:
            pod[key] = knobs[key]
    for volume in knobs.get("volumes", []):
        mount = {k: volume[k] for k in ("name", "mountPath", "readOnly", "subPath") if k in volume}
        pod["volumes"].append({k: v for k, v in volume.items() if k not in ("mountPath", "readOnly", "subPath")})
        container["volumeMounts"].append(mount)
    extra = knobs.get("affinity", {})
    if "preferredDuringSchedulingIgnoredDuringExecution" in extra.get("nodeAffinity", {}):
        pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = (
            extra["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"])
    pod["affinity"].update({kind: extra[kind] for kind in ("podAffinity", "podAntiAffinity") if kind in extra})
    for term in pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]:
        term["matchExpressions"] += [{"key": k, "operator": "In", "values": [v]}
                                     for k, v in placement.get("nodeSelector", {}).items()]
    if placement.get("tolerations"):
        pod["tolerations"] = placement["tolerations"]
    return out


def vol(**source: Any) -> dict[str, Any]:
    return {"runtime": {"pod": {"volumes": [{"name": "extra", "mountPath": "/extra", **source}]}}}


def res(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"runtime": {"resources": {"requests": requests or {}, "limits": limits or {}}}}


def secret_ref(name: str, key: str) -> dict[str, str]:
    return {"name": name, "key": key}


# (id, spec overrides). Every value lands in the Deployment.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("cpu-millis", res({"cpu": "500m"})),
    ("memory-typo-GB", res(limits={"memory": "256GB"})),
    ("memory-words", res({"memory": "lots"})),
    ("negative-cpu", res({"cpu": "-1"})),
    ("exponent", res({"ephemeral-storage": "1e9"})),
    ("request-over-limit", res({"memory": "2Gi"}, {"memory": "1Gi"})),
    ("request-equals-limit", res({"memory": "1Gi"}, {"memory": "1024Mi"})),
    ("unknown-unprefixed", res({"gpus": "1"})),
    ("extended-fraction", res(limits={"example.com/nic": "500m"})),
    ("extended-request-only", res({"example.com/nic": "1"})),
    ("extended-unequal", res({"example.com/nic": "1"}, {"example.com/nic": "2"})),
    ("extended-equal", res({"example.com/nic": "2"}, {"example.com/nic": "2"})),
    ("requests-prefixed", res(limits={"requests.example.com/nic": "1"})),
    ("hugepages-alone", res(limits={"hugepages-2Mi": "4Mi"})),
    ("hugepages-odd", res(limits={"hugepages-2Mi": "3Mi", "memory": "1Gi"})),
    ("hugepages-ok", res({"hugepages-2Mi": "4Mi"}, {"hugepages-2Mi": "4Mi", "memory": "1Gi"})),
    ("env-equals", {"runtime": {"env": [{"name": "A=B", "value": "1"}]}}),
    ("env-relaxed", {"runtime": {"env": [{"name": "my var.1", "value": "1"}]}}),
    ("env-non-ascii", {"runtime": {"env": [{"name": "CAFÉ", "value": "1"}]}}),
    ("env-secret-name", {"runtime": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": secret_ref("S", "k")}}]}}),
    ("env-secret-key", {"runtime": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": secret_ref("s", "..")}}]}}),
    ("env-config-map-key", {"runtime": {"env": [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "a.b_c-d"}}}]}}),
    ("label-key-slashes", {"runtime": {"pod": {"labels": {"a/b/c": "x"}}}}),
    ("label-value-space", {"runtime": {"pod": {"labels": {"team": "a b"}}}}),
    ("label-value-64", {"runtime": {"pod": {"labels": {"team": "x" * 64}}}}),
    ("label-ok", {"runtime": {"pod": {"labels": {"example.com/team": "A-b_c.d"}}}}),
    ("annotation-key-space", {"runtime": {"pod": {"annotations": {"a b": "x"}}}}),
    ("annotation-ok", {"runtime": {"pod": {"annotations": {"example.com/note": "any text: at all"}}}}),
    ("service-account-upper", {"runtime": {"pod": {"serviceAccountName": "Vllm"}}}),
    ("priority-class-underscore", {"runtime": {"pod": {"priorityClassName": "high_prio"}}}),
    ("volume-name-upper", vol(name="Extra", emptyDir={})),
    ("volume-claim-empty", vol(persistentVolumeClaim={"claimName": ""})),
    ("volume-mount-relative", vol(mountPath="data", emptyDir={})),
    ("volume-sub-path-up", vol(subPath="../x", emptyDir={})),
    ("volume-size-limit-typo", vol(emptyDir={"sizeLimit": "1GB"})),
    ("volume-ok", vol(secret={"secretName": "certs", "optional": True}, readOnly=True)),
    ("node-selector-key", {"placement": {"nodeSelector": {"node pool": "a"}}}),
    ("node-selector-value", {"placement": {"nodeSelector": {"pool": "a/b"}}}),
    ("node-selector-ok", {"placement": {"nodeSelector": {"example.com/pool": "inference"}}}),
    ("node-affinity-negative-threshold", {"runtime": {"pod": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [
            {"key": "example.com/rank", "operator": "Lt", "values": ["-1"]}]}}]}}}}}),
    ("image-ok", {"runtime": {"image": "registry.local:5000/team/vllm-rocm:0.33.0"}}),
    ("image-uppercase-repository", {"runtime": {"image": "ghcr.io/Team/vllm:1"}}),
    ("image-space", {"runtime": {"image": "vllm rocm"}}),
    ("pull-secret-upper", {"runtime": {"pod": {"imagePullSecrets": [{"name": "Registry"}]}}}),
    ("toleration-key", {"placement": {"tolerations": [{"key": "a b", "operator": "Exists"}]}}),
    ("toleration-exists-value", {"placement": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}}),
    ("toleration-seconds", {"placement": {"tolerations": [{"key": "k", "operator": "Exists",
                                                           "tolerationSeconds": 5}]}}),
    ("toleration-ok", {"placement": {"tolerations": [{"key": "k", "operator": "Equal", "value": "v",
                                                      "effect": "NoExecute", "tolerationSeconds": 5}]}}),
    ("toleration-keyless-equal", {"placement": {"tolerations": [{"operator": "Equal", "effect": "NoSchedule"}]}}),
    ("toleration-keyless-default-operator", {"placement": {"tolerations": [{"effect": "NoSchedule"}]}}),
    ("toleration-keyless-exists", {"placement": {"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}}),
    ("toleration-amd-transient-taint", {"placement": {"tolerations": [{"key": "amd-dcm", "operator": "Exists"}]}}),
    ("volume-mount-parent-segment", vol(mountPath="/extra/../models", emptyDir={})),
    ("volume-mount-double-slash", vol(mountPath="//models", emptyDir={})),
    ("volume-mount-root", vol(mountPath="/", emptyDir={})),
    ("volume-mount-dotted-name-ok", vol(mountPath="/extra/..cache", emptyDir={})),
    ("env-visible-devices-differ", {"runtime": {"env": [{"name": "HIP_VISIBLE_DEVICES", "value": "0"},
                                                        {"name": "CUDA_VISIBLE_DEVICES", "value": "1"}]}}),
    ("env-visible-devices-equal", {"runtime": {"env": [{"name": "HIP_VISIBLE_DEVICES", "value": "0"},
                                                       {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]}}),
    # Names vLLM reads from the rendered config, not Deployment fields: the Deployment takes any of them, so
    # these check that admission and the models agree, on refusals (STRICTER, below) and on what passes.
    ("model-name-empty", {"model": {"name": ""}}),
    ("model-name-relative-path", {"model": {"name": "weights/llama/8b"}}),
    ("model-name-double-dash", {"model": {"name": "org/llama--8b"}}),
    ("model-name-absolute-path-ok", {"model": {"name": "/root/.cache/huggingface/hub/models--org--m/snapshots/1"}}),
    ("model-name-hub-ok", {"model": {"name": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"}}),
    ("served-name-flag", {"model": {"servedName": "--llama"}}),
    ("served-name-ok", {"model": {"servedName": "meta-llama/Llama-3.1-8B:latest"}}),
    ("weights-path-escapes", {"model": {"source": {"pvcName": "weights", "path": "a/../../etc"}}}),
    ("weights-path-ok", {"model": {"source": {"pvcName": "weights", "path": "org/llama-3.1"}}}),
    ("drafter-model-empty", {"drafters": [{"method": "eagle3", "model": ""}]}),
    ("drafter-model-ok", {"drafters": [{"method": "eagle3", "model": "/models/drafters/eagle3"}]}),
    ("simulator-profile-flag", {"runtime": {"simulate": True, "simulatorProfile": "--seed=1"}}),
    ("simulator-profile-ok", {"runtime": {"simulate": True, "simulatorProfile": "bursty.yaml"}}),
    ("drafter-repeated", {"drafters": [{"method": "eagle3", "model": "org/eagle3"}, {"method": "ngram"},
                                       {"method": "eagle3", "model": "org/eagle3"}]}),
    ("drafter-model-two-methods-ok", {"drafters": [{"method": "eagle", "model": "org/head"},
                                                   {"method": "eagle3", "model": "org/head"}]}),
    ("weights-path-without-pvc", {"model": {"source": {"path": "org/llama-3.1"}}}),
    ("drafters-empty", {"drafters": []}),
]

# Refused at admission although the API server would take the Deployment, and why.
STRICTER = {
    # runc resolves a relative destination against / (deprecated); an absolute path keeps the check that
    # no extra volume lands on the operator's mount paths exact.
    "volume-mount-relative": "the API server takes a relative mountPath; the runtime resolves it against /",
    # The API server checks only that an image is set; the kubelet then fails with InvalidImageName.
    "image-uppercase-repository": "the kubelet refuses the reference (InvalidImageName)",
    "image-space": "the kubelet refuses the reference (InvalidImageName)",
    # The API server checks only that a name is set; no Secret can have this one, so no pull can use it.
    "pull-secret-upper": "no Secret can have this name",
    # vLLM (or the simulator) refuses these when it starts: huggingface_hub's repo id check, argparse.
    "model-name-empty": "vLLM has no model to load",
    "model-name-relative-path": "neither a hub repo id nor a path that means the same in every image",
    "model-name-double-dash": "huggingface_hub refuses the repo id",
    "served-name-flag": "vLLM's argument parser reads it as a flag",
    "weights-path-escapes": "it leaves the weights claim",
    "drafter-model-empty": "vLLM has no drafter to load",
    "simulator-profile-flag": "the simulator's argument parser reads it as a flag",
    # The container runtime cleans a mount path: these would shadow the operator's weights mount, or the image.
    "volume-mount-parent-segment": "the runtime resolves it to /models, over the operator's weights mount",
    "volume-mount-double-slash": "the runtime resolves it to /models, over the operator's weights mount",
    "volume-mount-root": "a volume over / hides the image",
    # decisions/runtime_env.plan_runtime would refuse to render the pool (RuntimeEnvError).
    "env-visible-devices-differ": "vLLM on ROCm needs HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES equal",
    # Not Deployment fields; silently ignored if admitted.
    "drafter-repeated": "the second entry could never be chosen",
    "weights-path-without-pvc": "no claim is mounted, so vLLM would load spec.model.name instead",
    "drafters-empty": "the ngram fallback would run at initialK, which is not what no drafters reads as",
    # Runtime pods never tolerate AMD's transient GPU taints; these would be dropped from the pods.
    "toleration-keyless-exists": "it matches AMD's transient GPU taints, which runtime pods never tolerate",
    "toleration-amd-transient-taint": "runtime pods never tolerate AMD's transient GPU taints",
}


def dry_run(cluster: LocalCluster, namespace: str, obj: dict[str, Any]) -> tuple[bool, str]:
    kubectl = cluster.binaries["kubectl"]
    result = subprocess.run(
        [str(kubectl), "--kubeconfig", str(cluster.paths.kubeconfig), "-n", namespace, "apply", "--dry-run=server",
         "-f", "-"], input=json.dumps(obj), capture_output=True, text=True, check=False)
    return result.returncode == 0, result.stderr


def python_accepts(spec: dict[str, Any]) -> bool:
    try:
        SpeculativeModelSpec.model_validate(spec)
    except ValidationError:
        return False
    return True


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize(("overrides"), [o for _, o in CASES], ids=[i for i, _ in CASES])
def test_admission_python_and_the_downstream_api_server_agree(
    cluster: LocalCluster, namespace: str, crds: None, request: pytest.FixtureRequest, overrides: dict[str, Any]
) -> None:
    case = request.node.callspec.id
    spec = merged(BASE, overrides)
    model = {"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": "probe"},
             "spec": spec}
    admitted, admission_error = dry_run(cluster, namespace, model)
    deployment = raw_into(base_deployment(namespace), spec.get("runtime", {}), spec.get("placement", {}))
    downstream, downstream_error = dry_run(cluster, namespace, deployment)
    assert python_accepts(spec) == admitted, admission_error
    if case in STRICTER:
        assert (admitted, downstream) == (False, True), (admission_error, downstream_error)
    else:
        assert admitted == downstream, f"admission: {admission_error or 'ok'}; Deployment: {downstream_error or 'ok'}"
