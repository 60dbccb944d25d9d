"""Labels -> NodeGpus, with real label sets: homogeneous, mixed, partitioned, unknown and tainted nodes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specdec_operator.gpu.inventory import (
    GpuGroup,
    NodeGpus,
    PodGpus,
    RuntimePodLabels,
    Taint,
    node_gpus,
    pod_gpus,
    requested_gpus,
)
from tests.unit.gpu.gpufactories import (
    DOCS_PARTITION_LABEL,
    MI100,
    MI250X,
    MI300X,
    MI325X,
    MI355X,
    PLAIN_PARTITION_LABEL,
    R9700,
    RX7800XT,
    UNHEALTHY,
    UNLISTED,
    W7800,
    W7900,
    Card,
    base_labels,
    cpu_node,
    homogeneous_labels,
    homogeneous_node,
    mixed_labels,
    mixed_node,
    node,
)


@dataclass(frozen=True)
class Expected:
    gfx: str | None
    groups: tuple[tuple[str, str, str, float, int], ...]  # device id, product, gfx, vram GiB, count
    allocatable: int
    vram_per_gpu: float
    partition: str | None = None
    unknown: tuple[str, ...] = ()


def shape(gpus: NodeGpus) -> Expected:
    return Expected(
        gpus.gfx,
        tuple((g.device_id, g.product, g.gfx, g.vram_gib, g.count) for g in gpus.groups),
        gpus.allocatable_gpus,
        gpus.vram_gib_per_gpu,
        gpus.partition,
        gpus.unknown_device_ids,
    )


CASES: list[tuple[str, NodeGpus, Expected]] = [
    (
        "mi300x-homogeneous",
        homogeneous_node("n", MI300X, 8),
        Expected("gfx942", (("74a1", "MI300X", "gfx942", 192, 8),), 8, 192),
    ),
    (
        "mi250x-homogeneous-gcds",
        homogeneous_node("n", MI250X, 8),
        Expected("gfx90a", (("7408", "MI250X", "gfx90a", 64, 8),), 8, 64),
    ),
    (
        "w7900-homogeneous",
        homogeneous_node("n", W7900, 4),
        Expected("gfx1100", (("7448", "Radeon PRO W7900", "gfx1100", 48, 4),), 4, 48),
    ),
    (
        "mi355x-homogeneous",
        homogeneous_node("n", MI355X, 8),
        Expected("gfx950", (("75a3", "MI355X", "gfx950", 288, 8),), 8, 288),
    ),
    (
        "r9700-rdna4",
        homogeneous_node("n", R9700, 2),
        Expected("gfx1201", (("7551", "Radeon AI PRO R9700", "gfx1201", 32, 2),), 2, 32),
    ),
    (
        "mi100-known-but-not-a-vllm-target",
        homogeneous_node("n", MI100, 4),
        Expected("gfx908", (("738c", "MI100", "gfx908", 32, 4),), 4, 32),
    ),
    (
        "mixed-same-gfx-per-value-keys-only",
        mixed_node("n", [(MI300X, 4), (MI325X, 4)]),
        Expected("gfx942", (("74a1", "MI300X", "gfx942", 192, 4), ("74a5", "MI325X", "gfx942", 256, 4)), 8, 192),
    ),
    (
        "mixed-two-gfx-targets",
        mixed_node("n", [(W7900, 2), (RX7800XT, 2)]),
        Expected(
            None,
            (("7448", "Radeon PRO W7900", "gfx1100", 48, 2), ("747e", "RX 7800 XT", "gfx1101", 16, 2)),
            4,
            16,
        ),
    ),
    (
        "mi300x-cpx-nps4-code-spelling",
        homogeneous_node("n", MI300X, 8, partition="cpx_nps4"),
        Expected("gfx942", (("74a1", "MI300X", "gfx942", 192, 8),), 64, 24, "cpx_nps4"),
    ),
    (
        "mi300x-dpx-docs-spelling",
        node("n", homogeneous_labels(MI300X, 8, "dpx_nps1", DOCS_PARTITION_LABEL), 16),
        Expected("gfx942", (("74a1", "MI300X", "gfx942", 192, 8),), 16, 96, "dpx_nps1"),
    ),
    (
        "unknown-device-id",
        homogeneous_node("n", UNLISTED, 8),
        Expected(None, (), 8, 0, unknown=("7ffe",)),
    ),
    (
        "mixed-known-and-unknown",
        mixed_node("n", [(MI300X, 4), (UNLISTED, 4)]),
        Expected(None, (("74a1", "MI300X", "gfx942", 192, 4),), 8, 192, unknown=("7ffe",)),
    ),
    (
        "w7800-vram-label-32g",
        homogeneous_node("n", W7800, 2),
        Expected("gfx1100", (("745e", "Radeon PRO W7800", "gfx1100", 32, 2),), 2, 32),
    ),
    (
        # The same device id sold with 48G: the homogeneous node's vram label breaks the tie.
        "w7800-vram-label-48g",
        node("n", homogeneous_labels(W7800, 2) | {"amd.com/gpu.vram": "48G", "beta.amd.com/gpu.vram": "48G"}, 2),
        Expected("gfx1100", (("745e", "Radeon PRO W7800", "gfx1100", 48, 2),), 2, 48),
    ),
    (
        "mixed-node-vram-from-the-table",
        mixed_node("n", [(W7800, 1), (W7900, 1)]),
        Expected(
            "gfx1100", (("7448", "Radeon PRO W7900", "gfx1100", 48, 1), ("745e", "Radeon PRO W7800", "gfx1100", 32, 1)),
            2, 32,
        ),
    ),
    (
        "plain-key-only-count-from-allocatable",
        node("n", homogeneous_labels(MI300X, 8, prefixes=("amd.com",)), 8),
        Expected("gfx942", (("74a1", "MI300X", "gfx942", 192, 8),), 8, 192),
    ),
    (
        "beta-keys-only",
        node("n", homogeneous_labels(MI250X, 4, prefixes=("beta.amd.com",)), 4),
        Expected("gfx90a", (("7408", "MI250X", "gfx90a", 64, 4),), 4, 64),
    ),
    ("cpu-only", cpu_node("n"), Expected(None, (), 0, 0)),
    (
        "labels-before-the-device-plugin-reports",
        node("n", homogeneous_labels(MI300X, 8), 0),
        Expected("gfx942", (("74a1", "MI300X", "gfx942", 192, 8),), 0, 192),
    ),
]


@pytest.mark.parametrize(("gpus", "expected"), [(n, e) for _, n, e in CASES], ids=[i for i, _, _ in CASES])
def test_node_gpus_from_real_label_sets(gpus: NodeGpus, expected: Expected) -> None:
    assert shape(gpus) == expected


@pytest.mark.parametrize("card", [MI300X, MI250X, W7900])
def test_homogeneous_label_set_has_plain_beta_and_beta_per_value_keys(card: Card) -> None:
    labels = homogeneous_labels(card, 8)
    assert labels["amd.com/gpu.device-id"] == labels["beta.amd.com/gpu.device-id"] == card.device_id
    assert labels[f"beta.amd.com/gpu.device-id.{card.device_id}"] == "8"
    assert f"amd.com/gpu.device-id.{card.device_id}" not in labels


def test_mixed_label_set_has_no_plain_keys() -> None:
    labels = mixed_labels([(MI300X, 4), (MI325X, 4)])
    assert not [key for key in labels if key.endswith(("/gpu.device-id", "/gpu.vram", "/gpu.family"))]
    assert labels["amd.com/gpu.family.AI"] == "8"
    assert (labels["amd.com/gpu.device-id.74a1"], labels["amd.com/gpu.device-id.74a5"]) == ("4", "4")


def test_family_alone_cannot_tell_mi250x_from_mi300x() -> None:
    mi250x, mi300x = homogeneous_node("a", MI250X, 8), homogeneous_node("b", MI300X, 8)
    assert mi250x.labels["amd.com/gpu.family"] == mi300x.labels["amd.com/gpu.family"] == "AI"
    assert (mi250x.gfx, mi300x.gfx) == ("gfx90a", "gfx942")


@pytest.mark.parametrize("label", [PLAIN_PARTITION_LABEL, DOCS_PARTITION_LABEL])
def test_both_partition_spellings_are_read(label: str) -> None:
    labels = {**base_labels("n"), "amd.com/gpu.device-id": "74a1", label: "cpx_nps4"}
    assert node_gpus("n", labels, {"amd.com/gpu": "64"}).partition == "cpx_nps4"


def test_taints_and_cordon_are_kept() -> None:
    gpus = homogeneous_node("n", MI300X, 8, taints=[UNHEALTHY], cordoned=True)
    assert gpus.taints == (Taint("amd-gpu-unhealthy", "ecc-errors", "NoSchedule"),)
    assert gpus.cordoned


@pytest.mark.parametrize("allocatable", [{}, {"amd.com/gpu": "lots"}])
def test_missing_or_garbled_allocatable_counts_zero(allocatable: dict[str, str]) -> None:
    assert node_gpus("n", homogeneous_labels(MI300X, 8), allocatable).allocatable_gpus == 0


def test_garbled_per_value_count_is_skipped() -> None:
    labels = {"amd.com/gpu.device-id.74a1": "4", "amd.com/gpu.device-id.74a5": "four"}
    assert [g.device_id for g in node_gpus("n", labels, {"amd.com/gpu": "8"}).groups] == ["74a1"]


def test_groups_are_plain_values() -> None:
    gpus = homogeneous_node("n", MI300X, 8)
    assert gpus.groups == (GpuGroup("74a1", "MI300X", "gfx942", 192, 8),)
    assert gpus.gfx_targets == frozenset({"gfx942"})


def _pod_spec(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
              init: dict[str, str] | None = None, node: str | None = "mi300x-0") -> dict[str, object]:
    resources: dict[str, object] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    body: dict[str, object] = {"containers": [{"name": "c", "resources": resources}, {"name": "sidecar"}]}
    if init is not None:
        body["initContainers"] = [{"name": "i", "resources": {"limits": init}}]
    if node:
        body["nodeName"] = node
    return body


OURS = {"app.kubernetes.io/managed-by": "specdec-operator", "specdec.io/model": "llama8b",
        "specdec.io/pool": "llama8b-gfx942"}


RUNTIME_LABELS = RuntimePodLabels(("app.kubernetes.io/managed-by", "specdec-operator"), "specdec.io/model",
                                  "specdec.io/pool")


def _claim(labels: dict[str, str], spec: dict[str, object], status: dict[str, object]) -> PodGpus | None:
    return pod_gpus("inference", "p", labels, spec, status, RUNTIME_LABELS)


def test_pod_claim_reads_requests_or_limits_and_init_containers() -> None:
    assert requested_gpus(_pod_spec(requests={"amd.com/gpu": "4"})) == 4
    assert requested_gpus(_pod_spec(limits={"amd.com/gpu": "2"})) == 2  # an extended request defaults to its limit
    assert requested_gpus(_pod_spec(requests={"amd.com/gpu": "1"}, init={"amd.com/gpu": "8"})) == 8
    assert requested_gpus(_pod_spec(requests={"cpu": "2"})) == 0


def test_pod_claim_of_other_workloads_finished_pods_and_pending_ones() -> None:
    other = _claim({"app": "trainer"}, _pod_spec(requests={"amd.com/gpu": "8"}), {"phase": "Running"})
    assert other == PodGpus("inference", "p", 8, "mi300x-0")
    assert _claim({}, _pod_spec(requests={"amd.com/gpu": "8"}), {"phase": "Succeeded"}) is None
    assert _claim({}, _pod_spec(requests={"cpu": "1"}), {"phase": "Running"}) is None
    pending = _claim(OURS, _pod_spec(limits={"amd.com/gpu": "8"}, node=None), {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient amd.com/gpu.",
         "lastTransitionTime": "2026-11-30T10:00:00Z"}
    ]})
    assert pending == PodGpus("inference", "p", 8, None, "inference/llama8b", "llama8b-gfx942",
                              "0/3 nodes are available: 3 Insufficient amd.com/gpu.", "2026-11-30T10:00:00Z")
