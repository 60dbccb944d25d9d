"""The parts of a runtime pod beyond vLLM itself: security context, the user's pod knobs and the weights cache.

Everything here is rendered exactly as the API server stores it (no `false` or empty values that it would
drop), so `drift.covers` stays exact and a steady pool sees zero writes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from specdec_operator.api.kubeformats import quantity_value
from specdec_operator.api.pod import (
    HF_HOME,
    HF_TOKEN,
    WEIGHTS_CACHE_MOUNT,
    WEIGHTS_CACHE_VOLUME,
    EnvVar,
    ExtraVolume,
    PodOverlay,
)
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.decisions.weights import drafter_weights, target_weights
from specdec_operator.gpu.inventory import GPU_RESOURCE, is_gpu_resource
from specdec_operator.render.drift import canonical_quantity

PodSecurityLevel = Literal["restricted", "baseline"]


@dataclass(frozen=True)
class PodSettings:
    """Installation-wide settings of runtime pods (OperatorEnvSettings; the chart's runtime.pod values)."""

    # restricted: non-root, passes the `restricted` Pod Security Standard. baseline: for images that must
    # run as root; everything else stays locked down.
    security: PodSecurityLevel = "restricted"
    # Group ids that own /dev/kfd and /dev/dri/renderD* on the GPU nodes (video, render): a non-root vLLM
    # opens the GPU only through them. They differ between distributions (docs/runtime-pods.md).
    supplemental_groups: tuple[int, ...] = ()
    # Group that owns writable claims (the weights cache), so the non-root user can write to them.
    fs_group: int | None = None
    # A claim in each model's namespace used as the weights cache unless a model names its own.
    weights_cache_claim: str | None = None


DEFAULT_POD_SETTINGS = PodSettings()


def pod_security_context(settings: PodSettings) -> dict[str, Any]:
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if settings.security == "restricted":
        context["runAsNonRoot"] = True
    if settings.supplemental_groups:
        context["supplementalGroups"] = list(settings.supplemental_groups)
    if settings.fs_group is not None:
        context["fsGroup"] = settings.fs_group
        # A cache of tens of GiB is re-owned only when its root is not ours yet, not at every pod start.
        context["fsGroupChangePolicy"] = "OnRootMismatch"
    return context


def container_security_context() -> dict[str, Any]:
    """What `restricted` asks of every container; also right for root images under `baseline`."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


# Host resources a runtime pod requests unless spec.runtime.resources says otherwise (docs/runtime-pods.md).
# vLLM runs an API server and an engine core, plus one busy-polling worker process per GPU under tensor
# parallelism, each with torch and HIP runtime threads.
CPU_BASE = 2
CPU_PER_GPU = 2
# Resident memory of those processes (Python, torch, the ROCm runtime, HIP graph capture), beyond the weights.
MEMORY_BASE_GIB = 4
MEMORY_PER_GPU_GIB = 6
# /dev/shm: tensor-parallel workers exchange tensors through it (RCCL's shared-memory transport, vLLM's
# message queues); AMD's vLLM images are run with 16G for 8 GPUs. A memory-backed emptyDir counts against
# the container's memory, so its size limit is part of the memory request.
SHM_PER_GPU_GIB = 2


def shm_size_gib(spec: SpeculativeModelSpec) -> int:
    return SHM_PER_GPU_GIB * spec.model.tensor_parallel_size


def loaded_weights_gib(spec: SpeculativeModelSpec) -> float:
    """The target's weights plus the largest drafter the spec lists (0 when the target's size is unknown).

    A pool runs one of the listed drafters or the ngram fallback, which has no weights, so the largest listed
    one bounds what any pool loads; the requests then stay a function of the spec alone and a drafter
    fallback does not change them. A drafter of unknown size is never chosen, so it does not count.
    """
    target = target_weights(spec.model.name, spec.model.weights_gib)
    if target is None:
        return 0.0
    drafters = [drafter_weights(d.method, d.model, d.weights_gib, target) for d in spec.drafters]
    return target.gib + max((d.gib for d in drafters if d is not None), default=0.0)


def derived_requests(spec: SpeculativeModelSpec) -> dict[str, str]:
    """cpu and memory for what the pod runs and loads: the weights are read through the host (page cache,
    and checkpoints that are materialised in process memory before they reach the GPU), so a load of tens of
    GiB is reserved on the node rather than found there."""
    gpus = spec.model.tensor_parallel_size
    memory_gib = math.ceil(
        loaded_weights_gib(spec) + MEMORY_BASE_GIB + MEMORY_PER_GPU_GIB * gpus + shm_size_gib(spec)
    )
    return {"cpu": str(CPU_BASE + CPU_PER_GPU * gpus), "memory": f"{memory_gib}Gi"}


def container_resources(spec: SpeculativeModelSpec, gpu_resource: str = GPU_RESOURCE) -> dict[str, Any]:
    """The runtime container's resources, in the server's canonical form ("0.5" -> "500m").

    spec.runtime.resources wins key by key; derived cpu and memory requests fill the gaps, never above a
    limit the user set. Memory is limited to its request unless the user sets a limit: the node reserved
    exactly that much, so the pod never takes memory from its neighbours, and memory cannot be throttled,
    only reclaimed by killing. cpu gets no limit unless the user sets one: a CPU limit throttles vLLM's
    scheduling loop, and unused reserved cores are worth lending. GPU resources are the operator's: the pool's
    `gpu_resource` (amd.com/gpu, or a partition resource such as amd.com/cpx_nps4).
    """
    user = spec.runtime.resources
    requests = {k: v for k, v in user.requests.items() if not is_gpu_resource(k)}
    limits = {k: v for k, v in user.limits.items() if not is_gpu_resource(k)}
    for name, derived in derived_requests(spec).items():
        if name in requests:
            continue
        limit = limits.get(name)
        requests[name] = limit if limit is not None and quantity_value(limit) < quantity_value(derived) else derived
    limits.setdefault("memory", requests["memory"])
    gpus = str(spec.model.tensor_parallel_size)
    return {
        "requests": {**{k: canonical_quantity(v) for k, v in requests.items()}, gpu_resource: gpus},
        "limits": {**{k: canonical_quantity(v) for k, v in limits.items()}, gpu_resource: gpus},
    }


def weights_cache_claim(spec: SpeculativeModelSpec, settings: PodSettings) -> str | None:
    cache = spec.runtime.weights_cache
    if cache is not None and not cache.enabled:
        return None
    return (cache.claim_name if cache is not None else None) or settings.weights_cache_claim


def owned_env(spec: SpeculativeModelSpec, cache_claim: str | None) -> list[dict[str, Any]]:
    """HF_TOKEN from the hub Secret and HF_HOME on the cache: set by the operator, never by spec.runtime.env."""
    env: list[dict[str, Any]] = []
    source = spec.model.source
    if source and source.hub_secret_ref:
        ref = source.hub_secret_ref
        env.append({"name": HF_TOKEN, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if cache_claim:
        env.append({"name": HF_HOME, "value": WEIGHTS_CACHE_MOUNT})
    return env


def env_from(variables: Sequence[EnvVar], taken: set[str]) -> list[dict[str, Any]]:
    """spec.runtime.env entries that read a Secret or ConfigMap key (plain values go through plan_runtime)."""
    out: list[dict[str, Any]] = []
    for var in variables:
        if var.value_from is None or var.name in taken:
            continue
        source = var.value_from
        ref = source.secret_key_ref or source.config_map_key_ref
        kind = "secretKeyRef" if source.secret_key_ref else "configMapKeyRef"
        assert ref is not None  # the model allows exactly one
        selector: dict[str, Any] = {"name": ref.name, "key": ref.key}
        if ref.optional is not None:
            selector["optional"] = ref.optional
        out.append({"name": var.name, "valueFrom": {kind: selector}})
    return out


def _volume_source(volume: ExtraVolume) -> dict[str, Any]:
    if volume.secret is not None:
        secret: dict[str, Any] = {"secretName": volume.secret.secret_name}
        if volume.secret.optional is not None:
            secret["optional"] = volume.secret.optional
        return {"secret": secret}
    if volume.config_map is not None:
        config_map: dict[str, Any] = {"name": volume.config_map.name}
        if volume.config_map.optional is not None:
            config_map["optional"] = volume.config_map.optional
        return {"configMap": config_map}
    if volume.persistent_volume_claim is not None:
        claim: dict[str, Any] = {"claimName": volume.persistent_volume_claim.claim_name}
        if volume.persistent_volume_claim.read_only:
            claim["readOnly"] = True  # the server omits false
        return {"persistentVolumeClaim": claim}
    assert volume.empty_dir is not None  # the model allows exactly one source
    empty_dir: dict[str, Any] = {}
    if volume.empty_dir.medium:
        empty_dir["medium"] = volume.empty_dir.medium
    if volume.empty_dir.size_limit is not None:
        empty_dir["sizeLimit"] = canonical_quantity(volume.empty_dir.size_limit)
    return {"emptyDir": empty_dir}


def extra_volumes(overlay: PodOverlay) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) of spec.runtime.pod.volumes."""
    volumes = [{"name": volume.name, **_volume_source(volume)} for volume in overlay.volumes]
    mounts: list[dict[str, Any]] = []
    for volume in overlay.volumes:
        mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount_path}
        if volume.read_only:
            mount["readOnly"] = True
        if volume.sub_path:
            mount["subPath"] = volume.sub_path
        mounts.append(mount)
    return volumes, mounts


def cache_volume(claim: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the weights cache: writable, since the first revision downloads into it."""
    return (
        {"name": WEIGHTS_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}},
        {"name": WEIGHTS_CACHE_VOLUME, "mountPath": WEIGHTS_CACHE_MOUNT},
    )


def pod_spec_knobs(overlay: PodOverlay) -> dict[str, Any]:
    """serviceAccountName, priorityClassName and imagePullSecrets, only where set."""
    knobs: dict[str, Any] = {}
    if overlay.service_account_name:
        knobs["serviceAccountName"] = overlay.service_account_name
    if overlay.priority_class_name:
        knobs["priorityClassName"] = overlay.priority_class_name
    if overlay.image_pull_secrets:
        knobs["imagePullSecrets"] = [{"name": ref.name} for ref in overlay.image_pull_secrets]
    return knobs
