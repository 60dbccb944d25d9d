"""`spec.runtime` parts that land in the runtime pod: environment, resources, pod knobs and the weights cache.

The pod knobs are an allow-list: what a serving platform needs to customise (pull secrets, service
account, priority, labels, annotations, env from Secrets and ConfigMaps, extra volumes, the HF cache).
The fields the operator owns (GPU resources, gfx affinity, ports, probes, K, its labels, annotations,
volumes and mount paths) are not in the list, and admission says so where a knob could reach them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from specdec_operator.api.affinity import ExtraAffinity
from specdec_operator.api.base import ApiModel, cel
from specdec_operator.api.kubeformats import (
    CONFIG_KEY,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_VAR_NAME,
    LABEL_VALUE,
    QUALIFIED_NAME,
    check_keys,
    formatted,
    is_quantity,
    keys_rule,
    quantity_value,
)
from specdec_operator.api.resources import Resources
from specdec_runtime import contract

__all__ = ["EnvVar", "PodOverlay", "Resources", "WeightsCache"]

# The operator's own volumes and where the runtime container mounts them (render/pool.py, render/podspec.py).
MODELS_VOLUME, MODELS_MOUNT = "models", "/models"
SHM_VOLUME, SHM_MOUNT = "dshm", "/dev/shm"
WEIGHTS_CACHE_VOLUME, WEIGHTS_CACHE_MOUNT = "hf-cache", "/var/cache/huggingface"
OWNED_VOLUMES: tuple[str, ...] = (contract.CONFIG_VOLUME, SHM_VOLUME, MODELS_VOLUME, WEIGHTS_CACHE_VOLUME)
OWNED_MOUNT_PATHS: tuple[str, ...] = (contract.CONFIG_MOUNT_PATH, SHM_MOUNT, MODELS_MOUNT, WEIGHTS_CACHE_MOUNT)
# Label keys the operator sets on every runtime pod; selectors and scrapes rely on them.
OWNED_LABEL_PREFIX = "specdec.io/"
OWNED_LABELS: tuple[str, ...] = ("app.kubernetes.io/name", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")
OWNED_ANNOTATIONS: tuple[str, ...] = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
# Environment the operator sets itself: HF_TOKEN from model.source.hubSecretRef, HF_HOME for the cache.
HF_TOKEN = "HF_TOKEN"
HF_HOME = "HF_HOME"

_LIST_MAP_BY_NAME: JsonDict = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _unique_names(field: str, names: list[str]) -> None:
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{field}: duplicate name {duplicates[0]}")


class SecretKeyRef(ApiModel):
    """A key of a Secret in the model's namespace."""

    name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.env[].valueFrom.secretKeyRef.name")] = Field(
        description="Name of the Secret."
    )
    key: Annotated[str, *formatted(CONFIG_KEY, "spec.runtime.env[].valueFrom.secretKeyRef.key")] = Field(
        description="Key inside the Secret."
    )
    optional: bool | None = Field(default=None, description="Start the pod even if the key or Secret is missing.")


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the model's namespace."""

    name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.env[].valueFrom.configMapKeyRef.name")] = Field(
        description="Name of the ConfigMap."
    )
    key: Annotated[str, *formatted(CONFIG_KEY, "spec.runtime.env[].valueFrom.configMapKeyRef.key")] = Field(
        description="Key inside the ConfigMap."
    )
    optional: bool | None = Field(default=None, description="Start the pod even if the key or ConfigMap is missing.")


_ONE_SOURCE = "spec.runtime.env[].valueFrom must set exactly one of secretKeyRef and configMapKeyRef"


