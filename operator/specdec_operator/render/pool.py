"""Builders for one pool: runtime config, its ConfigMap, the Deployment and the PodDisruptionBudget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec_operator.api.pod import MODELS_MOUNT, MODELS_VOLUME, SHM_MOUNT, SHM_VOLUME
from specdec_operator.api.spec import Drafter, SpeculativeModelSpec
from specdec_operator.decisions.placement import honoured_tolerations
from specdec_operator.decisions.runtime_env import RuntimePlan
from specdec_operator.gpu.devices import BUILTIN_DEVICES, DeviceTable
from specdec_operator.gpu.inventory import GPU_RESOURCE
from specdec_operator.render import podspec
from specdec_operator.render.affinity import gfx_node_affinity, with_extra_affinity
from specdec_operator.render.names import (
    content_hash,
    deployment_name,
    label_value,
    owner_reference,
    pool_labels,
)
from specdec_runtime import contract
from specdec_runtime.config import RuntimeConfig, SpeculativeSettings, serve_args

# Model load on a big GPU can take many minutes; /health answers only after it (vLLM binds first).
STARTUP_PROBE_BUDGET_S = 1800
# Before the startup probe runs, the node pulls the runtime image (ROCm vLLM images are tens of GB).
IMAGE_PULL_ALLOWANCE_S = 900
# A rollout reports ProgressDeadlineExceeded only when a new pod took longer than a pull, a cold load and a few
# minutes for scheduling and the first readiness probes may take (50 min); the Deployment default (600 s) would
# declare every cold 70B rollout failed while it still loads.
PROGRESS_DEADLINE_S = IMAGE_PULL_ALLOWANCE_S + STARTUP_PROBE_BUDGET_S + 300
# A pod being removed keeps serving while the endpoints controller, kube-proxy and Gateways drop it (they learn of
# the deletion by watch, seconds apart): its preStop hook only waits, so nothing new reaches it after its SIGTERM.
PRE_STOP_WAIT_S = 10
# After the drain (spec.runtime.drainSeconds, vLLM's --shutdown-timeout), vLLM stops its engine core and workers.
ENGINE_EXIT_ALLOWANCE_S = 30


def termination_grace_s(spec: SpeculativeModelSpec) -> int:
    """The kubelet's SIGKILL deadline, counted from the deletion: the preStop wait, the drain, vLLM's exit."""
    return PRE_STOP_WAIT_S + spec.runtime.drain_seconds + ENGINE_EXIT_ALLOWANCE_S


@dataclass(frozen=True)
class PoolIdentity:
    """Everything that identifies where a pool's objects live and who owns them."""

    namespace: str
    model: str
    model_uid: str
    pool: str
    gfx: str


def runtime_config(spec: SpeculativeModelSpec, drafter: Drafter, k: int) -> RuntimeConfig:
    speculative = None
    if k > 0:
        speculative = SpeculativeSettings(
            method=drafter.method,
            num_speculative_tokens=k,
            model=drafter.model,
            draft_tensor_parallel_size=drafter.draft_tensor_parallel_size,
            prompt_lookup_min=drafter.prompt_lookup_min,
            prompt_lookup_max=drafter.prompt_lookup_max,
        )
    model_path = spec.model.name
    if spec.model.source and spec.model.source.pvc_name:
        model_path = f"{MODELS_MOUNT}/{spec.model.source.path or spec.model.name}"
    return RuntimeConfig(
        model=model_path,
        served_model_name=spec.model.served_name or spec.model.name,
        tensor_parallel_size=spec.model.tensor_parallel_size,
        max_model_len=spec.model.max_model_len,
        speculative=speculative,
        extra_args=list(spec.runtime.extra_args),
        engine="simulator" if spec.runtime.simulate else "vllm",
        simulator_profile=spec.runtime.simulator_profile,
        shutdown_timeout=spec.runtime.drain_seconds,
    )


def with_attention_backend(config: RuntimeConfig, backend: str, mla_backend: str | None = None) -> RuntimeConfig:
    """`backend` serves standard attention layers; `mla_backend`, set for an MLA target, serves its MLA layers."""
    return config.model_copy(update={"attention_backend": backend, "mla_attention_backend": mla_backend})


def config_map(ctx: PoolIdentity, config: RuntimeConfig) -> dict[str, Any]:
    """Content-addressed, so a canary and its stable revision can each mount their own config."""
    body = config.to_json()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{ctx.pool}-{content_hash(body)}",
            "namespace": ctx.namespace,
            "labels": pool_labels(ctx.model, ctx.pool, ctx.gfx),
            "ownerReferences": [owner_reference(ctx.model, ctx.model_uid)],
        },
        "immutable": True,
        "data": {contract.CONFIG_KEY: body},
    }


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": contract.PORT_NAME},
        "periodSeconds": period_s,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _env_var(name: str, value: str) -> dict[str, str]:
    # core/v1 EnvVar.value is omitempty: the server stores an empty value as no `value` key at all.
    return {"name": name, "value": value} if value else {"name": name}


