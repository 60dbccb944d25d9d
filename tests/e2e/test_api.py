"""The CRD as platform teams meet it: apply, admission errors, kubectl explain, kubectl get."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.kube import Kube

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
INVALID = sorted((REPO / "tests" / "manifests" / "invalid").glob("*.yaml"))


def expected_message(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <message>'"
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_applies(kube: Kube, example: Path) -> None:
    accepted, stderr = kube.try_apply(example.read_text())
    assert accepted, stderr
    for doc in yaml.safe_load_all(example.read_text()):
        if doc["kind"] == "SpeculativeModel":
            live = kube.get("speculativemodel", doc["metadata"]["name"])
            assert live["spec"]["model"]["name"] == doc["spec"]["model"]["name"]


def test_at_least_twelve_invalid_manifests_exist() -> None:
    assert len(INVALID) >= 12


@pytest.mark.parametrize("manifest", INVALID, ids=lambda p: p.stem)
def test_invalid_manifest_is_rejected_with_a_message_naming_the_field(kube: Kube, manifest: Path) -> None:
    accepted, stderr = kube.try_apply(manifest.read_text())
    assert not accepted
    assert expected_message(manifest) in stderr, stderr


def test_kubectl_explain_shows_field_descriptions(kube: Kube) -> None:
    text = kube.run("explain", "speculativemodel.spec.speculation")
    assert "Bounds of K and the autotune policy" in text
    assert "Lowest K the tuner may choose" in text
    autotune = kube.run("explain", "speculativemodel.spec.speculation.autotune.objective")
    assert "Throughput" in autotune


def test_kubectl_get_shows_the_columns(kube: Kube) -> None:
    kube.apply(yaml.safe_load((REPO / "examples" / "eagle3-mi300x.yaml").read_text()))
    header = kube.run("get", "sm").splitlines()[0].split()
    assert header == ["NAME", "READY", "MODEL", "DRAFTER", "K", "ACCEPTANCE", "POOLS", "REPLICAS", "AGE"]
    wide = kube.run("get", "specmodel", "-o", "wide").splitlines()[0].split()
    assert "CANARY" in wide
