"""Node affinity per gfx target, evaluated against real label sets with a small nodeSelectorTerms evaluator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from specdec_operator.api.vocabulary import GFX_TARGETS
from specdec_operator.decisions.placement import unvetted_nodes
from specdec_operator.render.affinity import gfx_node_affinity
from tests.unit.gpu.gpufactories import (
    DOCS_PARTITION_LABEL,
    MI300X,
    UNLISTED,
    demo_fleet,
    homogeneous_labels,
    homogeneous_node,
    mixed_node,
    node,
)

FLEET = {n.name: n for n in demo_fleet()}


def expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        assert values, "In needs values"
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"unexpected operator {operator}")


def field_matches(requirement: Mapping[str, Any], node_name: str) -> bool:
    assert requirement["key"] == "metadata.name" and len(requirement["values"]) == 1  # the API server's rule
    assert requirement["operator"] in ("In", "NotIn")
    return (node_name in requirement["values"]) == (requirement["operator"] == "In")


def affinity_matches(affinity: Mapping[str, Any], labels: Mapping[str, str], node_name: str = "") -> bool:
    """The scheduler's rule: terms are ORed, the expressions and fields of a term ANDed."""
    terms: Sequence[Mapping[str, Any]] = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return any(
        all(expression_matches(e, labels) for e in term["matchExpressions"])
        and all(field_matches(f, node_name) for f in term.get("matchFields", []))
        for term in terms
    )


def matching_nodes(gfx: str, partition: str | None = None, selector: Mapping[str, str] | None = None) -> list[str]:
    affinity = gfx_node_affinity(gfx, partition, selector or {})
    return sorted(name for name, n in FLEET.items() if affinity_matches(affinity, n.labels))


@pytest.mark.parametrize(
    ("gfx", "nodes"),
    [
        ("gfx942", ["mi300x-0", "mi300x-1", "mi300x-2", "mi300x-3", "mixed-gfx942", "unhealthy-0"]),
        ("gfx90a", ["mi250x-0", "mi250x-1"]),
        ("gfx1100", ["w7900-0", "w7900-1"]),
        ("gfx1101", []),  # only on the gfx-mixed node, where amd.com/gpu may hand out a W7900
        ("gfx950", []),
    ],
)
def test_affinity_selects_homogeneous_and_gfx_homogeneous_mixed_nodes(gfx: str, nodes: list[str]) -> None:
    # Taints are the scheduler's business, not affinity's: unhealthy-0 matches and its taint keeps pods off.
    assert matching_nodes(gfx) == nodes


@pytest.mark.parametrize("gfx", ["gfx90a", "gfx942", "gfx1100", "gfx1101"])
def test_affinity_agrees_with_the_inventory_on_every_demo_node(gfx: str) -> None:
    affinity = gfx_node_affinity(gfx, None, {})
    for gpus in FLEET.values():
        assert affinity_matches(affinity, gpus.labels) == (gpus.gfx == gfx), gpus.name


def test_affinity_excludes_a_mixed_node_with_an_unlisted_device() -> None:
    # Labels alone cannot: no operator matches "a per-value key other than these", so placement names the
    # node and the affinity excludes it with a metadata.name field requirement.
    gpus = mixed_node("odd", [(MI300X, 4), (UNLISTED, 4)])
    assert gpus.gfx is None
    assert affinity_matches(gfx_node_affinity("gfx942", None, {}), gpus.labels, gpus.name)
    excluded = unvetted_nodes([gpus], "gfx942")
    assert excluded == ("odd",)
    assert not affinity_matches(gfx_node_affinity("gfx942", None, {}, excluded), gpus.labels, gpus.name)


@pytest.mark.parametrize("gfx", ["gfx90a", "gfx942", "gfx1100", "gfx1101"])
def test_affinity_with_exclusions_agrees_with_the_inventory_on_a_fleet_with_unlisted_devices(gfx: str) -> None:
    fleet = [*FLEET.values(), mixed_node("odd", [(MI300X, 4), (UNLISTED, 4)]), mixed_node("unlisted", [(UNLISTED, 8)])]
    affinity = gfx_node_affinity(gfx, None, {}, unvetted_nodes(fleet, gfx))
    for gpus in fleet:
        assert affinity_matches(affinity, gpus.labels, gpus.name) == (gpus.gfx == gfx), gpus.name


# Every target the API admits has device ids (tests/unit/gpu/test_devices.py); gfx1030 stands for a target
# added to the vocabulary before the table.
@pytest.mark.parametrize("gfx", ["gfx1030"])
def test_a_target_without_device_ids_gets_no_affinity_rather_than_an_empty_in_list(gfx: str) -> None:
    with pytest.raises(ValueError, match=f"no AMD device id is known for {gfx}"):
        gfx_node_affinity(gfx, None, {})


PARTITIONED = {
    "spx": homogeneous_node("spx", MI300X, 8, partition="spx_nps1").labels,
    "cpx-code-label": homogeneous_node("cpx-code-label", MI300X, 8, partition="cpx_nps4").labels,
    "cpx-docs-label": node("docs", homogeneous_labels(MI300X, 8, "cpx_nps4", DOCS_PARTITION_LABEL), 64).labels,
    "cpx-mixed": {**mixed_node("m", [(MI300X, 8)]).labels, "amd.com/gpu.compute-memory-partition": "cpx_nps4"},
    "unpartitioned": homogeneous_node("unpartitioned", MI300X, 8).labels,
}


@pytest.mark.parametrize(
    ("partition", "nodes"),
    [
        ("cpx_nps4", ["cpx-code-label", "cpx-docs-label", "cpx-mixed"]),
        ("spx_nps1", ["spx"]),
        (None, ["cpx-code-label", "cpx-docs-label", "cpx-mixed", "spx", "unpartitioned"]),
    ],
)
def test_partition_matches_both_label_spellings(partition: str | None, nodes: list[str]) -> None:
    affinity = gfx_node_affinity("gfx942", partition, {})
    assert sorted(name for name, labels in PARTITIONED.items() if affinity_matches(affinity, labels)) == nodes


def test_node_selector_is_required_in_every_term() -> None:
    affinity = gfx_node_affinity("gfx942", "cpx_nps4", {"topology.kubernetes.io/zone": "a"})
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    assert all(zone in term["matchExpressions"] for term in terms)
    labels = dict(PARTITIONED["cpx-code-label"])
    assert not affinity_matches(affinity, labels)
    assert affinity_matches(affinity, {**labels, "topology.kubernetes.io/zone": "a"})


@pytest.mark.parametrize("gfx", [g for g in GFX_TARGETS if g not in ("gfx1150", "gfx1151")])
def test_every_in_expression_has_values(gfx: str) -> None:
    terms = gfx_node_affinity(gfx, "spx_nps1", {"a": "b"})["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    for term in terms:
        for expression in term["matchExpressions"]:
            assert expression["operator"] != "In" or expression["values"], expression