@dataclass(frozen=True)
class PoolTrack:
    """One track of a pool (stable, or the canary beside it): what its pods run."""

    name: str  # contract.LABEL_TRACK's value
    k: int
    config_map: str  # the name of the ConfigMap holding the track's runtime config
    # The arguments of `vllm` when the pool runs vLLM (`engine_args`); empty: the launcher runs the simulator.
    engine_args: tuple[str, ...] = ()


# The executable of every vLLM image, the upstream vllm/vllm-openai-rocm ones as much as ours.
VLLM_COMMAND = "vllm"
LAUNCHER_COMMAND = ("specdec-runtime", "launch")


def engine_args(config: RuntimeConfig) -> tuple[str, ...]:
    """What a vLLM pool's container runs after `vllm`: the config's `vllm serve` arguments, the ones the contract
    suite checks against vLLM. The container runs the image's own vLLM with them, no launcher in between, so any
    vLLM ROCm image serves as it is. The simulator (spec.runtime.simulate) keeps the launcher: () here."""
    return tuple(serve_args(config)) if config.engine == "vllm" else ()


@dataclass(frozen=True)
class NodeTargeting:
    """Which nodes and GPU resource the pool plan sends pods to.

    `excluded_nodes`: the pool plan's nodes that the gfx affinity's labels cannot keep pods off.
    `gpu_resource` and `devices`: the pool plan's resource and the device table placement used."""

    excluded_nodes: Sequence[str] = ()
    gpu_resource: str = GPU_RESOURCE
    devices: DeviceTable = BUILTIN_DEVICES


ANY_NODE = NodeTargeting()


def pod_template(
    ctx: PoolIdentity,
    spec: SpeculativeModelSpec,
    runtime: RuntimePlan,
    track: PoolTrack,
    targeting: NodeTargeting = ANY_NODE,
    pod_settings: podspec.PodSettings = podspec.DEFAULT_POD_SETTINGS,
) -> dict[str, Any]:
    """The pod template of one track of a pool; its revision label names its content."""
    cache_claim = podspec.weights_cache_claim(spec, pod_settings)
    owned_env = podspec.owned_env(spec, cache_claim)
    owned_names = {var["name"] for var in owned_env}
    env: list[dict[str, Any]] = [
        _env_var(key, value) for key, value in sorted(runtime.env.items()) if key not in owned_names
    ] + owned_env
    env += podspec.env_from(spec.runtime.env, {var["name"] for var in env})
    overlay = spec.runtime.pod
    volumes, mounts = _volumes(spec, track, cache_claim)
    annotations = _annotations(spec, track)
    container = _container(spec, runtime, track, env, mounts, targeting)
    spec_body: dict[str, Any] = {
        "affinity": with_extra_affinity(
            gfx_node_affinity(
                ctx.gfx,
                # A partition resource (amd.com/cpx_nps4) pins the partition itself, labelled or not.
                spec.placement.partition if targeting.gpu_resource == GPU_RESOURCE else None,
                spec.placement.node_selector,
                targeting.excluded_nodes,
                targeting.devices,
            ),
            overlay.affinity,
        ),
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_s(spec),
        # Zombie reaping by the platform rather than by an init of ours: in a shared process namespace the pause
        # container is PID 1 and reaps the engine core and worker processes vLLM leaves orphaned. The launcher
        # still execs vLLM, the container's main process, so the kubelet's SIGTERM reaches vLLM's own handler
        # (graceful shutdown), and vLLM is no longer a PID 1 that ignores a SIGTERM arriving before that handler
        # is installed (while it imports) until the grace period ends in SIGKILL. The pod renders no other
        # container to see vLLM's processes (an injected sidecar would: docs/runtime-pods.md).
        "shareProcessNamespace": True,
        "securityContext": podspec.pod_security_context(pod_settings),
        # vLLM never calls the Kubernetes API: a mounted token would only be a credential to steal.
        "automountServiceAccountToken": False,
        **podspec.pod_spec_knobs(overlay),
        "tolerations": [toleration.to_wire() for toleration in honoured_tolerations(spec.placement.tolerations)],
    }
    labels = {**overlay.labels, **pool_labels(ctx.model, ctx.pool, ctx.gfx), contract.LABEL_TRACK: track.name}
    template = {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec_body}
    # The revision names the template's content, so reverting a change returns to the same revision. The
    # user's labels are part of it (only when set, so templates without them keep their revision).
    hashed: dict[str, Any] = {"annotations": annotations, **({"labels": overlay.labels} if overlay.labels else {})}
    revision = content_hash({"metadata": hashed, "spec": spec_body})
    template["metadata"]["labels"] = {**labels, contract.LABEL_REVISION: revision}
    return template


