"""CRD lifecycle with crds.templated: install, a CRD change reaches the API server through `helm upgrade`,
and an uninstall in the documented order (models first, docs/upgrade.md) leaves nothing stuck."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from localcluster.cluster import LocalCluster
from localcluster.versions import KUBERNETES_VERSION
from tests.e2e.helm import CHART_DIR, REPO, SM_CRD, Helm, existing_peering_crds, unique_name
from tests.e2e.kube import Kube, wait_for
from tests.e2e.operator_process import OperatorProcess

# Exclusive: upgrades the CRDs every lane's models are stored under.
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

CRD_FILE = Path("crds") / "specdec.io_speculativemodels.yaml"


@pytest.fixture
def chart_copy(tmp_path: Path, cluster: LocalCluster, crds: None) -> Iterator[Path]:
    chart = tmp_path / "specdec-operator"
    shutil.copytree(CHART_DIR, chart)
    yield chart
    # The session's CRD again, without the test's field (and owned by kubectl, as the other tests expect).
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))


def _add_optional_field(chart: Path) -> None:
    path = chart / CRD_FILE
    crd = yaml.safe_load(path.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["upgradeProbe"] = {"type": "string", "description": "Added by the upgrade e2e test."}
    path.write_text(yaml.safe_dump(crd, sort_keys=False))


def _served_fields(cluster: LocalCluster) -> set[str]:
    crd = yaml.safe_load(cluster.kubectl("get", "crd", SM_CRD, "-o", "yaml"))
    return set(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def test_helm_upgrade_serves_a_new_crd_field_and_uninstall_in_order_leaves_nothing_stuck(
    cluster: LocalCluster, chart_copy: Path, operator: OperatorProcess, kube: Kube
) -> None:
    helm = Helm(cluster)
    name, namespace = unique_name("upgrade"), unique_name("e2e-upgrade-sys")
    values = ["--set", "crds.templated=true", "--set", "replicaCount=1", "--set", "clusterWide=true",
              "--set", f"peering.installCRDs={str(not existing_peering_crds(cluster)).lower()}"]
    common = ["--namespace", namespace, "--kube-version", KUBERNETES_VERSION.lstrip("v")]
    try:
        # The session applied the CRD with kubectl: the release adopts it, as docs/upgrade.md describes.
        helm.run("install", name, str(chart_copy), "--create-namespace", "--skip-crds", "--take-ownership",
                 "--wait", *values, "--namespace", namespace)
        crd = yaml.safe_load(cluster.kubectl("get", "crd", SM_CRD, "-o", "yaml"))
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == name
        assert "upgradeProbe" not in _served_fields(cluster)

        _add_optional_field(chart_copy)
        helm.run("upgrade", name, str(chart_copy), "--wait", *values, *common[:2])
        wait_for("the new field served", lambda: "upgradeProbe" in _served_fields(cluster), 30)
        model = yaml.safe_load((REPO / "examples" / "ngram-w7900.yaml").read_text())
        model["spec"]["upgradeProbe"] = "kept by the API server"
        kube.apply(model)
        stored = kube.get("sm", model["metadata"]["name"])
        assert stored["spec"]["upgradeProbe"] == "kept by the API server"  # not pruned: the schema has it
        wait_for("the operator's finalizer on the model",
                 lambda: kube.get("sm", model["metadata"]["name"])["metadata"].get("finalizers"), 60)
        wait_for("the model's Deployments", lambda: kube.items("deployments", "specdec.io/model"), 60)

        # The documented order: models first (the running operator removes its finalizer), then the release.
        kube.run("delete", "sm", "--all", "--wait=true", "--timeout=90s")
        assert kube.items("sm") == []
        wait_for("owned Deployments garbage-collected", lambda: not kube.items("deployments", "specdec.io/model"),
                 60)
        helm.run("uninstall", name, "--namespace", namespace, "--wait")
        assert cluster.kubectl("get", "crd", SM_CRD, "-o", "name").strip()  # kept by its resource policy
        # Nothing stuck: both namespaces (the models' and the release's) finish terminating, and no
        # SpeculativeModel anywhere waits on a finalizer.
        for emptied in (kube.namespace, namespace):
            cluster.kubectl("delete", "namespace", emptied, "--wait=true", "--timeout=60s")
            assert not cluster.kubectl("get", "namespace", emptied, "-o", "name", check=False).strip(), emptied
        terminating = [item["metadata"]["name"] for item in yaml.safe_load(
            cluster.kubectl("get", "sm", "-A", "-o", "yaml"))["items"] if item["metadata"].get("deletionTimestamp")]
        assert terminating == []
    finally:
        listed = helm.run("list", "--namespace", namespace, "-q")
        if name in listed.split():
            helm.run("uninstall", name, "--namespace", namespace)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
