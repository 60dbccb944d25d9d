"""The rendered pool: runtime config and vLLM 0.33 args for every method, the pod template, and its revision."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import pytest
from pydantic import ValidationError

from specdec_operator.api.kubeformats import quantity_value
from specdec_operator.api.spec import Drafter
from specdec_operator.api.vocabulary import GFX_TARGETS, REFUSED_METHODS, SPECULATIVE_METHODS
from specdec_operator.render.drift import covers
from specdec_operator.render.podspec import derived_requests
from specdec_operator.render.pool import (
    ENGINE_EXIT_ALLOWANCE_S,
    IMAGE_PULL_ALLOWANCE_S,
    PRE_STOP_WAIT_S,
    STARTUP_PROBE_BUDGET_S,
    revision_of,
)
from specdec_runtime import contract
from specdec_runtime.config import RuntimeConfig, serve_args
from tests.unit.api.specfactories import drafter_wire, spec
from tests.unit.docs.corpus import REPO_ROOT
from tests.unit.render.renderfactories import MODEL, NAMESPACE, UID, rendered_pool

VLLM_SPECULATIVE_KEYS = {
    "method",
    "num_speculative_tokens",
    "model",
    "draft_tensor_parallel_size",
    "prompt_lookup_min",
    "prompt_lookup_max",
}
GPU_TAINT_TOLERATION = {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
REMOVED_FLAGS = ("--speculative-model", "--num-speculative-tokens", "--speculative-draft-tensor-parallel-size")
DRAFTER_MODELS = {
    "draft_model": "meta-llama/Llama-3.2-1B-Instruct",
    "eagle": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    "eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    "dflash": "z-lab/Llama-3.1-8B-DFlash",
    "dspark": "org/Llama-3.1-8B-DSpark",
    "custom_class": "org_proposers.CustomProposer",
}


def flag_value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


def method_drafter(method: str) -> dict[str, Any]:
    extra: dict[str, Any] = {"promptLookupMin": 2, "promptLookupMax": 5} if method in ("ngram", "ngram_gpu") else {}
    if method == "draft_model":
        extra["draftTensorParallelSize"] = 1
    if method == "mtp":
        extra["mtpLayers"] = 2  # K=4 below is a multiple of it, which vLLM accepts
    return drafter_wire(method, DRAFTER_MODELS.get(method), **extra)


@pytest.mark.parametrize("method", [m for m in SPECULATIVE_METHODS if m not in REFUSED_METHODS])
def test_every_method_renders_vllm_033_args(method: str) -> None:
    model = spec(
        model={"servedName": "llama-3.1-8b", "maxModelLen": 16384},
        drafters=[method_drafter(method)],
        speculation={"initialK": 4},
    )
    pool = rendered_pool(model)
    args = serve_args(pool.config)
    assert args[:2] == ["serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert flag_value(args, "--served-model-name") == "llama-3.1-8b"
    assert flag_value(args, "--tensor-parallel-size") == "1"
    assert flag_value(args, "--port") == "8000"
    assert flag_value(args, "--max-model-len") == "16384"
    assert flag_value(args, "--attention-backend") == "ROCM_AITER_FA"
    assert not set(REMOVED_FLAGS) & set(args)
    speculative = json.loads(flag_value(args, "--speculative-config"))
    assert set(speculative) <= VLLM_SPECULATIVE_KEYS
    assert (speculative["method"], speculative["num_speculative_tokens"]) == (method, 4)
    assert speculative.get("model") == DRAFTER_MODELS.get(method)
    if method in ("ngram", "ngram_gpu"):
        assert (speculative["prompt_lookup_min"], speculative["prompt_lookup_max"]) == (2, 5)
    else:
        assert not {"prompt_lookup_min", "prompt_lookup_max"} & set(speculative)
    if method == "draft_model":
        assert speculative["draft_tensor_parallel_size"] == 1


def test_k_zero_renders_no_speculative_config() -> None:
    pool = rendered_pool(spec(drafters=[method_drafter("eagle3")], speculation={"initialK": 0}))
    assert pool.config.speculative is None and pool.config.k == 0
    args = serve_args(pool.config)
    assert "--speculative-config" not in args
    assert "speculative" not in json.loads(pool.config_map["data"][contract.CONFIG_KEY])


def test_config_map_carries_the_exact_runtime_config() -> None:
    pool = rendered_pool(spec(drafters=[method_drafter("eagle3")]))
    assert RuntimeConfig.from_json(pool.config_map["data"][contract.CONFIG_KEY]) == pool.config
    assert pool.config_map["immutable"] is True
    assert re.fullmatch(rf"{MODEL}-gfx942-[0-9a-f]{{10}}", pool.config_map["metadata"]["name"])


@pytest.mark.parametrize(
    ("overrides", "model_arg", "served"),
    [
        # Clients (and the KEDA/HPA examples of docs/autoscaling.md) name the model by its hub id, wherever the
        # weights are read from; not by the SpeculativeModel's name.
        ({}, "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ({"model": {"source": {"pvcName": "weights"}}}, "/models/meta-llama/Llama-3.1-8B-Instruct",
         "meta-llama/Llama-3.1-8B-Instruct"),
        ({"model": {"source": {"pvcName": "weights", "path": "llama31"}}}, "/models/llama31",
         "meta-llama/Llama-3.1-8B-Instruct"),
        ({"model": {"servedName": "chat"}}, "meta-llama/Llama-3.1-8B-Instruct", "chat"),
    ],
    ids=["hub-id", "pvc-default-path", "pvc-path", "served-name"],
)
def test_model_argument_and_served_name(overrides: dict[str, Any], model_arg: str, served: str) -> None:
    args = serve_args(rendered_pool(spec(**overrides)).config)
    assert args[1] == model_arg
    assert flag_value(args, "--served-model-name") == served


def test_tensor_parallel_size_and_gpu_resources_follow_tp() -> None:
    pool = rendered_pool(spec(model={"tensorParallelSize": 4}))
    assert flag_value(serve_args(pool.config), "--tensor-parallel-size") == "4"
    resources = pool.container["resources"]
    assert resources["requests"]["amd.com/gpu"] == resources["limits"]["amd.com/gpu"] == "4"


def test_user_resources_are_kept_but_cannot_change_the_gpu_count() -> None:
    with pytest.raises(ValidationError, match=r"may not set amd\.com/gpu"):
        spec(runtime={"resources": {"requests": {"amd.com/gpu": "1"}}})
    model = spec(
        model={"tensorParallelSize": 2},
        runtime={"resources": {"requests": {"cpu": "16"}, "limits": {"memory": "256Gi"}}},
    )
    resources = rendered_pool(model).container["resources"]
    assert resources == {
        "requests": {"cpu": "16", "memory": derived_requests(model)["memory"], "amd.com/gpu": "2"},
        "limits": {"memory": "256Gi", "amd.com/gpu": "2"},
    }


LLAMA_8B_GIB = 8e9 * 2 / 2**30
LLAMA_70B_GIB = 70e9 * 2 / 2**30


@pytest.mark.parametrize(
    ("model", "drafters", "cpu", "memory_gib"),
    [
        # weights + 4 GiB base + 6 GiB and 2 GiB of /dev/shm per GPU, rounded up; cpu 2 + 2 per GPU
        ({"name": "meta-llama/Llama-3.1-8B-Instruct"}, [], 4, LLAMA_8B_GIB + 4 + 6 + 2),
        ({"name": "meta-llama/Llama-3.1-70B-Instruct", "tensorParallelSize": 8}, [], 18,
         LLAMA_70B_GIB + 4 + 48 + 16),
        # the largest listed drafter counts: a 1B draft model over a 5% EAGLE head
        ({"name": "meta-llama/Llama-3.1-8B-Instruct"},
         [drafter_wire("eagle", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"),
          drafter_wire("draft_model", "meta-llama/Llama-3.2-1B-Instruct")], 4,
         LLAMA_8B_GIB + 1e9 * 2 / 2**30 + 12),
        # a declared size wins over the name; a drafter of unknown size is never chosen, so it adds nothing
        ({"name": "org/house-model", "weightsGib": 40, "tensorParallelSize": 2},
         [drafter_wire("draft_model", "org/house-drafter")], 6, 40 + 4 + 12 + 4),
    ],
    ids=["8b-tp1", "70b-tp8", "largest-drafter", "declared-size"],
)
def test_cpu_and_memory_requests_follow_what_the_pod_loads(
    model: dict[str, Any], drafters: list[dict[str, Any]], cpu: int, memory_gib: float
) -> None:
    body: dict[str, Any] = {"model": model}
    if drafters:
        body["drafters"] = drafters
    resources = rendered_pool(spec(**body)).container["resources"]
    memory = f"{math.ceil(memory_gib)}Gi"
    gpus = resources["requests"]["amd.com/gpu"]
    assert resources["requests"] == {"cpu": str(cpu), "memory": memory, "amd.com/gpu": gpus}
    # Memory is limited to what the node reserved; cpu is not limited (throttling would stall the serving loop).
    assert resources["limits"] == {"memory": memory, "amd.com/gpu": gpus}


@pytest.mark.parametrize(
    ("user", "requests", "limits"),
    [
        ({"requests": {"cpu": "8", "memory": "100Gi"}}, {"cpu": "8", "memory": "100Gi"}, {"memory": "100Gi"}),
        # a limit below the derived request caps the request, so the pair stays valid
        ({"limits": {"cpu": "2", "memory": "8Gi"}}, {"cpu": "2", "memory": "8Gi"}, {"cpu": "2", "memory": "8Gi"}),
        # a limit above it leaves the derived request, with room to burst up to the user's limit
        ({"limits": {"memory": "1Ti"}}, {"cpu": "4", "memory": "27Gi"}, {"memory": "1Ti"}),
        ({"requests": {"ephemeral-storage": "50Gi"}}, {"cpu": "4", "memory": "27Gi", "ephemeral-storage": "50Gi"},
         {"memory": "27Gi"}),
    ],
    ids=["requests", "low-limits", "high-limit", "other-resource"],
)
def test_spec_runtime_resources_override_the_derived_values_key_by_key(
    user: dict[str, Any], requests: dict[str, str], limits: dict[str, str]
) -> None:
    resources = rendered_pool(spec(runtime={"resources": user})).container["resources"]
    assert resources == {"requests": {**requests, "amd.com/gpu": "1"}, "limits": {**limits, "amd.com/gpu": "1"}}


def test_hugepages_alone_are_admitted_since_the_container_always_requests_cpu_and_memory() -> None:
    """The API server refuses hugepages without a cpu or memory request; the derived requests supply both."""
    model = spec(runtime={"resources": {"limits": {"hugepages-2Mi": "512Mi"}}})
    resources = rendered_pool(model).container["resources"]
    assert {"cpu", "memory", "hugepages-2Mi"} <= set(resources["requests"]) | set(resources["limits"])
    assert {"cpu", "memory"} <= set(resources["requests"])


def test_runtime_pods_mount_no_service_account_token() -> None:
    pod = rendered_pool(spec(runtime={"pod": {"serviceAccountName": "vllm"}})).pod
    assert pod["automountServiceAccountToken"] is False


def test_extra_args_pass_through_after_ours() -> None:
    args = serve_args(rendered_pool(spec(runtime={"extraArgs": ["--gpu-memory-utilization=0.92"]})).config)
    assert args[-1] == "--gpu-memory-utilization=0.92"


def test_simulate_switches_the_engine() -> None:
    pool = rendered_pool(spec(runtime={"simulate": True, "simulatorProfile": "chat"}))
    assert (pool.config.engine, pool.config.simulator_profile) == ("simulator", "chat")
    assert pool.template["metadata"]["annotations"][contract.ANNOTATION_SIMULATOR_PROFILE] == "chat"


def test_user_tolerations_are_kept_after_the_gpu_taint_toleration() -> None:
    wanted = {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
    tolerations = [wanted, GPU_TAINT_TOLERATION]
    model = spec(placement={"gfxTargets": ["gfx942"], "tolerations": tolerations})
    assert rendered_pool(model).pod["tolerations"] == [GPU_TAINT_TOLERATION, wanted]


@pytest.mark.parametrize(("tp", "size"), [(1, "2Gi"), (4, "8Gi"), (8, "16Gi")])
def test_dev_shm_is_a_memory_empty_dir_with_a_size_limit_inside_the_memory_request(tp: int, size: str) -> None:
    pool = rendered_pool(spec(model={"tensorParallelSize": tp}))
    shm = next(v for v in pool.pod["volumes"] if v.get("emptyDir"))
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": size}
    assert {"name": shm["name"], "mountPath": "/dev/shm"} in pool.container["volumeMounts"]
    memory = pool.container["resources"]["requests"]["memory"]
    assert quantity_value(memory) >= quantity_value(size) + 4 * 2**30 + tp * 6 * 2**30, "room for shm and processes"


def test_a_rollout_has_time_for_an_image_pull_and_a_cold_load_before_its_progress_deadline() -> None:
    pool = rendered_pool(spec(model={"name": "meta-llama/Llama-3.1-70B-Instruct", "tensorParallelSize": 8}))
    startup = pool.container["startupProbe"]
    startup_budget = startup.get("initialDelaySeconds", 0) + startup["periodSeconds"] * startup["failureThreshold"]
    readiness = pool.container["readinessProbe"]
    ready_after_start = readiness["periodSeconds"] * readiness["failureThreshold"]
    deadline = pool.deployment["spec"]["progressDeadlineSeconds"]
    assert deadline >= startup_budget + ready_after_start + IMAGE_PULL_ALLOWANCE_S
    assert startup_budget >= 1800, "a cold 70B load may take 30 minutes"


def test_probes_on_health_with_a_long_startup_budget() -> None:
    container = rendered_pool(spec()).container
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": contract.PORT_NAME}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= STARTUP_PROBE_BUDGET_S >= 1800
    assert container["ports"] == [{"name": contract.PORT_NAME, "containerPort": 8000, "protocol": "TCP"}]


def test_prometheus_scrape_annotations_point_at_the_metrics_port() -> None:
    annotations = rendered_pool(spec()).template["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
        contract.ANNOTATION_K: "3",
    }


def test_a_crashing_engine_leaves_its_last_log_lines_as_the_termination_message() -> None:
    """vLLM writes no /dev/termination-log: without the fallback a crash shows only its exit code in the pod's
    status (kubectl describe); with it, the kubelet puts the log's tail there (80 lines, 2 KiB)."""
    containers = rendered_pool(spec()).pod["containers"]
    assert [c["terminationMessagePolicy"] for c in containers] == ["FallbackToLogsOnError"]


