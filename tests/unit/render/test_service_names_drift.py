"""The model Service, names and hashes, and the drift check that decides whether a write is needed."""

from __future__ import annotations

from typing import Any

import pytest

from specdec_operator.render.drift import covers
from specdec_operator.render.names import content_hash, deployment_name, pool_labels, pool_name
from specdec_operator.render.service import service
from specdec_runtime import contract
from tests.unit.api.specfactories import spec
from tests.unit.render.renderfactories import MODEL, NAMESPACE, UID, rendered_pool


def test_model_service_selects_every_pool_and_track() -> None:
    svc = service(NAMESPACE, MODEL, UID)
    assert svc["metadata"]["name"] == MODEL
    assert svc["spec"]["selector"] == {contract.LABEL_MODEL: MODEL}
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    for gfx in ("gfx942", "gfx90a"):
        for track in ("stable", "canary"):
            labels = rendered_pool(spec(placement={"gfxTargets": [gfx]}), gfx=gfx, track=track).template["metadata"][
                "labels"
            ]
            assert svc["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize("track", ["stable", "canary"])
def test_track_service_selects_one_track(track: str) -> None:
    svc = service(NAMESPACE, MODEL, UID, track)
    assert svc["metadata"]["name"] == f"{MODEL}-{track}"
    assert svc["spec"]["selector"] == {contract.LABEL_MODEL: MODEL, contract.LABEL_TRACK: track}


@pytest.mark.parametrize(
    ("model", "gfx", "track", "deployment"),
    [
        ("llama8b", "gfx942", "stable", "llama8b-gfx942"),
        ("llama8b", "gfx1100", "canary", "llama8b-gfx1100-canary"),
    ],
)
def test_names(model: str, gfx: str, track: str, deployment: str) -> None:
    assert deployment_name(pool_name(model, gfx), track) == deployment


def test_pool_labels_name_the_pool_and_gfx() -> None:
    labels = pool_labels("llama8b", "llama8b-gfx942", "gfx942")
    assert labels[contract.LABEL_POOL] == "llama8b-gfx942"
    assert labels[contract.LABEL_GFX] == "gfx942"
    assert labels[contract.LABEL_MANAGED_BY] == "specdec-operator"


def test_content_hash_ignores_key_order_and_sees_values() -> None:
    assert content_hash({"a": 1, "b": [1, 2]}) == content_hash({"b": [1, 2], "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})
    assert len(content_hash("x", length=16)) == 16


DESIRED: dict[str, Any] = {
    "metadata": {"name": "d", "labels": {"a": "1"}},
    "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "vllm", "image": "i", "env": []}]}}},
}


def with_changes(base: Any, path: list[Any], value: Any) -> Any:
    """A copy of `base` with the value at `path` replaced (or added)."""
    if not path:
        return value
    head, *rest = path
    if isinstance(base, list):
        return [with_changes(item, rest, value) if i == head else item for i, item in enumerate(base)]
    return {**base, head: with_changes(base.get(head), rest, value)}


CONTAINER = ["spec", "template", "spec", "containers", 0]


@pytest.mark.parametrize(
    ("live", "covered"),
    [
        (DESIRED, True),
        (with_changes(DESIRED, ["metadata", "uid"], "u-1"), True),
        (with_changes(DESIRED, ["metadata", "labels", "added-by-someone"], "x"), True),
        (with_changes(DESIRED, [*CONTAINER, "imagePullPolicy"], "IfNotPresent"), True),
        (with_changes(DESIRED, [*CONTAINER, "env"], None), True),  # our empty list, dropped by the server
        (with_changes(DESIRED, ["status"], {"readyReplicas": 2}), True),
        (with_changes(DESIRED, ["spec", "replicas"], 3), False),
        (with_changes(DESIRED, [*CONTAINER, "image"], "other"), False),
        (with_changes(DESIRED, ["metadata", "labels", "a"], "2"), False),
        (with_changes(DESIRED, ["metadata", "labels"], None), False),
        (with_changes(DESIRED, ["spec", "template", "spec", "containers"], []), False),
        # An empty list of ours owns no items, so server-side apply would not remove an added one either.
        (with_changes(DESIRED, [*CONTAINER, "env"], [{"name": "X", "value": "1"}]), True),
        (None, False),
    ],
    ids=[
        "identical",
        "server-metadata",
        "extra-label",
        "server-default",
        "empty-list-dropped",
        "status",
        "replicas-changed",
        "image-changed",
        "label-changed",
        "labels-removed",
        "container-removed",
        "item-added-to-our-empty-list",
        "missing",
    ],
)
def test_covers(live: Any, covered: bool) -> None:
    assert covers(live, DESIRED) is covered


@pytest.mark.parametrize(
    ("live", "desired", "covered"),
    [
        ([], [], True),
        ([1, 2], [1, 2], True),
        ([2, 1], [1, 2], False),
        ([1, 2, 3], [1, 2], False),
        (None, {}, True),
        ({"a": 1}, {}, True),
        ("x", {"a": 1}, False),
        ("1", 1, False),
    ],
)
def test_covers_edge_cases(live: Any, desired: Any, covered: bool) -> None:
    assert covers(live, desired) is covered
