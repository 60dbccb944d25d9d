"""The device-id table and the labeller's vram strings."""

from __future__ import annotations

import pytest

from specdec_operator.api.vocabulary import GFX_TARGETS
from specdec_operator.gpu.devices import BUILTIN_DEVICES, parse_vram_gib


@pytest.mark.parametrize(
    ("label", "gib"),
    [
        ("192G", 192.0),
        ("64G", 64.0),
        ("48GB", 48.0),
        (" 32g ", 32.0),
        ("1T", 1024.0),
        ("512M", 0.5),
        ("16", 16.0),
        ("", None),
        ("big", None),
        ("G", None),
    ],
)
def test_parse_vram(label: str, gib: float | None) -> None:
    assert parse_vram_gib(label) == gib


@pytest.mark.parametrize(
    ("device_id", "product", "gfx", "vram"),
    [
        ("74a1", "MI300X", "gfx942", 192),
        ("74a5", "MI325X", "gfx942", 256),
        ("7408", "MI250X", "gfx90a", 64),
        ("740f", "MI210", "gfx90a", 64),
        ("75a0", "MI350X", "gfx950", 288),
        ("7448", "Radeon PRO W7900", "gfx1100", 48),
        ("745e", "Radeon PRO W7800", "gfx1100", 32),
        ("7449", "Radeon PRO W7800 48GB", "gfx1100", 48),
        ("747e", "RX 7800 XT", "gfx1101", 16),
        ("7590", "RX 9060 XT", "gfx1200", 16),
        ("738c", "MI100", "gfx908", 32),
    ],
)
def test_device_table_rows(device_id: str, product: str, gfx: str, vram: float) -> None:
    device = BUILTIN_DEVICES.get(device_id)
    assert device is not None
    assert (device.product, device.gfx, device.vram_gib) == (product, gfx, vram)


@pytest.mark.parametrize(
    ("gfx", "ids"),
    [
        ("gfx942", ["74a0", "74a1", "74a2", "74a5", "74a8", "74a9", "74b5", "74b6", "74b9", "74bc", "74bd"]),
        ("gfx90a", ["7408", "740c", "740f", "7410"]),
        ("gfx950", ["75a0", "75a3", "75b0", "75b3"]),
        ("gfx1100", ["7448", "7449", "744a", "744c", "745e"]),
        ("gfx1150", ["150e"]),
        ("gfx1151", ["1586"]),
        ("gfx1030", []),
    ],
)
def test_device_ids_for_gfx(gfx: str, ids: list[str]) -> None:
    assert BUILTIN_DEVICES.ids_for_gfx(gfx) == ids


def test_device_ids_are_lowercase_hex_without_0x() -> None:
    assert all(len(i) == 4 and int(i, 16) >= 0 and i == i.lower() for i in BUILTIN_DEVICES.known_ids())


@pytest.mark.parametrize("gfx", GFX_TARGETS)
def test_every_accepted_gfx_target_can_be_found_on_some_device(gfx: str) -> None:
    assert BUILTIN_DEVICES.ids_for_gfx(gfx)