def test_the_pause_container_is_pid_1_and_reaps_what_the_engine_orphans() -> None:
    """vLLM's engine core and workers are processes of their own; the launcher execs vLLM, which reaps only its own
    children. With the pod's process namespace shared, the pause container is PID 1 and reaps orphans, and vLLM is
    not PID 1, so a SIGTERM before its handlers are installed (while Python imports torch) stops it instead of
    being ignored until the grace period's SIGKILL."""
    pool = rendered_pool(spec())
    assert pool.pod["shareProcessNamespace"] is True
    assert pool.container["command"] == ["vllm"]  # the container's main process: vLLM gets the kubelet's SIGTERM


def test_the_termination_policy_and_shared_namespace_survive_the_servers_defaults() -> None:
    """What the API server stores covers what we render (no endless drift); a Deployment rendered before both
    fields, holding the server's default policy (File), does not: it rolls once."""
    desired = rendered_pool(spec()).deployment
    stored = copy.deepcopy(desired)
    pod = stored["spec"]["template"]["spec"]
    pod.update({"restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler"})
    for container in pod["containers"]:
        container.setdefault("terminationMessagePolicy", "File")  # the server's default, only where unset
        container.update({"terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"})
    assert covers(stored, desired)
    before = copy.deepcopy(stored)
    del before["spec"]["template"]["spec"]["shareProcessNamespace"]
    before["spec"]["template"]["spec"]["containers"][0]["terminationMessagePolicy"] = "File"
    assert not covers(before, desired)