class EnvVarSource(ApiModel):
    """Where a variable's value comes from: a Secret or a ConfigMap key."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [cel("has(self.secretKeyRef) != has(self.configMapKeyRef)", _ONE_SOURCE)]
        }
    )

    secret_key_ref: SecretKeyRef | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: ConfigMapKeyRef | None = Field(default=None, description="A key of a ConfigMap.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError(_ONE_SOURCE)
        return self


_VALUE_OR_FROM = "spec.runtime.env[]: set value or valueFrom, not both"


class EnvVar(ApiModel):
    """An extra environment variable for the runtime container: a value, or a Secret or ConfigMap key."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("!has(self.valueFrom) || !has(self.value) || size(self.value) == 0", _VALUE_OR_FROM)
            ]
        }
    )

    # No minLength: the format refuses an empty name with the message that names the field.
    name: Annotated[str, *formatted(ENV_VAR_NAME, "spec.runtime.env[].name")] = Field(description="Variable name.")
    value: str = Field(default="", max_length=32768, description="Variable value.")
    value_from: EnvVarSource | None = Field(default=None, description="Take the value from a Secret or ConfigMap.")

    @model_validator(mode="after")
    def _value_or_from(self) -> EnvVar:
        if self.value_from is not None and self.value:
            raise ValueError(_VALUE_OR_FROM)
        return self


class LocalObjectReference(ApiModel):
    """A Secret in the model's namespace, by name."""

    name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.pod.imagePullSecrets[].name")] = Field(
        description="Name of the Secret."
    )


class SecretVolume(ApiModel):
    """A Secret's keys as files."""

    secret_name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.pod.volumes[].secret.secretName")] = (
        Field(description="Name of the Secret.")
    )
    optional: bool | None = Field(default=None, description="Start the pod even if the Secret is missing.")


class ConfigMapVolume(ApiModel):
    """A ConfigMap's keys as files."""

    name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.pod.volumes[].configMap.name")] = Field(
        description="Name of the ConfigMap."
    )
    optional: bool | None = Field(default=None, description="Start the pod even if the ConfigMap is missing.")


class ClaimVolume(ApiModel):
    """A PersistentVolumeClaim in the model's namespace."""

    claim_name: Annotated[
        str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.pod.volumes[].persistentVolumeClaim.claimName")
    ] = Field(description="Name of the claim.")
    read_only: bool = Field(default=False, description="Mount the claim read-only.")


class EmptyDirVolume(ApiModel):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] = Field(default="", description="Empty: node disk. Memory: tmpfs.")
    size_limit: str | None = Field(
        default=None,
        max_length=64,
        description="Size cap, a quantity such as 10Gi.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "isQuantity(self) && sign(quantity(self)) >= 0",
                    "spec.runtime.pod.volumes[].emptyDir.sizeLimit must be a non-negative quantity such as 10Gi",
                )
            ]
        },
    )

    @model_validator(mode="after")
    def _size_is_quantity(self) -> EmptyDirVolume:
        if self.size_limit is not None and not (is_quantity(self.size_limit) and quantity_value(self.size_limit) >= 0):
            raise ValueError(
                "spec.runtime.pod.volumes[].emptyDir.sizeLimit must be a non-negative quantity such as 10Gi"
            )
        return self


_ONE_VOLUME_SOURCE = (
    "spec.runtime.pod.volumes[] must set exactly one of secret, configMap, persistentVolumeClaim, emptyDir"
)
_OWNED_VOLUME = f"spec.runtime.pod.volumes[].name may not be {', '.join(OWNED_VOLUMES)}: the operator owns them"
_OWNED_MOUNT = (
    f"spec.runtime.pod.volumes[].mountPath may not be or lie under {', '.join(OWNED_MOUNT_PATHS)}: "
    "the operator mounts its own volumes there"
)
_ABSOLUTE_MOUNT = "spec.runtime.pod.volumes[].mountPath must be an absolute path without ':'"
_RELATIVE_SUBPATH = "spec.runtime.pod.volumes[].subPath must be a relative path without '..'"
# The API server takes any absolute mountPath, and the container runtime cleans it: /x/../models or //models
# would land on an operator mount (and / over the image), past the rule above that compares the text.
_CLEAN_MOUNT = (
    "spec.runtime.pod.volumes[].mountPath must not be / nor have an empty, '.' or '..' segment or a trailing '/'"
)


