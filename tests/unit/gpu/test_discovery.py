"""Discovery that adapts to the fleet: an extensible device table, SR-IOV virtual functions, both label prefixes
and the device plugin's partitioned resource names, with inventory and rendered affinity agreeing on every node."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specdec_operator.decisions.placement import unvetted_nodes
from specdec_operator.gpu.devices import BUILTIN_DEVICES, DeviceTable, GpuDevice
from specdec_operator.gpu.inventory import NodeGpus, node_gpus, requested_gpus
from specdec_operator.render.affinity import gfx_node_affinity
from specdec_operator.settings import OperatorEnvSettings
from tests.unit.gpu.gpufactories import (
    MI300X,
    UNLISTED,
    W7900,
    Card,
    base_labels,
    homogeneous_labels,
    mixed_labels,
)
from tests.unit.render.test_affinity import affinity_matches

MI300X_VF = Card("74b5", "AMD_Instinct_MI300X_VF", "192G", "AI", 304, 1216)
CUSTOM = Card("7fff", "Custom_Accelerator", "96G", "AI", 100, 400)  # a device id no table knows


@pytest.mark.parametrize(
    ("device_id", "product", "gfx"),
    [
        ("74b5", "MI300X VF", "gfx942"),
        ("74bd", "MI300X-HF VF", "gfx942"),
        ("74b6", "MI308X VF", "gfx942"),
        ("74bc", "MI308X-HF VF", "gfx942"),
        ("74b9", "MI325X VF", "gfx942"),
        ("75b0", "MI350X VF", "gfx950"),
        ("75b3", "MI355X VF", "gfx950"),
        ("7410", "MI210 VF", "gfx90a"),
    ],
)
def test_sr_iov_virtual_functions_are_in_the_built_in_table(device_id: str, product: str, gfx: str) -> None:
    device = BUILTIN_DEVICES.get(device_id)
    assert device is not None and (device.product, device.gfx) == (product, gfx)


def test_a_setting_extends_and_overrides_the_built_in_table() -> None:
    table = BUILTIN_DEVICES.merged([
        GpuDevice("7fff", "Custom", "gfx942", 96),
        GpuDevice("74a1", "MI300X (site)", "gfx942", 180),
    ])
    assert table.get("7fff") == GpuDevice("7fff", "Custom", "gfx942", 96)
    assert table.get("74a1") == GpuDevice("74a1", "MI300X (site)", "gfx942", 180)
    assert "7fff" in table.ids_for_gfx("gfx942")
    assert BUILTIN_DEVICES.get("7fff") is None  # the built-in table is not changed


def test_an_override_can_move_a_device_to_another_target() -> None:
    table = BUILTIN_DEVICES.merged([GpuDevice("74a1", "MI300X", "gfx950", 192)])
    assert "74a1" not in table.ids_for_gfx("gfx942")
    assert "74a1" in table.ids_for_gfx("gfx950")


def test_operator_setting_reads_device_entries_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "SPECDEC_GPU_DEVICES",
        '[{"deviceId": "0x7FFF", "product": "Custom", "gfx": "gfx942", "vramGib": 96}]',
    )
    table = OperatorEnvSettings().device_table
    assert table.get("7fff") == GpuDevice("7fff", "Custom", "gfx942", 96)
    assert table.get("74a1") == BUILTIN_DEVICES.get("74a1")


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"deviceId": "74z1", "product": "x", "gfx": "gfx942", "vramGib": 8}, "deviceId"),
        ({"deviceId": "74a1", "product": "x", "gfx": "942", "vramGib": 8}, "gfx"),
        ({"deviceId": "74a1", "product": "x", "gfx": "gfx942", "vramGib": 0}, "vramGib"),
        ({"deviceId": "74a1", "product": "", "gfx": "gfx942", "vramGib": 8}, "product"),
    ],
)
def test_a_bad_device_entry_is_refused_naming_its_field(entry: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        OperatorEnvSettings.model_validate({"gpu_devices": [entry]})


def _node(
    name: str, labels: dict[str, str], allocatable: dict[str, str], table: DeviceTable = BUILTIN_DEVICES
) -> NodeGpus:
    return node_gpus(name, {**base_labels(name), **labels}, allocatable, devices=table)


def test_a_node_labelled_only_with_beta_prefix_is_counted_and_matched() -> None:
    gpus = _node("beta", homogeneous_labels(MI300X, 8, prefixes=("beta.amd.com",)), {"amd.com/gpu": "8"})
    assert gpus.gfx == "gfx942" and gpus.allocatable_gpus == 8
    assert affinity_matches(gfx_node_affinity("gfx942", None, {}), gpus.labels, gpus.name)
    assert not affinity_matches(gfx_node_affinity("gfx90a", None, {}), gpus.labels, gpus.name)


def test_a_beta_only_node_with_a_foreign_gpu_is_not_matched() -> None:
    labels = {"beta.amd.com/gpu.device-id.74a1": "4", "beta.amd.com/gpu.device-id.7448": "4"}
    gpus = _node("beta-mixed", labels, {"amd.com/gpu": "8"})
    assert gpus.gfx is None
    for gfx in ("gfx942", "gfx1100"):
        assert not affinity_matches(gfx_node_affinity(gfx, None, {}), gpus.labels, gpus.name)


def test_a_virtual_function_node_is_counted_and_matched_with_the_built_in_table() -> None:
    gpus = _node("vf", homogeneous_labels(MI300X_VF, 8), {"amd.com/gpu": "8"})
    assert gpus.gfx == "gfx942" and gpus.groups[0].product == "MI300X VF"
    assert affinity_matches(gfx_node_affinity("gfx942", None, {}), gpus.labels, gpus.name)


def test_a_device_added_through_the_setting_is_counted_and_matched() -> None:
    table = BUILTIN_DEVICES.merged([GpuDevice("7fff", "Custom", "gfx942", 96)])
    unknown = _node("custom", homogeneous_labels(CUSTOM, 4), {"amd.com/gpu": "4"})
    assert unknown.gfx is None and unknown.unknown_device_ids == ("7fff",)
    assert not affinity_matches(gfx_node_affinity("gfx942", None, {}), unknown.labels, unknown.name)
    known = _node("custom", homogeneous_labels(CUSTOM, 4), {"amd.com/gpu": "4"}, table)
    assert known.gfx == "gfx942" and known.vram_gib_per_gpu == 96
    assert affinity_matches(gfx_node_affinity("gfx942", None, {}, devices=table), known.labels, known.name)


@pytest.mark.parametrize(
    ("allocatable", "resource", "units", "partition"),
    [
        ({"amd.com/gpu": "8"}, "amd.com/gpu", 8, None),
        ({"amd.com/cpx_nps4": "64"}, "amd.com/cpx_nps4", 64, "cpx_nps4"),
        ({"amd.com/spx_nps1": "8"}, "amd.com/spx_nps1", 8, "spx_nps1"),
        ({"amd.com/dpx_nps2": "16", "amd.com/gpu": "0"}, "amd.com/dpx_nps2", 16, "dpx_nps2"),
    ],
)
def test_partitioned_resource_names_of_the_device_plugin_are_counted(
    allocatable: dict[str, str], resource: str, units: int, partition: str | None
) -> None:
    gpus = _node("p", homogeneous_labels(MI300X, 8), allocatable)
    assert (gpus.gpu_resource, gpus.allocatable_gpus, gpus.partition) == (resource, units, partition)
    if partition == "cpx_nps4":
        assert gpus.vram_gib_per_gpu == 192 / 8


def test_a_pod_requesting_a_partition_resource_is_counted() -> None:
    spec = {"containers": [{"resources": {"limits": {"amd.com/cpx_nps4": "2"}}}]}
    assert requested_gpus(spec) == 2


FLEET_LABELS = {
    "amd-and-beta": homogeneous_labels(MI300X, 8),
    "beta-only": homogeneous_labels(MI300X, 8, prefixes=("beta.amd.com",)),
    "amd-only": homogeneous_labels(MI300X, 8, prefixes=("amd.com",)),
    "vf": homogeneous_labels(MI300X_VF, 8),
    "vf-beta-only": homogeneous_labels(MI300X_VF, 8, prefixes=("beta.amd.com",)),
    "w7900-beta-only": homogeneous_labels(W7900, 4, prefixes=("beta.amd.com",)),
    "mixed-known": mixed_labels([(MI300X, 4), (MI300X_VF, 4)]),
    "mixed-gfx": mixed_labels([(MI300X, 4), (W7900, 4)]),
    "custom": homogeneous_labels(CUSTOM, 4),
    "unlisted-mixed": mixed_labels([(MI300X, 4), (UNLISTED, 4)]),
}


@pytest.mark.parametrize("extended", [False, True])
@pytest.mark.parametrize("gfx", ["gfx942", "gfx1100", "gfx90a"])
def test_affinity_agrees_with_the_inventory_on_every_label_shape(extended: bool, gfx: str) -> None:
    table = BUILTIN_DEVICES.merged([GpuDevice("7fff", "Custom", "gfx942", 96)]) if extended else BUILTIN_DEVICES
    fleet = [_node(name, labels, {"amd.com/gpu": "8"}, table) for name, labels in FLEET_LABELS.items()]
    affinity = gfx_node_affinity(gfx, None, {}, unvetted_nodes(fleet, gfx), devices=table)
    for gpus in fleet:
        assert affinity_matches(affinity, gpus.labels, gpus.name) == (gpus.gfx == gfx), (gpus.name, gfx)