def test_a_vllm_pool_runs_the_images_own_vllm_with_the_arguments_of_its_config() -> None:
    """Any vLLM ROCm image serves as it is (the upstream vllm/vllm-openai-rocm too): the container runs `vllm` with
    the `vllm serve` arguments of the track's config, the ones the contract suite checks; no launcher in between."""
    upstream = spec(runtime={"image": "docker.io/vllm/vllm-openai-rocm:v0.33.0"})
    pool = rendered_pool(upstream)
    assert pool.container["command"] == ["vllm"]
    assert pool.container["args"] == serve_args(RuntimeConfig.model_validate_json(
        pool.config_map["data"][contract.CONFIG_KEY]))
    assert pool.container["args"][:2] == ["serve", upstream.model.name]
    assert "--speculative-config" in pool.container["args"]


def test_the_simulator_is_launched_from_the_mounted_config() -> None:
    pool = rendered_pool(spec(runtime={"simulate": True}))
    config_volume = {"name": contract.CONFIG_VOLUME, "configMap": {"name": pool.config_map["metadata"]["name"]}}
    assert config_volume in pool.pod["volumes"]
    assert pool.container["command"] == ["specdec-runtime", "launch"]
    assert pool.container["args"] == ["--config", f"{contract.CONFIG_MOUNT_PATH}/{contract.CONFIG_KEY}"]


