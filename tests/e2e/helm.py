"""Helm against the local cluster: the helm hack/cluster built, and releases of our chart that tests install."""

from __future__ import annotations

import fcntl
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from localcluster.cluster import LocalCluster
from localcluster.versions import KUBERNETES_VERSION

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "specdec-operator"
SM_CRD = "speculativemodels.specdec.io"
# kopf's peering CRDs are chart templates, shared by every kopf operator in a cluster (see the template).
PEERING_CRDS = ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
HELM_TIMEOUT = "120s"

Manifest = dict[str, Any]


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


def resource_ref(obj: Manifest) -> str:
    """`kind.group/name` as kubectl reads it, so two kinds of one name in different groups never mix."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower()
    return f"{kind}.{group}/{obj['metadata']['name']}" if group else f"{kind}/{obj['metadata']['name']}"


class Helm:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.binary = str(cluster.binaries["helm"])

    def run(self, *args: str, input_text: str | None = None) -> str:
        command = [self.binary, "--kubeconfig", str(self.cluster.paths.kubeconfig), *args]
        result = subprocess.run(command, input=input_text, capture_output=True, text=True, timeout=180, check=False)
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args[:2])} failed ({result.returncode}):\n{result.stderr}")
        return result.stdout

    def template(self, release: str, namespace: str, values: dict[str, Any], *extra: str) -> list[Manifest]:
        # helm built with `go install` defaults to Kubernetes v1.20, which the chart's kubeVersion refuses.
        text = self.run("template", release, str(CHART_DIR), "--namespace", namespace, "-f", "-",
                        "--kube-version", KUBERNETES_VERSION.lstrip("v"), *extra, input_text=yaml.safe_dump(values))
        return [doc for doc in yaml.safe_load_all(text) if doc]


def existing_peering_crds(cluster: LocalCluster) -> list[str]:
    return [crd for crd in PEERING_CRDS if cluster.kubectl("get", "crd", crd, "-o", "name", check=False)]


class Release:
    """One install of the chart; `install` then `uninstall`, both waiting for the API server to agree."""

    def __init__(self, helm: Helm, name: str, namespace: str, values: dict[str, Any]) -> None:
        self.helm = helm
        self.name = name
        self.namespace = namespace
        # Another release (a concurrent test session's, or a platform install) may own kopf's shared peering
        # CRDs already; the chart's peering.installCRDs exists for exactly that case.
        self._decides_peering_crds = "installCRDs" not in values.get("peering", {})
        peering = {"installCRDs": not existing_peering_crds(helm.cluster), **values.get("peering", {})}
        self.values = {**values, "peering": peering}

    @property
    def installs_peering_crds(self) -> bool:
        peering = self.values["peering"]
        return bool(peering.get("enabled", True) and peering["installCRDs"])

    def install(self) -> Release:
        # e2e lanes install releases at once: whether the peering CRDs exist is decided again, and acted on, by one
        # lane at a time (two releases both rendering them would collide on helm's ownership of the CRDs).
        with (self.helm.cluster.paths.root / "helm-peering-crds.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._decides_peering_crds:
                self.values["peering"]["installCRDs"] = not existing_peering_crds(self.helm.cluster)
            self.helm.run("install", self.name, str(CHART_DIR), "--namespace", self.namespace, "--create-namespace",
                          "-f", "-", "--wait", "--timeout", HELM_TIMEOUT, input_text=yaml.safe_dump(self.values))
        return self

    def manifest(self) -> list[Manifest]:
        """Every object the release created, as helm recorded it (crds/ are not part of a release)."""
        text = self.helm.run("get", "manifest", self.name, "--namespace", self.namespace)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.helm.run("status", self.name, "-n", self.namespace, "-o", "json"))
        return result

    def uninstall(self) -> None:
        self.helm.run("uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout", HELM_TIMEOUT)

    def cleanup(self) -> None:
        """Best-effort teardown for fixtures: uninstall if still installed, then drop the release namespace."""
        listed = self.helm.run("list", "--namespace", self.namespace, "-q")
        if self.name in listed.split():
            self.uninstall()
        self.helm.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)