def _container(
    spec: SpeculativeModelSpec, runtime: RuntimePlan, track: PoolTrack, env: list[dict[str, Any]],
    mounts: list[dict[str, Any]], targeting: NodeTargeting,
) -> dict[str, Any]:
    """The one container: the image's vLLM with the rendered arguments (its main process, so it gets the kubelet's
    SIGTERM), or the launcher, which execs the simulator with the mounted config."""
    if track.engine_args:
        command, args = [VLLM_COMMAND], list(track.engine_args)
    else:
        command, args = list(LAUNCHER_COMMAND), ["--config", f"{contract.CONFIG_MOUNT_PATH}/{contract.CONFIG_KEY}"]
    return {
        "name": contract.CONTAINER_NAME,
        "image": runtime.image,
        "command": command,
        "args": args,
        "env": env,
        "ports": [{"name": contract.PORT_NAME, "containerPort": 8000, "protocol": "TCP"}],
        "resources": podspec.container_resources(spec, targeting.gpu_resource),
        "volumeMounts": mounts,
        "startupProbe": _probe(10, STARTUP_PROBE_BUDGET_S // 10),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 6),
        "securityContext": podspec.container_security_context(),
        # vLLM writes no /dev/termination-log: on a crash the kubelet takes the log's last lines (80, 2 KiB) as
        # the container's termination message, so the pod's status says why (the server's default, File, says
        # nothing but the exit code).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Kubernetes' own sleep action, not `sh -c sleep`: any image works, distroless ones too.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_WAIT_S}}},
    }


def _volumes(
    spec: SpeculativeModelSpec, track: PoolTrack, cache_claim: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, the container's mounts): its config, shared memory, the model's PVC, the weights cache and the
    user's own."""
    source = spec.model.source
    mounts: list[dict[str, Any]] = [
        {"name": contract.CONFIG_VOLUME, "mountPath": contract.CONFIG_MOUNT_PATH, "readOnly": True},
        {"name": SHM_VOLUME, "mountPath": SHM_MOUNT},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": contract.CONFIG_VOLUME, "configMap": {"name": track.config_map}},
        # vLLM's tensor-parallel workers exchange tensors through shared memory; the default 64Mi is too small.
        # Memory-backed, so it counts against the container's memory: bounded, and part of the memory request.
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{podspec.shm_size_gib(spec)}Gi"}},
    ]
    if source and source.pvc_name:
        mounts.append({"name": MODELS_VOLUME, "mountPath": MODELS_MOUNT, "readOnly": True})
        volumes.append(
            {"name": MODELS_VOLUME, "persistentVolumeClaim": {"claimName": source.pvc_name, "readOnly": True}}
        )
    if cache_claim:
        cache_volume, cache_mount = podspec.cache_volume(cache_claim)
        volumes.append(cache_volume)
        mounts.append(cache_mount)
    user_volumes, user_mounts = podspec.extra_volumes(spec.runtime.pod)
    return volumes + user_volumes, mounts + user_mounts


def _annotations(spec: SpeculativeModelSpec, track: PoolTrack) -> dict[str, str]:
    """The pod's annotations: the user's, then where Prometheus scrapes it, its simulator profile and its K."""
    annotations: dict[str, str] = {
        **spec.runtime.pod.annotations,
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(8000),
        "prometheus.io/path": "/metrics",
    }
    if spec.runtime.simulator_profile:
        annotations[contract.ANNOTATION_SIMULATOR_PROFILE] = spec.runtime.simulator_profile
    annotations[contract.ANNOTATION_K] = str(track.k)
    return annotations


def revision_of(template: dict[str, Any]) -> str:
    return str(template["metadata"]["labels"][contract.LABEL_REVISION])


def deployment_revision(deployment: Mapping[str, Any] | None) -> str | None:
    """The revision a Deployment's pod template carries (live or desired); None when it has none."""
    labels = (deployment or {}).get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
    revision = labels.get(contract.LABEL_REVISION)
    return str(revision) if revision else None


def rolling_strategy(max_surge: int = 1, max_unavailable: int = 0) -> dict[str, Any]:
    """The Deployment's rolling update. The default never goes below the desired count (a replica is
    expensive to restart: model load); on a full pool the rollout decision replaces in place instead
    (maxSurge 0), since a surge pod would stay Pending there forever."""
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable, "maxSurge": max_surge}}


def deployment(ctx: PoolIdentity, template: dict[str, Any], replicas: int, track: str) -> dict[str, Any]:
    selector = {
        contract.LABEL_MODEL: label_value(ctx.model),
        contract.LABEL_POOL: ctx.pool,
        contract.LABEL_TRACK: track,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(ctx.pool, track),
            "namespace": ctx.namespace,
            "labels": {**pool_labels(ctx.model, ctx.pool, ctx.gfx), contract.LABEL_TRACK: track},
            "ownerReferences": [owner_reference(ctx.model, ctx.model_uid)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": PROGRESS_DEADLINE_S,
            "strategy": rolling_strategy(),
            "template": template,
        },
    }


def pod_disruption_budget(ctx: PoolIdentity) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": ctx.pool,
            "namespace": ctx.namespace,
            "labels": pool_labels(ctx.model, ctx.pool, ctx.gfx),
            "ownerReferences": [owner_reference(ctx.model, ctx.model_uid)],
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {contract.LABEL_MODEL: label_value(ctx.model), contract.LABEL_POOL: ctx.pool}},
        },
    }