@pytest.mark.parametrize(
    ("gfx", "env"),
    [
        ("gfx942", [{"name": "VLLM_ROCM_USE_AITER", "value": "1"}]),
        ("gfx90a", []),
        ("gfx1101", [{"name": "HSA_OVERRIDE_GFX_VERSION", "value": "11.0.0"}]),
    ],
)
def test_pod_env_per_gfx_target(gfx: str, env: list[dict[str, str]]) -> None:
    pool = rendered_pool(spec(placement={"gfxTargets": [gfx]}), gfx=gfx)
    assert pool.container["env"] == env


def test_hub_secret_becomes_hf_token() -> None:
    model = spec(model={"source": {"hubSecretRef": {"name": "hf"}}})
    env = rendered_pool(model).container["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in env


def test_selectors_match_the_template_labels() -> None:
    pool = rendered_pool(spec(), replicas=3)
    labels = pool.template["metadata"]["labels"]
    deployment = pool.deployment["spec"]
    assert deployment["replicas"] == 3
    assert deployment["selector"]["matchLabels"].items() <= labels.items()
    assert pool.pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_every_owned_object_carries_owner_and_labels() -> None:
    pool = rendered_pool(spec())
    for obj in (pool.config_map, pool.deployment, pool.pdb):
        meta = obj["metadata"]
        assert meta["namespace"] == NAMESPACE
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "specdec.io/v1alpha1",
                "kind": "SpeculativeModel",
                "name": MODEL,
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"][contract.LABEL_MODEL] == MODEL
        assert meta["labels"][contract.LABEL_MANAGED_BY] == contract.MANAGED_BY
        assert all(len(v) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", v)
                   for v in meta["labels"].values())


def test_revision_is_stable_across_renders() -> None:
    first, second = rendered_pool(spec()), rendered_pool(spec())
    assert revision_of(first.template) == revision_of(second.template)
    assert re.fullmatch(r"[0-9a-f]{10}", revision_of(first.template))
    assert first.deployment == second.deployment


@pytest.mark.parametrize(
    "change",
    [
        {"speculation": {"initialK": 5}},
        {"model": {"maxModelLen": 8192}},
        {"runtime": {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}},
        {"runtime": {"extraArgs": ["--enforce-eager"]}},
        {"placement": {"nodeSelector": {"zone": "a"}}},
        {"drafters": [drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")]},
    ],
    ids=["initial-k", "max-model-len", "env", "extra-args", "node-selector", "drafter"],
)
def test_a_change_rolls_and_reverting_it_returns_the_same_revision(change: dict[str, Any]) -> None:
    before = revision_of(rendered_pool(spec()).template)
    changed = revision_of(rendered_pool(spec(**change)).template)
    after = revision_of(rendered_pool(spec()).template)
    assert changed != before
    assert after == before


def test_k_change_alone_changes_the_revision() -> None:
    model = spec(drafters=[drafter_wire("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")])
    revisions = {k: revision_of(rendered_pool(model, k=k).template) for k in (2, 3, 4, 3)}
    assert len(set(revisions.values())) == 3


def test_stable_and_canary_of_the_same_content_share_the_revision() -> None:
    stable, canary = rendered_pool(spec(), track="stable"), rendered_pool(spec(), track="canary")
    assert revision_of(stable.template) == revision_of(canary.template)
    assert canary.deployment["metadata"]["name"] == f"{MODEL}-gfx942-canary"
    assert canary.template["metadata"]["labels"][contract.LABEL_TRACK] == "canary"


def test_drafter_override_renders_the_chosen_drafter() -> None:
    model = spec(drafters=[drafter_wire("draft_model", "Qwen/Qwen2.5-14B-Instruct")])
    pool = rendered_pool(model, gfx="gfx1100", drafter=Drafter(method="ngram"))
    speculative = json.loads(flag_value(serve_args(pool.config), "--speculative-config"))
    assert speculative == {"method": "ngram", "num_speculative_tokens": 3}
    assert flag_value(serve_args(pool.config), "--attention-backend") == "TRITON_ATTN"


MLA_FLAG = "--attention-config.backend_per_kind.mla_attention"
# What vLLM 0.33's RocmPlatform accepts and puts first per gfx target for the layers of each attention kind
# (tests/contract/test_vllm_runtime.py asks vLLM itself): (standard layers, MLA layers).
BACKENDS_PER_GFX = {
    "gfx90a": ("TRITON_ATTN", "TRITON_MLA"),
    "gfx942": ("ROCM_AITER_FA", "ROCM_AITER_MLA"),
    "gfx950": ("ROCM_AITER_FA", "ROCM_AITER_MLA"),
    "gfx1100": ("TRITON_ATTN", "TRITON_MLA"),
    "gfx1101": ("TRITON_ATTN", "TRITON_MLA"),
    "gfx1150": ("TRITON_ATTN", "TRITON_MLA"),
    "gfx1151": ("TRITON_ATTN", "TRITON_MLA"),
    "gfx1200": ("TRITON_ATTN", "TRITON_MLA"),
    "gfx1201": ("TRITON_ATTN", "TRITON_MLA"),
}


def mla_options(args: list[str]) -> list[str]:
    return [arg for arg in args if arg.startswith(f"{MLA_FLAG}=")]


def test_the_backend_table_covers_every_gfx_target() -> None:
    assert set(BACKENDS_PER_GFX) == set(GFX_TARGETS)


@pytest.mark.parametrize("gfx", sorted(BACKENDS_PER_GFX))
def test_an_mla_target_gets_the_mla_backend_of_its_gfx_target_for_its_mla_layers(gfx: str) -> None:
    model = spec(
        model={"name": "deepseek-ai/DeepSeek-V3", "attention": "MLA"},
        drafters=[drafter_wire("mtp", mtpLayers=1)],
        speculation={"initialK": 1},
        placement={"gfxTargets": [gfx]},
    )
    args = serve_args(rendered_pool(model, gfx=gfx).config)
    standard, mla = BACKENDS_PER_GFX[gfx]
    # Drafter layers with standard attention (eagle3 heads, small draft models) keep the global backend.
    assert flag_value(args, "--attention-backend") == standard
    assert mla_options(args) == [f"{MLA_FLAG}={mla}"]
    assert args.index("--attention-backend") < args.index(f"{MLA_FLAG}={mla}")


@pytest.mark.parametrize("gfx", sorted(BACKENDS_PER_GFX))
def test_a_standard_target_renders_no_mla_backend(gfx: str) -> None:
    model = spec(placement={"gfxTargets": [gfx]})
    assert model.model.attention == "Standard"
    pool = rendered_pool(model, gfx=gfx)
    args = serve_args(pool.config)
    assert flag_value(args, "--attention-backend") == BACKENDS_PER_GFX[gfx][0]
    assert mla_options(args) == []
    assert "mla_attention_backend" not in json.loads(pool.config.to_json())


def test_the_mla_backend_survives_the_config_map_round_trip() -> None:
    pool = rendered_pool(spec(model={"attention": "MLA"}), gfx="gfx942")
    config = RuntimeConfig.from_json(pool.config_map["data"][contract.CONFIG_KEY])
    assert config.mla_attention_backend == "ROCM_AITER_MLA"
    assert mla_options(serve_args(config)) == [f"{MLA_FLAG}=ROCM_AITER_MLA"]


def test_a_users_mla_backend_in_extra_args_is_refused_at_admission() -> None:
    """vLLM takes a later per-kind backend over the one rendered for each gfx target
    (tests/contract: test_a_users_mla_backend_in_extra_args_would_win_so_admission_refuses_it), and one
    value for every pool can name a backend a pool's gfx target lacks: extraArgs may not set it."""
    with pytest.raises(ValidationError, match="nor backend_per_kind"):
        spec(model={"attention": "MLA"}, runtime={"extraArgs": [f"{MLA_FLAG}=TRITON_MLA"]})
    args = serve_args(rendered_pool(spec(model={"attention": "MLA"}), gfx="gfx942").config)
    assert mla_options(args) == [f"{MLA_FLAG}=ROCM_AITER_MLA"]


@pytest.mark.parametrize("drain", [None, 0, 300])
def test_a_pod_being_removed_leaves_its_routes_then_drains_within_its_grace_period(drain: int | None) -> None:
    """Without this, vLLM 0.33 (--shutdown-timeout 0 by default) aborts every request in flight at the kubelet's
    SIGTERM, and requests routed while Services and Gateways still list the pod fail: 5xx through every rollout.
    The preStop sleep keeps the pod serving while they drop it; vLLM then drains for spec.runtime.drainSeconds;
    the grace period covers both and vLLM's exit, so the SIGKILL never cuts a drain short."""
    pool = rendered_pool(spec(runtime={} if drain is None else {"drainSeconds": drain}))
    seconds = 30 if drain is None else drain
    assert pool.container["lifecycle"] == {"preStop": {"sleep": {"seconds": PRE_STOP_WAIT_S}}}
    assert pool.pod["terminationGracePeriodSeconds"] == PRE_STOP_WAIT_S + seconds + ENGINE_EXIT_ALLOWANCE_S
    args = pool.container["args"]
    assert pool.config.shutdown_timeout == seconds
    if seconds:
        assert args[args.index("--shutdown-timeout") + 1] == str(seconds)
    else:
        assert "--shutdown-timeout" not in args, "0 is vLLM's own default: abort"
    simulated = rendered_pool(spec(runtime={"simulate": True, "drainSeconds": 5}))
    assert "--shutdown-timeout" in serve_args(simulated.config), "the simulator drains as vLLM does"


def test_drain_seconds_is_bounded_and_the_flag_is_the_operators() -> None:
    with pytest.raises(ValidationError, match=r"drain_seconds|drainSeconds"):
        spec(runtime={"drainSeconds": -1})
    with pytest.raises(ValidationError, match="--shutdown-timeout"):
        spec(runtime={"extraArgs": ["--shutdown-timeout=60"]})


def test_the_drain_table_in_the_docs_states_the_rendered_numbers() -> None:
    text = (REPO_ROOT / "docs" / "runtime-pods.md").read_text()
    default = spec().runtime.drain_seconds
    assert f"| `lifecycle.preStop.sleep.seconds` | {PRE_STOP_WAIT_S} |" in text
    assert f"`spec.runtime.drainSeconds` (default {default};" in text
    assert (f"| {PRE_STOP_WAIT_S} + `drainSeconds` + {ENGINE_EXIT_ALLOWANCE_S} "
            f"(default {PRE_STOP_WAIT_S + default + ENGINE_EXIT_ALLOWANCE_S}) |") in text
