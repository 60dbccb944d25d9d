"""Runtime pods beyond vLLM: the ROCm-ready securityContext, the user's pod knobs and the weights cache."""

from __future__ import annotations

from typing import Any

import pytest

from specdec_operator.render.drift import covers
from specdec_operator.render.podspec import PodSettings
from specdec_operator.render.pool import revision_of
from specdec_operator.settings import OperatorEnvSettings
from specdec_runtime import contract
from tests.unit.api.specfactories import spec
from tests.unit.render.renderfactories import rendered_pool

GPU_GROUPS = PodSettings(supplemental_groups=(44, 992), fs_group=10001)

KNOBS: dict[str, Any] = {
    "env": [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key", "optional": False}}},
        {"name": "TUNING", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "profile"}}},
    ],
    "pod": {
        "labels": {"team": "inference", "example.com/cost-center": "42"},
        "annotations": {"example.com/owner": "ml-platform"},
        "serviceAccountName": "vllm",
        "priorityClassName": "inference-high",
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [
            {"name": "certs", "mountPath": "/etc/certs", "readOnly": True, "secret": {"secretName": "ca"}},
            {"name": "templates", "mountPath": "/templates", "configMap": {"name": "chat", "optional": True}},
            {"name": "data", "mountPath": "/data", "subPath": "x", "persistentVolumeClaim": {"claimName": "d"}},
            {"name": "scratch", "mountPath": "/scratch", "emptyDir": {"sizeLimit": "1.5Gi"}},
        ],
    },
}


def test_restricted_security_context_by_default() -> None:
    pool = rendered_pool(spec(), pod_settings=GPU_GROUPS)
    assert pool.pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "supplementalGroups": [44, 992],
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    assert pool.container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_baseline_opt_down_only_drops_run_as_non_root() -> None:
    pool = rendered_pool(spec(), pod_settings=PodSettings(security="baseline"))
    assert pool.pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pool.container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_operator_settings_carry_the_pod_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_RUNTIME_SUPPLEMENTAL_GROUPS", "[39, 998]")
    monkeypatch.setenv("SPECDEC_RUNTIME_POD_SECURITY", "baseline")
    monkeypatch.setenv("SPECDEC_WEIGHTS_CACHE_CLAIM", "hf-cache")
    settings = OperatorEnvSettings().pod_settings
    assert settings == PodSettings(
        security="baseline", supplemental_groups=(39, 998), fs_group=10001, weights_cache_claim="hf-cache"
    )


