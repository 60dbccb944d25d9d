"""Every spec field that reaches an owned object is refused in Python exactly where the API server would refuse it.

The CRD carries the same rules as CEL (api/kubeformats.py builds both from one pattern); the e2e suite
applies tests/manifests/invalid to a real API server. Here: the Python side, word for word the same text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specdec_operator.api.kubeformats import (
    CONFIG_KEY,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_VAR_NAME,
    IMAGE_REFERENCE,
    LABEL_VALUE,
    QUALIFIED_NAME,
    is_quantity,
    quantity_value,
)
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.reconcile.plan import validation_message
from tests.unit.api.specfactories import spec, spec_wire
from tests.unit.api.test_spec import CEL_MESSAGES

INVALID_MANIFESTS = sorted((Path(__file__).resolve().parents[2] / "manifests" / "invalid").glob("*.yaml"))


def rejection(**overrides: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        SpeculativeModelSpec.model_validate(spec_wire(**overrides))
    return validation_message(caught.value)


def volume(**fields: Any) -> dict[str, Any]:
    return {"name": "extra", "mountPath": "/extra", **fields}


# (id, spec overrides, the exact message the CRD's CEL rule gives).
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("quantity-malformed", {"runtime": {"resources": {"requests": {"cpu": "two"}}}},
     "spec.runtime.resources.requests values must be non-negative quantities such as 8, 500m or 64Gi"),
    ("quantity-negative", {"runtime": {"resources": {"limits": {"memory": "-1Gi"}}}},
     "spec.runtime.resources.limits values must be non-negative quantities such as 8, 500m or 64Gi"),
    ("quantity-unit-typo", {"runtime": {"resources": {"limits": {"memory": "16GB"}}}},
     "spec.runtime.resources.limits values must be non-negative quantities such as 8, 500m or 64Gi"),
    ("resource-name-unprefixed", {"runtime": {"resources": {"requests": {"gpu": "1"}}}},
     "spec.runtime.resources.requests keys must be cpu, memory, ephemeral-storage, hugepages-<page size> or an "
     "extended resource such as example.com/device"),
    ("resource-name-requests-prefix", {"runtime": {"resources": {"limits": {"requests.example.com/x": "1"}}}},
     "spec.runtime.resources.limits keys must be cpu, memory, ephemeral-storage, hugepages-<page size> or an "
     "extended resource such as example.com/device"),
    ("gpu-in-requests", {"runtime": {"resources": {"requests": {"amd.com/gpu": "8"}}}},
     "spec.runtime.resources.requests may not set amd.com/gpu: the operator requests spec.model.tensorParallelSize "
     "GPUs"),
    ("gpu-in-limits", {"runtime": {"resources": {"limits": {"amd.com/gpu": "8"}}}},
     "spec.runtime.resources.limits may not set amd.com/gpu: the operator requests spec.model.tensorParallelSize GPUs"),
    ("extended-fraction", {"runtime": {"resources": {"limits": {"example.com/nic": "500m"}}}},
     "spec.runtime.resources.limits: extended resources such as example.com/device take whole numbers"),
    ("request-over-limit", {"runtime": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}},
     "spec.runtime.resources.requests must not exceed spec.runtime.resources.limits, and must equal them for "
     "extended resources and hugepages"),
    ("extended-request-below-limit",
     {"runtime": {"resources": {"requests": {"example.com/nic": "1"}, "limits": {"example.com/nic": "2"}}}},
     "spec.runtime.resources.requests must not exceed spec.runtime.resources.limits, and must equal them for "
     "extended resources and hugepages"),
    ("extended-request-without-limit", {"runtime": {"resources": {"requests": {"example.com/nic": "1"}}}},
     "spec.runtime.resources.limits must be set for every extended resource and hugepages size that is requested"),
    ("hugepages-not-a-page-multiple",
     {"runtime": {"resources": {"limits": {"hugepages-2Mi": "3Mi", "memory": "1Gi"}}}},
     "spec.runtime.resources.limits: a hugepages-<size> amount must be a whole multiple of a positive whole page size"),
    ("image-uppercase-repository", {"runtime": {"image": "ghcr.io/Team/vllm:1"}},
     f"spec.runtime.image must be {IMAGE_REFERENCE.description}"),
    ("image-with-space", {"runtime": {"image": "vllm/vllm openai"}},
     f"spec.runtime.image must be {IMAGE_REFERENCE.description}"),
    ("env-name-with-equals", {"runtime": {"env": [{"name": "A=B", "value": "1"}]}},
     f"spec.runtime.env[].name must be {ENV_VAR_NAME.description}"),
    ("env-value-and-value-from",
     {"runtime": {"env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}},
     "spec.runtime.env[]: set value or valueFrom, not both"),
    ("env-value-from-two-sources", {"runtime": {"env": [{"name": "A", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}, "configMapKeyRef": {"name": "c", "key": "k"}}}]}},
     "spec.runtime.env[].valueFrom must set exactly one of secretKeyRef and configMapKeyRef"),
    ("env-secret-name", {"runtime": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "S", "key": "k"}}}]}},
     f"spec.runtime.env[].valueFrom.secretKeyRef.name must be {DNS1123_SUBDOMAIN.description}"),
    ("env-config-map-key", {"runtime": {"env": [{"name": "A", "valueFrom": {
        "configMapKeyRef": {"name": "c", "key": "a/b"}}}]}},
     f"spec.runtime.env[].valueFrom.configMapKeyRef.key must be {CONFIG_KEY.description}"),
    ("hf-token-with-hub-secret", {"model": {"source": {"hubSecretRef": {"name": "hf"}}},
                                  "runtime": {"env": [{"name": "HF_TOKEN", "value": "x"}]}},
     "spec.runtime.env may not set HF_TOKEN when spec.model.source.hubSecretRef is set, nor HF_HOME when "
     "spec.runtime.weightsCache names a claim: the operator sets them"),
    ("hf-home-with-cache",
     {"runtime": {"weightsCache": {"claimName": "hf"}, "env": [{"name": "HF_HOME", "value": "/x"}]}},
     "spec.runtime.env may not set HF_TOKEN when spec.model.source.hubSecretRef is set, nor HF_HOME when "
     "spec.runtime.weightsCache names a claim: the operator sets them"),
    ("pvc-name", {"model": {"source": {"pvcName": "Models_PVC"}}},
     f"spec.model.source.pvcName must be {DNS1123_SUBDOMAIN.description}"),
    ("hub-secret-name", {"model": {"source": {"hubSecretRef": {"name": "hf token"}}}},
     f"spec.model.source.hubSecretRef.name must be {DNS1123_SUBDOMAIN.description}"),
    ("hub-secret-key", {"model": {"source": {"hubSecretRef": {"name": "hf", "key": ".."}}}},
     f"spec.model.source.hubSecretRef.key must be {CONFIG_KEY.description}"),
    ("node-selector-key", {"placement": {"nodeSelector": {"bad key": "x"}}},
     f"spec.placement.nodeSelector keys must be {QUALIFIED_NAME.description}"),
    ("node-selector-value", {"placement": {"nodeSelector": {"pool": "a b"}}},
     f"spec.placement.nodeSelector values must be {LABEL_VALUE.description}"),
    ("toleration-key", {"placement": {"tolerations": [{"key": "a/b/c", "operator": "Exists"}]}},
     f"spec.placement.tolerations[].key must be {QUALIFIED_NAME.description}"),
    ("toleration-value", {"placement": {"tolerations": [{"key": "k", "value": "-x-", "operator": "Equal"}]}},
     f"spec.placement.tolerations[].value must be {LABEL_VALUE.description}"),
    ("toleration-exists-with-value", {"placement": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
     "spec.placement.tolerations[].value must be empty when operator is Exists"),
    ("toleration-seconds-without-no-execute",
     {"placement": {"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}]}},
     "spec.placement.tolerations[].tolerationSeconds requires effect NoExecute"),
    # core/v1 ValidateTolerations: "operator must be Exists when `key` is empty".
    ("toleration-keyless-equal", {"placement": {"tolerations": [{"operator": "Equal", "effect": "NoSchedule"}]}},
     "spec.placement.tolerations[].key is required unless operator is Exists"),
    ("toleration-effect-only", {"placement": {"tolerations": [{"effect": "NoSchedule"}]}},
     "spec.placement.tolerations[].key is required unless operator is Exists"),
    # Runtime pods never tolerate AMD's transient GPU taints; admitted, these would be dropped from the pods.
    ("toleration-keyless-exists", {"placement": {"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}},
     "spec.placement.tolerations[].key is required: a keyless Exists toleration matches every taint, AMD's "
     "transient GPU taints (amd-gpu-unhealthy, amd-gpu-driver-upgrade, amd-dcm) included, and runtime pods never "
     "tolerate those; name each taint key to tolerate"),
    ("toleration-amd-transient-taint", {"placement": {"tolerations": [{"key": "amd-gpu-driver-upgrade",
                                                                        "operator": "Exists"}]}},
     "spec.placement.tolerations[].key must not be one of AMD's transient GPU taints (amd-gpu-unhealthy, "
     "amd-gpu-driver-upgrade, amd-dcm): a node that carries one has a sick or upgrading GPU, and runtime pods "
     "never go there"),
    ("pod-label-key", {"runtime": {"pod": {"labels": {"-team": "a"}}}},
     f"spec.runtime.pod.labels keys must be {QUALIFIED_NAME.description}"),
    ("pod-label-value", {"runtime": {"pod": {"labels": {"team": "x" * 64}}}},
     f"spec.runtime.pod.labels values must be {LABEL_VALUE.description}"),
    ("pod-label-owned", {"runtime": {"pod": {"labels": {"specdec.io/pool": "x"}}}},
     "spec.runtime.pod.labels may not set specdec.io/ keys or app.kubernetes.io/name, managed-by or instance: the "
     "operator owns them"),
    ("pod-label-owned-instance", {"runtime": {"pod": {"labels": {"app.kubernetes.io/instance": "x"}}}},
     "spec.runtime.pod.labels may not set specdec.io/ keys or app.kubernetes.io/name, managed-by or instance: the "
     "operator owns them"),
    ("pod-annotation-key", {"runtime": {"pod": {"annotations": {"a/b/c": "x"}}}},
     f"spec.runtime.pod.annotations keys must be {QUALIFIED_NAME.description}"),
    ("pod-annotation-owned", {"runtime": {"pod": {"annotations": {"prometheus.io/port": "9000"}}}},
     "spec.runtime.pod.annotations may not set specdec.io/ keys or prometheus.io/scrape, port or path: the operator "
     "owns them"),
    ("service-account", {"runtime": {"pod": {"serviceAccountName": "Runtime"}}},
     f"spec.runtime.pod.serviceAccountName must be {DNS1123_SUBDOMAIN.description}"),
    ("priority-class", {"runtime": {"pod": {"priorityClassName": "high_priority"}}},
     f"spec.runtime.pod.priorityClassName must be {DNS1123_SUBDOMAIN.description}"),
    ("pull-secret", {"runtime": {"pod": {"imagePullSecrets": [{"name": "Registry"}]}}},
     f"spec.runtime.pod.imagePullSecrets[].name must be {DNS1123_SUBDOMAIN.description}"),
    ("volume-name", {"runtime": {"pod": {"volumes": [volume(name="Extra", emptyDir={})]}}},
     f"spec.runtime.pod.volumes[].name must be {DNS1123_LABEL.description}"),
    ("volume-owned-name", {"runtime": {"pod": {"volumes": [volume(name="dshm", emptyDir={})]}}},
     "spec.runtime.pod.volumes[].name may not be runtime-config, dshm, models, hf-cache: the operator owns them"),
    ("volume-owned-mount", {"runtime": {"pod": {"volumes": [volume(mountPath="/etc/specdec/x", emptyDir={})]}}},
     "spec.runtime.pod.volumes[].mountPath may not be or lie under /etc/specdec, /dev/shm, /models, "
     "/var/cache/huggingface: the operator mounts its own volumes there"),
    ("volume-relative-mount", {"runtime": {"pod": {"volumes": [volume(mountPath="data", emptyDir={})]}}},
     "spec.runtime.pod.volumes[].mountPath must be an absolute path without ':'"),
    # The container runtime cleans the path, so these would land on an operator mount (or over the image's /).
    *[(f"volume-unclean-mount-{i}", {"runtime": {"pod": {"volumes": [volume(mountPath=path, emptyDir={})]}}},
       "spec.runtime.pod.volumes[].mountPath must not be / nor have an empty, '.' or '..' segment or a trailing '/'")
      for i, path in enumerate(["/x/../models", "//models", "/", "/data/", "/data/./x"])],
    # decisions/runtime_env.plan_runtime refuses to render two different values (RuntimeEnvError).
    ("visible-devices-differ", {"runtime": {"env": [{"name": "HIP_VISIBLE_DEVICES", "value": "0"},
                                                    {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}]}},
     "spec.runtime.env: HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES differ; vLLM on ROCm needs them equal"),
    ("visible-devices-one-empty", {"runtime": {"env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "1"},
                                                       {"name": "HIP_VISIBLE_DEVICES"}]}},
     "spec.runtime.env: HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES differ; vLLM on ROCm needs them equal"),
    ("volume-sub-path-escapes", {"runtime": {"pod": {"volumes": [volume(subPath="../x", emptyDir={})]}}},
     "spec.runtime.pod.volumes[].subPath must be a relative path without '..'"),
    ("volume-no-source", {"runtime": {"pod": {"volumes": [volume()]}}},
     "spec.runtime.pod.volumes[] must set exactly one of secret, configMap, persistentVolumeClaim, emptyDir"),
    ("volume-two-sources", {"runtime": {"pod": {"volumes": [volume(emptyDir={}, secret={"secretName": "s"})]}}},
     "spec.runtime.pod.volumes[] must set exactly one of secret, configMap, persistentVolumeClaim, emptyDir"),
    ("volume-claim-name", {"runtime": {"pod": {"volumes": [volume(persistentVolumeClaim={"claimName": "A"})]}}},
     f"spec.runtime.pod.volumes[].persistentVolumeClaim.claimName must be {DNS1123_SUBDOMAIN.description}"),
    ("volume-secret-name", {"runtime": {"pod": {"volumes": [volume(secret={"secretName": "s_1"})]}}},
     f"spec.runtime.pod.volumes[].secret.secretName must be {DNS1123_SUBDOMAIN.description}"),
    ("volume-config-map-name", {"runtime": {"pod": {"volumes": [volume(configMap={"name": "c/1"})]}}},
     f"spec.runtime.pod.volumes[].configMap.name must be {DNS1123_SUBDOMAIN.description}"),
    ("volume-size-limit", {"runtime": {"pod": {"volumes": [volume(emptyDir={"sizeLimit": "10 GiB"})]}}},
     "spec.runtime.pod.volumes[].emptyDir.sizeLimit must be a non-negative quantity such as 10Gi"),
    ("volume-mounts-collide", {"runtime": {"pod": {"volumes": [volume(emptyDir={}), volume(name="b", emptyDir={})]}}},
     "spec.runtime.pod.volumes[].mountPath must be unique"),
    ("weights-cache-claim", {"runtime": {"weightsCache": {"claimName": "HF"}}},
     f"spec.runtime.weightsCache.claimName must be {DNS1123_SUBDOMAIN.description}"),
    ("affinity-node-in-without-values", {"runtime": {"pod": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In"}]}}]}}}}},
     "spec.runtime.pod.affinity.nodeAffinity: operators In and NotIn need values, Exists and DoesNotExist take "
     "none, Gt and Lt take one integer"),
    ("affinity-node-gt-not-integer", {"runtime": {"pod": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [
                {"key": "mem", "operator": "Gt", "values": ["lots"]}]}}]}}}}},
     "spec.runtime.pod.affinity.nodeAffinity: operators In and NotIn need values, Exists and DoesNotExist take "
     "none, Gt and Lt take one integer"),
    ("affinity-topology-key", {"runtime": {"pod": {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "host name", "labelSelector": {}}]}}}}},
     f"spec.runtime.pod.affinity topologyKey must be {QUALIFIED_NAME.description}"),
    ("affinity-selector-exists-with-values", {"runtime": {"pod": {"affinity": {"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}}}]}}}}},
     "spec.runtime.pod.affinity: labelSelector operators In and NotIn need values, Exists and DoesNotExist take none"),
    ("affinity-selector-label-value", {"runtime": {"pod": {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "a b"}}}]}}}}},
     f"spec.runtime.pod.affinity labelSelector matchLabels values must be {LABEL_VALUE.description}"),
    ("route-name", {"rollout": {"strategy": "Canary", "canary": {"traffic": {"httpRouteRef": {"name": "Route"}}}}},
     f"spec.rollout.canary.traffic.httpRouteRef.name must be {DNS1123_SUBDOMAIN.description}"),
]


@pytest.mark.parametrize(("overrides", "message"), [(o, m) for _, o, m in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_python_refuses_with_the_admission_message_word_for_word(overrides: dict[str, Any], message: str) -> None:
    assert rejection(**overrides) == message
    assert message in CEL_MESSAGES


# Refused by the API server itself (a list-map with a repeated key); Python names the duplicate.
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"runtime": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
         "spec.runtime.env: duplicate name A"),
        ({"runtime": {"pod": {"volumes": [volume(emptyDir={}), volume(mountPath="/b", emptyDir={})]}}},
         "spec.runtime.pod.volumes: duplicate name extra"),
        ({"runtime": {"pod": {"imagePullSecrets": [{"name": "r"}, {"name": "r"}]}}},
         "spec.runtime.pod.imagePullSecrets: duplicate name r"),
    ],
)
def test_duplicate_names_are_refused(overrides: dict[str, Any], message: str) -> None:
    assert rejection(**overrides) == message


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("quantities", {"runtime": {"resources": {
        "requests": {"cpu": "500m", "memory": "1.5Gi", "ephemeral-storage": "1e9"},
        "limits": {"cpu": "2", "memory": "2Gi"}}}}),
    ("extended-equal", {"runtime": {"resources": {"requests": {"example.com/nic": "1"},
                                                  "limits": {"example.com/nic": "1"}}}}),
    ("extended-limit-only", {"runtime": {"resources": {"limits": {"rdma/hca_shared_devices_a": "1"}}}}),
    ("hugepages", {"runtime": {"resources": {"requests": {"hugepages-2Mi": "4Mi", "memory": "1Gi"},
                                             "limits": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}}}}),
    ("image-with-registry-port-and-digest",
     {"runtime": {"image": "registry.local:5000/team/vllm-rocm:0.33.0@sha256:" + "a" * 64}}),
    ("image-short", {"runtime": {"image": "vllm/vllm-openai-rocm:v0.33.0"}}),
    ("env-relaxed-name", {"runtime": {"env": [{"name": "my.var-1", "value": "x"}]}}),
    ("env-from-secret-and-config-map", {"runtime": {"env": [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token", "optional": True}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "tuning.json"}}}]}}),
    ("hf-home-without-cache", {"runtime": {"env": [{"name": "HF_HOME", "value": "/data"}]}}),
    ("labels-and-annotations", {"runtime": {"pod": {
        "labels": {"team": "inference", "example.com/cost-center": "42", "empty": ""},
        "annotations": {"example.com/owner": "a b c", "prometheus.io/job": "x"}}}}),
    ("every-volume-kind", {"runtime": {"pod": {"volumes": [
        volume(name="a", mountPath="/a", secret={"secretName": "s"}),
        volume(name="b", mountPath="/b", configMap={"name": "c", "optional": True}, readOnly=True),
        volume(name="c", mountPath="/c", persistentVolumeClaim={"claimName": "data", "readOnly": True}, subPath="x"),
        volume(name="d", mountPath="/d", emptyDir={"medium": "Memory", "sizeLimit": "1Gi"})]}}}),
    ("toleration-no-execute-seconds",
     {"placement": {"tolerations": [
         {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 9}]}}),
    ("weights-cache", {"runtime": {"weightsCache": {"claimName": "hf-cache"}}}),
    # The API server takes any single value for Gt and Lt; a negative threshold is a real one.
    ("node-affinity-negative-threshold", {"runtime": {"pod": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [
            {"key": "example.com/hbm-gib", "operator": "Gt", "values": ["-1"]}]}}]}}}}}),
    ("mount-path-dotted-names", {"runtime": {"pod": {"volumes": [volume(mountPath="/data/..z/.cache", emptyDir={})]}}}),
    ("visible-devices-equal", {"runtime": {"env": [{"name": "HIP_VISIBLE_DEVICES", "value": "0,1"},
                                                   {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}]}}),
    ("visible-devices-one-from-a-config-map", {"runtime": {"env": [
        {"name": "HIP_VISIBLE_DEVICES", "value": "0"},
        {"name": "CUDA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "cuda"}}}]}}),
    ("affinity", {"runtime": {"pod": {"affinity": {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "preference": {"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]},
                {"key": "example.com/hbm-gib", "operator": "Gt", "values": ["100"]}]}}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"specdec.io/model": "m"},
                              "matchExpressions": [{"key": "team", "operator": "Exists"}]}}}]}}}}}),
    ("route-in-namespace", {"rollout": {"strategy": "Canary", "canary": {"traffic": {
        "httpRouteRef": {"name": "route.v1", "namespace": "gateway"}}}}}),
]


@pytest.mark.parametrize("overrides", [o for _, o in ACCEPTED], ids=[i for i, _ in ACCEPTED])
def test_what_the_api_server_accepts_is_accepted(overrides: dict[str, Any]) -> None:
    assert spec(**overrides).model.name


# Fields outside the allow-list are unknown to the schema: the API server refuses them (kubectl's strict
# field validation) or prunes them, so they never reach the operator, whose models ignore unknown fields.
SCHEMA_ONLY = "# expect: unknown field"


@pytest.mark.parametrize(
    "manifest", [m for m in INVALID_MANIFESTS if not m.read_text().startswith(SCHEMA_ONLY)], ids=lambda p: p.stem
)
def test_every_invalid_manifest_is_refused_by_the_python_models_too(manifest: Path) -> None:
    body = yaml.safe_load(manifest.read_text())
    with pytest.raises(ValidationError):
        SpeculativeModelSpec.model_validate(body["spec"])


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        (DNS1123_LABEL, ["a", "a-1", "0" * 63], ["A", "-a", "a-", "a.b", "0" * 64, ""]),
        (DNS1123_SUBDOMAIN, ["a.b-c.d", "a" * 253], ["a..b", ".a", "a_b", "a" * 254]),
        (QUALIFIED_NAME, ["a", "A_b.c", "example.com/Key", "a" * 253 + "/" + "b" * 63],
         ["a/b/c", "/a", "a/", "Example.com/a", "a" * 254 + "/b", "b" * 64, "_a"]),
        (LABEL_VALUE, ["", "a", "A-b_c.d", "x" * 63], ["-a", "a ", "x" * 64]),
        (ENV_VAR_NAME, ["A", "a.b-c", "with space", "x" * 256], ["", "A=B", "tab\t", "é", "x" * 257]),
        (CONFIG_KEY, ["token", ".env", "a-b_c.d"], ["", ".", "..", "..a", "a/b"]),
        (IMAGE_REFERENCE, ["busybox", "localhost:5000/a/b:c", "a/b@sha256:" + "f" * 64],
         ["Busybox", "a//b", "a:b:c", "a@sha256:xyz", ":tag"]),
    ],
)
def test_formats_match_apimachinery(fmt: Any, good: list[str], bad: list[str]) -> None:
    assert [text for text in good if not fmt.valid(text)] == []
    assert [text for text in bad if fmt.valid(text)] == []


def test_quantities_parse_as_resource_parse_quantity_does() -> None:
    assert [is_quantity(q) for q in ["1", "0.5", ".5", "5.", "1e3", "1E-3", "64Gi", "+1k", "-1m"]] == [True] * 9
    assert [is_quantity(q) for q in ["", ".", "1.2.3", "16GB", "1 Gi", "one", "1Ki1", "1e"]] == [False] * 8
    assert quantity_value("1.5Gi") == 1536 * 1024**2
    assert quantity_value("500m") * 2 == 1
    assert quantity_value("-1e3") == -1000