class ExtraVolume(ApiModel):
    """A volume and where the runtime container mounts it (one entry declares both)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "[has(self.secret), has(self.configMap), has(self.persistentVolumeClaim), has(self.emptyDir)]"
                    ".filter(s, s).size() == 1",
                    _ONE_VOLUME_SOURCE,
                ),
                cel(f"!(self.name in {_cel_list(OWNED_VOLUMES)})", _OWNED_VOLUME),
                cel(
                    f"!{_cel_list(OWNED_MOUNT_PATHS)}.exists(p, self.mountPath == p || "
                    "self.mountPath.startsWith(p + '/'))",
                    _OWNED_MOUNT,
                ),
                cel("self.mountPath.startsWith('/') && !self.mountPath.contains(':')", _ABSOLUTE_MOUNT),
                cel(
                    "!self.mountPath.startsWith('/') || "
                    "!self.mountPath.substring(1).split('/').exists(s, s == '' || s == '.' || s == '..')",
                    _CLEAN_MOUNT,
                    ".mountPath",
                ),
                cel(
                    "!has(self.subPath) || (!self.subPath.startsWith('/') && "
                    "!self.subPath.split('/').exists(p, p == '..'))",
                    _RELATIVE_SUBPATH,
                ),
            ]
        }
    )

    name: Annotated[str, *formatted(DNS1123_LABEL, "spec.runtime.pod.volumes[].name")] = Field(
        description="Volume name, unique in the pod."
    )
    mount_path: str = Field(min_length=1, max_length=1024, description="Absolute path in the runtime container.")
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: str | None = Field(default=None, max_length=1024, description="Mount only this path of the volume.")
    secret: SecretVolume | None = Field(default=None, description="Files from a Secret.")
    config_map: ConfigMapVolume | None = Field(default=None, description="Files from a ConfigMap.")
    persistent_volume_claim: ClaimVolume | None = Field(default=None, description="A PersistentVolumeClaim.")
    empty_dir: EmptyDirVolume | None = Field(default=None, description="Scratch space.")

    @model_validator(mode="after")
    def _consistent(self) -> ExtraVolume:
        sources = [self.secret, self.config_map, self.persistent_volume_claim, self.empty_dir]
        if sum(source is not None for source in sources) != 1:
            raise ValueError(_ONE_VOLUME_SOURCE)
        if self.name in OWNED_VOLUMES:
            raise ValueError(_OWNED_VOLUME)
        if any(self.mount_path == p or self.mount_path.startswith(p + "/") for p in OWNED_MOUNT_PATHS):
            raise ValueError(_OWNED_MOUNT)
        if not self.mount_path.startswith("/") or ":" in self.mount_path:
            raise ValueError(_ABSOLUTE_MOUNT)
        if any(segment in ("", ".", "..") for segment in self.mount_path[1:].split("/")):
            raise ValueError(_CLEAN_MOUNT)
        if self.sub_path is not None and (self.sub_path.startswith("/") or ".." in self.sub_path.split("/")):
            raise ValueError(_RELATIVE_SUBPATH)
        return self


_OWNED_LABEL = (
    "spec.runtime.pod.labels may not set specdec.io/ keys or app.kubernetes.io/name, managed-by or instance: "
    "the operator owns them"
)
_OWNED_ANNOTATION = (
    "spec.runtime.pod.annotations may not set specdec.io/ keys or prometheus.io/scrape, port or path: "
    "the operator owns them"
)
_UNIQUE_MOUNT_PATHS = "spec.runtime.pod.volumes[].mountPath must be unique"

LabelValue = Annotated[str, *formatted(LABEL_VALUE, "spec.runtime.pod.labels values")]
_ServiceAccountName = Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.pod.serviceAccountName")]
_PriorityClassName = Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.pod.priorityClassName")]


class PodOverlay(ApiModel):
    """Pod knobs from an allow-list; the operator's own fields stay out of reach."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!has(self.labels) || !self.labels.exists(k, k.startsWith('{OWNED_LABEL_PREFIX}') || "
                    f"k in {_cel_list(OWNED_LABELS)})",
                    _OWNED_LABEL,
                ),
                cel(
                    f"!has(self.annotations) || !self.annotations.exists(k, k.startsWith('{OWNED_LABEL_PREFIX}') || "
                    f"k in {_cel_list(OWNED_ANNOTATIONS)})",
                    _OWNED_ANNOTATION,
                ),
                cel(
                    "!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.mountPath == v.mountPath))",
                    _UNIQUE_MOUNT_PATHS,
                ),
            ]
        }
    )

    labels: Annotated[
        dict[str, LabelValue],
        Field(json_schema_extra={"x-kubernetes-validations": [keys_rule(QUALIFIED_NAME, "spec.runtime.pod.labels")]}),
    ] = Field(default_factory=dict, max_length=32, description="Extra labels on runtime pods.")
    annotations: Annotated[
        dict[str, Annotated[str, Field(max_length=4096)]],
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [keys_rule(QUALIFIED_NAME, "spec.runtime.pod.annotations")]
            }
        ),
    ] = Field(default_factory=dict, max_length=32, description="Extra annotations on runtime pods.")
    service_account_name: _ServiceAccountName | None = Field(
        default=None, description="ServiceAccount the runtime pods run as."
    )
    priority_class_name: _PriorityClassName | None = Field(
        default=None, description="PriorityClass of the runtime pods."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=8,
        description="Secrets to pull the runtime image with.",
        json_schema_extra=_LIST_MAP_BY_NAME,
    )
    volumes: list[ExtraVolume] = Field(
        default_factory=list,
        max_length=16,
        description="Extra volumes, each mounted into the runtime container at its mountPath.",
        json_schema_extra=_LIST_MAP_BY_NAME,
    )
    affinity: ExtraAffinity | None = Field(
        default=None,
        description="Preferred node affinity and pod (anti-)affinity, added to the operator's gfx node affinity.",
    )

    @model_validator(mode="after")
    def _not_owned(self) -> PodOverlay:
        check_keys(QUALIFIED_NAME, "spec.runtime.pod.labels", self.labels)
        check_keys(QUALIFIED_NAME, "spec.runtime.pod.annotations", self.annotations)
        if any(k.startswith(OWNED_LABEL_PREFIX) or k in OWNED_LABELS for k in self.labels):
            raise ValueError(_OWNED_LABEL)
        if any(k.startswith(OWNED_LABEL_PREFIX) or k in OWNED_ANNOTATIONS for k in self.annotations):
            raise ValueError(_OWNED_ANNOTATION)
        paths = [volume.mount_path for volume in self.volumes]
        if len(set(paths)) < len(paths):
            raise ValueError(_UNIQUE_MOUNT_PATHS)
        _unique_names("spec.runtime.pod.volumes", [volume.name for volume in self.volumes])
        _unique_names("spec.runtime.pod.imagePullSecrets", [ref.name for ref in self.image_pull_secrets])
        return self


class WeightsCache(ApiModel):
    """A shared PersistentVolumeClaim mounted as the Hugging Face cache (HF_HOME).

    Every revision of every pool mounts the same claim, so a new revision (a K change above all) starts
    from the weights the previous one downloaded. Pools spread over several nodes need a ReadWriteMany claim.
    """

    enabled: bool = Field(default=True, description="False: no cache even if the installation declares one.")
    claim_name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.runtime.weightsCache.claimName")] | None = Field(
        default=None,
        description="Claim in the model's namespace; defaults to the installation's weights cache claim.",
    )