def test_every_pod_knob_is_rendered() -> None:
    pool = rendered_pool(spec(runtime=KNOBS))
    meta = pool.template["metadata"]
    assert {"team": "inference", "example.com/cost-center": "42"}.items() <= meta["labels"].items()
    assert meta["annotations"]["example.com/owner"] == "ml-platform"
    assert meta["annotations"]["prometheus.io/scrape"] == "true"
    assert (pool.pod["serviceAccountName"], pool.pod["priorityClassName"]) == ("vllm", "inference-high")
    assert pool.pod["imagePullSecrets"] == [{"name": "registry"}]
    env = pool.container["env"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in env
    assert env[-2:] == [
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key", "optional": False}}},
        {"name": "TUNING", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "profile"}}},
    ]
    # Rendered as the API server stores them: no `readOnly: false`, quantities in canonical form.
    assert pool.pod["volumes"][-4:] == [
        {"name": "certs", "secret": {"secretName": "ca"}},
        {"name": "templates", "configMap": {"name": "chat", "optional": True}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "1536Mi"}},
    ]
    assert pool.container["volumeMounts"][-4:] == [
        {"name": "certs", "mountPath": "/etc/certs", "readOnly": True},
        {"name": "templates", "mountPath": "/templates"},
        {"name": "data", "mountPath": "/data", "subPath": "x"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]


def test_the_operators_own_fields_win_over_nothing_and_stay_in_place() -> None:
    pool = rendered_pool(spec(runtime=KNOBS))
    labels = pool.template["metadata"]["labels"]
    assert labels[contract.LABEL_POOL] == "llama8b-gfx942"
    assert pool.container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert pool.container["resources"]["limits"]["amd.com/gpu"] == "1"
    names = [volume["name"] for volume in pool.pod["volumes"]]
    assert names[:2] == [contract.CONFIG_VOLUME, "dshm"] and len(set(names)) == len(names)


@pytest.mark.parametrize(
    "knob",
    [
        {"pod": {"labels": {"team": "a"}}},
        {"pod": {"annotations": {"example.com/x": "1"}}},
        {"pod": {"serviceAccountName": "vllm"}},
        {"pod": {"priorityClassName": "high"}},
        {"pod": {"imagePullSecrets": [{"name": "r"}]}},
        {"pod": {"volumes": [{"name": "s", "mountPath": "/s", "emptyDir": {}}]}},
        {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        {"weightsCache": {"claimName": "hf"}},
    ],
    ids=["labels", "annotations", "service-account", "priority", "pull-secrets", "volumes", "env-from", "cache"],
)
def test_every_knob_changes_the_revision_and_removing_it_restores_the_old_one(knob: dict[str, Any]) -> None:
    before = rendered_pool(spec())
    with_knob = rendered_pool(spec(runtime=knob))
    assert revision_of(with_knob.template) != revision_of(before.template)
    assert revision_of(rendered_pool(spec()).template) == revision_of(before.template)
    # Removing a knob must be visible to drift detection, or the live pod would keep it forever.
    assert not covers(with_knob.deployment, before.deployment)


def test_rendered_knobs_cover_the_server_defaulted_form() -> None:
    desired = rendered_pool(spec(runtime=KNOBS)).deployment
    live: dict[str, Any] = {**desired, "spec": {**desired["spec"], "template": {**desired["spec"]["template"]}}}
    pod = {**live["spec"]["template"]["spec"]}
    # What the API server adds: defaultMode on Secret/ConfigMap volumes, the deprecated serviceAccount field.
    pod["volumes"] = [
        {**v, **({k: {**v[k], "defaultMode": 420} for k in ("secret", "configMap") if k in v})} for v in pod["volumes"]
    ]
    pod["serviceAccount"] = pod["serviceAccountName"]
    pod["dnsPolicy"] = "ClusterFirst"
    live["spec"]["template"]["spec"] = pod
    assert covers(live, desired)


def test_weights_cache_from_the_spec_or_the_installation() -> None:
    own = rendered_pool(spec(runtime={"weightsCache": {"claimName": "llama-cache"}}))
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "llama-cache"}} in own.pod["volumes"]
    assert {"name": "hf-cache", "mountPath": "/var/cache/huggingface"} in own.container["volumeMounts"]
    assert {"name": "HF_HOME", "value": "/var/cache/huggingface"} in own.container["env"]
    shared = rendered_pool(spec(), pod_settings=PodSettings(weights_cache_claim="hf-shared"))
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-shared"}} in shared.pod["volumes"]
    off = rendered_pool(spec(runtime={"weightsCache": {"enabled": False}}), pod_settings=PodSettings(
        weights_cache_claim="hf-shared"))
    assert all(volume["name"] != "hf-cache" for volume in off.pod["volumes"])
    assert all(var["name"] != "HF_HOME" for var in off.container["env"])


def test_a_k_change_keeps_the_same_cache_claim() -> None:
    model = spec(runtime={"weightsCache": {"claimName": "llama-cache"}})
    k3, k5 = rendered_pool(model, k=3), rendered_pool(model, k=5)
    assert revision_of(k3.template) != revision_of(k5.template)
    claim = {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "llama-cache"}}
    assert claim in k3.pod["volumes"] and claim in k5.pod["volumes"]


def test_installation_cache_overrides_a_users_plain_hf_home_without_duplicating_it() -> None:
    model = spec(runtime={"env": [{"name": "HF_HOME", "value": "/mine"}]})
    env = rendered_pool(model, pod_settings=PodSettings(weights_cache_claim="hf")).container["env"]
    assert [var for var in env if var["name"] == "HF_HOME"] == [{"name": "HF_HOME", "value": "/var/cache/huggingface"}]
    without_cache = rendered_pool(model).container["env"]
    assert {"name": "HF_HOME", "value": "/mine"} in without_cache


def test_extra_affinity_joins_the_gfx_rules_without_touching_them() -> None:
    plain = rendered_pool(spec()).pod["affinity"]
    anti = {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                "labelSelector": {"matchLabels": {"specdec.io/model": "llama8b"}}}}
    near = {"weight": 20, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
    model = spec(runtime={"pod": {"affinity": {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [near]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [anti]}}}})
    affinity = rendered_pool(model).pod["affinity"]
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    assert affinity["nodeAffinity"][required] == plain["nodeAffinity"][required]
    # Empty lists and maps are left out, as the API server stores them.
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [near]
    assert affinity["podAntiAffinity"] == {"preferredDuringSchedulingIgnoredDuringExecution": [anti]}
    assert "podAffinity" not in affinity
