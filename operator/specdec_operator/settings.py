"""Operator settings, from environment variables prefixed SPECDEC_ (nested keys use `__`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, SettingsConfigDict

from specdec_operator.decisions import label_selector
from specdec_operator.gpu.devices import BUILTIN_DEVICES, DeviceTable, GpuDevice, normalized_device_id
from specdec_operator.render.podspec import PodSettings

# Runtime images are built from runtime/Dockerfile: a pinned vllm/vllm-openai-rocm base plus our launcher.
# AMD splits its vLLM builds per architecture family, and vLLM's own ROCm image bakes CDNA targets only
# (gfx90a;gfx942;gfx950), so RDNA cards need images of their own.
_RUNTIME_REPO = "ghcr.io/specdec/specdec-runtime"
CDNA_IMAGE = f"{_RUNTIME_REPO}:0.1.0-vllm0.33.0-cdna"
RDNA3_IMAGE = f"{_RUNTIME_REPO}:0.1.0-vllm0.33.0-rdna3"
RDNA4_IMAGE = f"{_RUNTIME_REPO}:0.1.0-vllm0.33.0-rdna4"
DEFAULT_IMAGES: dict[str, str] = {
    "gfx90a": CDNA_IMAGE,
    "gfx942": CDNA_IMAGE,
    "gfx950": CDNA_IMAGE,
    "gfx1100": RDNA3_IMAGE,
    "gfx1101": RDNA3_IMAGE,
    "gfx1150": RDNA3_IMAGE,
    "gfx1151": RDNA3_IMAGE,
    "gfx1200": RDNA4_IMAGE,
    "gfx1201": RDNA4_IMAGE,
}

# The gfx targets each default image carries code objects for. A card whose own target is missing
# runs through HSA_OVERRIDE_GFX_VERSION pointing at a compatible target the image does have.
DEFAULT_IMAGE_TARGETS: dict[str, list[str]] = {
    CDNA_IMAGE: ["gfx90a", "gfx942", "gfx950"],
    RDNA3_IMAGE: ["gfx1100"],
    RDNA4_IMAGE: ["gfx1200", "gfx1201"],
}


class GpuDeviceEntry(BaseModel):
    """One row of the device table an installation adds or overrides (chart value `gpuDevices`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    device_id: str = Field(description="PCI device id as the node labeller writes it (74b5; 0x74B5 is accepted).")
    product: str = Field(min_length=1, description="Product name shown in status, e.g. MI300X VF.")
    gfx: str = Field(pattern=r"^gfx[0-9a-f]{3,5}$", description="gfx target the device runs, e.g. gfx942.")
    vram_gib: float = Field(gt=0, description="Memory per allocatable GPU in GiB.")

    @field_validator("device_id")
    @classmethod
    def _hex_id(cls, value: str) -> str:
        normalized = normalized_device_id(value)
        if len(normalized) != 4 or any(c not in "0123456789abcdef" for c in normalized):
            raise ValueError(f"deviceId {value!r} is not a 4-digit hex PCI device id such as 74b5")
        return normalized

    def device(self) -> GpuDevice:
        return GpuDevice(self.device_id, self.product, self.gfx, self.vram_gib)


class OperatorEnvSettings(BaseSettings):
    """Everything an installation may tune. Defaults suit a production cluster."""

    model_config = SettingsConfigDict(env_prefix="SPECDEC_", env_nested_delimiter="__", extra="ignore")

    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to watch. Empty is refused unless cluster_wide is true (scope_problem).",
    )
    cluster_wide: bool = Field(
        default=False,
        description="Watch and manage the whole cluster. Must be said explicitly: the operator then may delete "
        "ConfigMaps, Services and Deployments it owns and patch HTTPRoutes in every namespace.",
    )
    gpu_devices: list[GpuDeviceEntry] = Field(
        default_factory=list,
        description="Device table rows merged over the built-in one (gpu/devices.py): a new device id adds a row, "
        "a known one replaces it. JSON list of {deviceId, product, gfx, vramGib}.",
    )
    field_manager: str = Field(default="specdec-operator", description="Server-side apply field manager.")
    runtime_images: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_IMAGES), description="Runtime image per gfx target."
    )
    image_targets: dict[str, list[str]] = Field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_IMAGE_TARGETS.items()},
        description="gfx targets each runtime image has code objects for (drives HSA_OVERRIDE_GFX_VERSION).",
    )
    simulator_image: str = Field(
        default=f"{_RUNTIME_REPO}:0.1.0-simulator", description="Image for spec.runtime.simulate."
    )
    reconcile_interval_seconds: float = Field(
        default=30.0, gt=0, description="Level-triggered resync period per SpeculativeModel."
    )
    scrape_interval_seconds: float = Field(default=15.0, gt=0, description="Runtime pod /metrics scrape period.")
    fleet_audit_interval_seconds: float = Field(
        default=600.0, gt=0,
        description="How often node and GPU pod watch caches are checked against a LIST for objects deleted during "
                    "a watch gap (handlers/services/fleet_audit.py); also after every pause for a peer.",
    )
    status_stats_period_seconds: float = Field(
        default=300.0, ge=0,
        description="Live statistics (acceptance, mean accepted length; tokens/s only rides along) reach status "
        "at most this often per model when nothing else changed, and only once they moved past a tolerance "
        "(reconcile/status_write.py); decisions "
        "and condition changes are written at once. A model's first figures are provisional: one refresh may "
        "follow them after 120 s. /metrics is always fresh.",
    )
    api_timeout_seconds: float = Field(default=20.0, gt=0, description="Timeout of every Kubernetes API request.")
    refused_write_backoff_seconds: float = Field(
        default=10.0, gt=0,
        description="First retry delay of an owned object the API server refused; doubles per refusal.",
    )
    refused_write_backoff_max_seconds: float = Field(
        default=600.0, gt=0, description="Longest delay between retries of a refused owned object.",
    )
    scrape_timeout_seconds: float = Field(default=5.0, gt=0, description="Per-pod scrape timeout.")
    scrape_concurrency: int = Field(default=32, ge=1, description="Scrapes in flight at once.")
    scrape_max_body_bytes: int = Field(
        default=2 * 1024 * 1024, ge=64 * 1024,
        description="Largest runtime pod /metrics body read; a larger one is a failed scrape. vLLM's body is "
        "15-20 KiB per data-parallel engine (about 125 KiB with 8): 2 MiB leaves 16 times that, and bounds what "
        "one pod's body costs the operator to read and parse (~0.2 s).",
    )
    scrape_loopback_only: bool = Field(
        default=False,
        description="Scrape only 127.0.0.0/8 pod IPs (set in local clusters and tests, where pods are fake).",
    )
    freeze_rollouts: bool = Field(
        default=False,
        description="A fleet-wide change freeze: every model holds its rollouts and K changes as with "
        "spec.rollout.freeze (Progressing=False, RolloutsFrozen); off again, what waited rolls out.",
    )
    max_concurrent_rollouts: int = Field(
        default=0, ge=0,
        description="How many models of this install may have a rollout (a pod template change or a canary) in "
        "flight at once; the others wait with Progressing=False, RolloutQueued, until one ends. 0: no limit. An "
        "operator upgrade that changes every pool's pod template then restarts this many models at a time.",
    )
    node_missing_grace_seconds: float = Field(
        default=300.0, ge=0,
        description="A pool whose nodes stop matching (deleted, allocatable amd.com/gpu 0, labels gone, cordoned) "
        "keeps its Deployment, PDB, ConfigMap, Service, replicas and K this long, counted from when status first "
        "recorded them missing, before it is scaled down or removed; like the node NotReady toleration (300 s).",
    )
    kv_headroom_fraction: float = Field(
        default=0.2, ge=0, lt=1, description="Share of GPU memory kept for KV cache when fitting weights."
    )
    shutdown_grace_seconds: float = Field(
        default=3.0, gt=0,
        description="After SIGTERM or SIGINT, how long kopf's graceful stop may take before what is left of it "
        "is cancelled (handlers/services/shutdown.py). Keep it well under the pod's terminationGracePeriodSeconds.",
    )
    metrics_port: int = Field(default=8080, ge=0, description="Port of the operator's own /metrics (0 = off).")
    metrics_auth: bool = Field(
        default=False,
        description="Serve /metrics only to a bearer token the API server authenticates (TokenReview) and "
        "authorizes for `get` on the non-resource URL /metrics (SubjectAccessReview). The chart turns it on "
        "(metrics.auth.enabled); off, /metrics is plain and open to whoever reaches the port.",
    )
    peering_name: str = Field(default="specdec-operator", description="Kopf peering object for HA.")
    runtime_pod_security: Literal["restricted", "baseline"] = Field(
        default="restricted",
        description="restricted: runtime pods pass the `restricted` Pod Security Standard (non-root image). "
        "baseline: for runtime images that must run as root.",
    )
    runtime_supplemental_groups: list[int] = Field(
        default_factory=lambda: [44, 109],
        description="Group ids of /dev/kfd and /dev/dri/renderD* on GPU nodes (video, render); they vary by "
        "distribution, see docs/runtime-pods.md.",
    )
    runtime_fs_group: int | None = Field(
        default=10001, ge=0, description="fsGroup of runtime pods, so the non-root user can write the weights cache."
    )
    weights_cache_claim: str | None = Field(
        default=None,
        description="PersistentVolumeClaim, in each model's namespace, mounted as the Hugging Face cache "
        "unless a model names its own or disables it.",
    )

    @field_validator("model_selector")
    @classmethod
    def _selector_parses(cls, value: str) -> str:
        label_selector.parse(value)  # a ValueError naming the requirement: the operator refuses to start
        return value

    @field_validator("runtime_fs_group", "weights_cache_claim", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        # The chart renders an unset value as an empty string.
        return None if value == "" else value

    def scope_problem(self) -> str | None:
        """Why the operator must not start with this scope, or None. Cluster-wide only when asked explicitly."""
        if not self.namespaces and not self.cluster_wide:
            return ("SPECDEC_NAMESPACES (chart value watchNamespaces) is empty and SPECDEC_CLUSTER_WIDE (chart value "
                    "clusterWide) is not true: list the namespaces to manage, or set clusterWide: true to manage "
                    "the whole cluster")
        if self.namespaces and self.cluster_wide:
            return ("SPECDEC_NAMESPACES (chart value watchNamespaces) lists namespaces and SPECDEC_CLUSTER_WIDE "
                    "(chart value clusterWide) is true: set one of them, not both")
        return None

    @property
    def device_table(self) -> DeviceTable:
        return BUILTIN_DEVICES.merged(entry.device() for entry in self.gpu_devices)

    @property
    def pod_settings(self) -> PodSettings:
        return PodSettings(
            security=self.runtime_pod_security,
            supplemental_groups=tuple(self.runtime_supplemental_groups),
            fs_group=self.runtime_fs_group,
            weights_cache_claim=self.weights_cache_claim or None,
        )
    standalone: bool = Field(default=False, description="Run without peering (single replica, dev).")
    model_selector: str = Field(
        default="",
        description="Label selector on SpeculativeModels this install reconciles (sharding; empty means all). "
        "Applied by the API server to the watch, so other shards' models are never seen.",
    )
    shard: str = Field(default="", description="This install's shard name, written to each model's status.")
    log_format: Literal["plain", "full", "json"] = Field(
        default="plain",
        description="Log lines as plain text, as text with a timestamp, logger and the object they concern "
        "(full), or as JSON objects (kopf's formatters).",
    )
