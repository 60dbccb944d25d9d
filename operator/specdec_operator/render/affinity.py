"""Node affinity that pins a pool to its gfx target, on homogeneous and mixed nodes alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specdec_operator.api.affinity import ExtraAffinity
from specdec_operator.gpu.devices import BUILTIN_DEVICES, DeviceTable
from specdec_operator.gpu.inventory import MIXED_PREFIX, PARTITION_LABELS, PREFIXES


def gfx_node_affinity(
    gfx: str,
    partition: str | None,
    node_selector: Mapping[str, str],
    excluded_nodes: Sequence[str] = (),
    devices: DeviceTable = BUILTIN_DEVICES,
) -> dict[str, Any]:
    """Terms are ORed. Homogeneous nodes carry `amd.com/gpu.device-id`; mixed nodes only per-value keys,
    and a mixed node qualifies only if none of its GPUs belongs to another gfx target (amd.com/gpu
    cannot choose which GPU a pod gets). A node labelled only `beta.amd.com/gpu.device-id` matches as one
    labelled `amd.com/gpu.device-id` does, read in the inventory's order (gpu/inventory.py).
    `devices` must be the table the inventory used.

    Labels cannot rule out a device id the table lacks (no operator matches "any other key"), so a
    mixed node carrying one is excluded by name: placement lists those nodes (`unvetted_nodes`).
    Raises ValueError for a gfx target without known device ids, whose `In` list would be empty.
    """
    ids = devices.ids_for_gfx(gfx)
    if not ids:
        raise ValueError(f"no AMD device id is known for {gfx}; placement gives it no pool")
    foreign = [device for device in devices.known_ids() if device not in ids]
    common: list[dict[str, Any]] = [
        {"key": key, "operator": "In", "values": [value]} for key, value in sorted(node_selector.items())
    ]
    # A per-value key of another target's GPU rules a node out whatever its plain keys say, as in the inventory.
    no_foreign = [{"key": f"{MIXED_PREFIX}device-id.{other}", "operator": "DoesNotExist"} for other in foreign]
    amd_plain, beta_plain = (f"{prefix}device-id" for prefix in PREFIXES)
    homogeneous: list[list[dict[str, Any]]] = [
        [{"key": amd_plain, "operator": "In", "values": ids}, *no_foreign],
        # beta.amd.com/ counts only where amd.com/ is absent: the inventory reads amd.com/ first.
        [{"key": beta_plain, "operator": "In", "values": ids}, {"key": amd_plain, "operator": "DoesNotExist"},
         *no_foreign],
    ]
    mixed_terms: list[list[dict[str, Any]]] = [
        [{"key": f"{MIXED_PREFIX}device-id.{device}", "operator": "Exists"}, *no_foreign] for device in ids
    ]
    partition_variants: list[list[dict[str, Any]]] = (
        [[{"key": label, "operator": "In", "values": [partition]}] for label in PARTITION_LABELS] if partition else [[]]
    )
    # The API server allows one value per metadata.name requirement; requirements of a term are ANDed.
    by_name = [{"key": "metadata.name", "operator": "NotIn", "values": [name]} for name in sorted(excluded_nodes)]
    terms = [
        {"matchExpressions": base + part + common, **({"matchFields": by_name} if by_name else {})}
        for base in [*homogeneous, *mixed_terms]
        for part in partition_variants
    ]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _pruned(value: Any) -> Any:
    """Without empty maps and lists, which the API server does not store (drift.covers compares exactly)."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_pruned(item) for item in value]
    return value


def with_extra_affinity(gfx_affinity: dict[str, Any], extra: ExtraAffinity | None) -> dict[str, Any]:
    """spec.runtime.pod.affinity beside the gfx rules: preferred node terms join the required ones."""
    if extra is None:
        return gfx_affinity
    wire = _pruned(extra.to_wire())
    affinity = {**gfx_affinity, **{k: v for k, v in wire.items() if k != "nodeAffinity" and v}}
    preferred = wire.get("nodeAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution")
    if preferred:
        node = {**gfx_affinity["nodeAffinity"], "preferredDuringSchedulingIgnoredDuringExecution": preferred}
        affinity["nodeAffinity"] = node
    return affinity
