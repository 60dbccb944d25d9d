"""PCI device id -> product, gfx target and memory. No AMD label carries the gfx target, so we keep this table.

Source: ROCm gpu-specs and the device ids the AMD node labeller reports (lowercase hex, no 0x). An installation
extends or overrides the table with the `gpuDevices` setting (settings.py), merged over this one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuDevice:
    device_id: str
    product: str
    gfx: str
    vram_gib: float  # per GPU as the device plugin counts it (one MI250X GCD = one GPU)


_DEVICES = (
    GpuDevice("738c", "MI100", "gfx908", 32),
    GpuDevice("738e", "MI100", "gfx908", 32),
    GpuDevice("740f", "MI210", "gfx90a", 64),
    GpuDevice("7408", "MI250X", "gfx90a", 64),
    GpuDevice("740c", "MI250", "gfx90a", 64),
    GpuDevice("74a0", "MI300A", "gfx942", 128),
    GpuDevice("74a1", "MI300X", "gfx942", 192),
    GpuDevice("74a9", "MI300X-HF", "gfx942", 192),
    GpuDevice("74a2", "MI308X", "gfx942", 192),
    GpuDevice("74a8", "MI308X-HF", "gfx942", 192),
    GpuDevice("74a5", "MI325X", "gfx942", 256),
    GpuDevice("75a0", "MI350X", "gfx950", 288),
    GpuDevice("75a3", "MI355X", "gfx950", 288),
    # SR-IOV virtual functions: what a VM (a cloud GPU instance, a KubeVirt guest) sees, and so what the node
    # labeller inside it writes as device-id. Ids from ROCm/gpu-operator's NodeFeatureRule `amd-vgpu` (docs,
    # OpenShift installation) and its e2e list of vGPU device ids. Memory assumes one VF per GPU, the mode these
    # products are partitioned in for inference; a homogeneous node's vram label wins over it (inventory.py).
    GpuDevice("7410", "MI210 VF", "gfx90a", 64),
    GpuDevice("74b5", "MI300X VF", "gfx942", 192),
    GpuDevice("74bd", "MI300X-HF VF", "gfx942", 192),
    GpuDevice("74b6", "MI308X VF", "gfx942", 192),
    GpuDevice("74bc", "MI308X-HF VF", "gfx942", 192),
    GpuDevice("74b9", "MI325X VF", "gfx942", 256),
    GpuDevice("75b0", "MI350X VF", "gfx950", 288),
    GpuDevice("75b3", "MI355X VF", "gfx950", 288),
    GpuDevice("744c", "RX 7900 XTX", "gfx1100", 24),
    GpuDevice("7448", "Radeon PRO W7900", "gfx1100", 48),
    GpuDevice("744a", "Radeon PRO W7900 Dual Slot", "gfx1100", 48),
    GpuDevice("7449", "Radeon PRO W7800 48GB", "gfx1100", 48),
    GpuDevice("745e", "Radeon PRO W7800", "gfx1100", 32),
    GpuDevice("747e", "RX 7800 XT", "gfx1101", 16),
    GpuDevice("7480", "RX 7600", "gfx1102", 8),
    # APUs: GPU memory is a carve-out of system memory set in firmware, so the node labeller's vram label
    # (which wins over this table) is what counts; these are conservative common settings.
    GpuDevice("150e", "Radeon 880M / 890M (Strix Point)", "gfx1150", 16),
    GpuDevice("1586", "Radeon 8060S (Strix Halo)", "gfx1151", 64),
    GpuDevice("7550", "RX 9070 XT", "gfx1201", 16),
    GpuDevice("7551", "Radeon AI PRO R9700", "gfx1201", 32),
    GpuDevice("7590", "RX 9060 XT", "gfx1200", 16),
)


class DeviceTable:
    """Device id -> GPU, immutable. The operator uses the built-in table merged with the installation's entries
    (setting `gpuDevices`, chart value `gpuDevices`), and hands the same table to inventory, placement and the
    rendered affinity, so pods are sent exactly where capacity was counted."""

    __slots__ = ("_by_id",)

    def __init__(self, devices: Iterable[GpuDevice]) -> None:
        self._by_id: dict[str, GpuDevice] = {device.device_id: device for device in devices}

    def merged(self, entries: Iterable[GpuDevice]) -> DeviceTable:
        """A new table where `entries` add device ids and replace the rows of ids already known."""
        return DeviceTable([*self._by_id.values(), *entries])

    def get(self, device_id: str) -> GpuDevice | None:
        return self._by_id.get(device_id)

    def ids_for_gfx(self, gfx: str) -> list[str]:
        return sorted(device.device_id for device in self._by_id.values() if device.gfx == gfx)

    def known_ids(self) -> list[str]:
        return sorted(self._by_id)

    def products_for_gfx(self, gfx: str) -> list[str]:
        return sorted({device.product for device in self._by_id.values() if device.gfx == gfx})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceTable) and other._by_id == self._by_id

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._by_id.items())))

    def __repr__(self) -> str:
        return f"DeviceTable({len(self._by_id)} devices)"


BUILTIN_DEVICES = DeviceTable(_DEVICES)

# Compute partitions per physical GPU for each compute partition mode (MI300-class: 8 XCDs).
PARTITIONS_PER_GPU = {"spx": 1, "dpx": 2, "qpx": 4, "cpx": 8}


def normalized_device_id(text: str) -> str:
    """As the node labeller writes it: lowercase hex without 0x."""
    return text.strip().lower().removeprefix("0x")


def parse_vram_gib(label_value: str) -> float | None:
    """Labeller vram values look like `192G` (GiB, as the labeller rounds them)."""
    text = label_value.strip().upper().removesuffix("B")
    multiplier = {"G": 1.0, "T": 1024.0, "M": 1 / 1024}.get(text[-1:])
    number = text[:-1] if multiplier is not None else text
    try:
        return float(number) * (multiplier or 1.0)
    except ValueError:
        return None
