"""The chart as a platform team installs it: lint, template, `helm install` into a real API server, uninstall.

Helm installs the files in a chart's crds/ directory only when the CRD is absent, and never upgrades or
deletes them: uninstalling a release must not delete every SpeculativeModel in the cluster with it. The
session's `crds` fixture has already applied the same CRD, so here helm skips it and the test checks
that it survives the uninstall. kopf's peering CRDs are templates annotated helm.sh/resource-policy: keep
(other kopf operators may use them), so they are created with the release (unless another release owns
them already, see `Release`) and stay after it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import yaml

from localcluster.cluster import LocalCluster
from localcluster.versions import KUBERNETES_VERSION
from tests.e2e.helm import (
    CHART_DIR,
    SM_CRD,
    Helm,
    Manifest,
    Release,
    existing_peering_crds,
    resource_ref,
    unique_name,
)
from tests.e2e.kube import Kube, wait_for

# Exclusive: installs and uninstalls the chart's cluster-scoped objects (CRDs, ClusterRoles, webhooks).
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

# What the default values render: one operator Deployment (two peered replicas) and everything around it.
DEFAULT_KINDS = Counter({
    "ServiceAccount": 1,
    "ClusterRole": 3,  # cluster-scoped reads and peering; the workload rules for every namespace; metrics-reader
    "ClusterRoleBinding": 2,
    "Deployment": 1,
    "PodDisruptionBudget": 1,
    "Service": 1,
    "ConfigMap": 2,  # Grafana dashboard, Argo CD health check
    "CustomResourceDefinition": 2,  # kopf's ClusterKopfPeering and KopfPeering
})


@pytest.fixture
def helm(cluster: LocalCluster) -> Helm:
    return Helm(cluster)


def _exists(cluster: LocalCluster, obj: Manifest) -> bool:
    namespace = obj["metadata"].get("namespace")
    scope = ["-n", namespace] if namespace else []
    return bool(cluster.kubectl("get", resource_ref(obj), *scope, "-o", "name", check=False).strip())


def _absent(cluster: LocalCluster, obj: Manifest) -> bool:
    return not _exists(cluster, obj)


def test_lint_and_template_pass(helm: Helm) -> None:
    out = helm.run("lint", str(CHART_DIR), "--strict", "--kube-version", KUBERNETES_VERSION.lstrip("v"))
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    rendered = helm.template("specdec", "specdec-system", {"clusterWide": True})
    assert Counter(doc["kind"] for doc in rendered) == DEFAULT_KINDS


def test_install_without_an_explicit_scope_fails_naming_both_values(cluster: LocalCluster, helm: Helm) -> None:
    name, namespace = unique_name("noscope"), unique_name("e2e-noscope-sys")
    with pytest.raises(AssertionError) as refused:
        helm.run("install", name, str(CHART_DIR), "--namespace", namespace, "--create-namespace",
                 "--set-json", "watchNamespaces=[]")
    message = str(refused.value)
    assert "watchNamespaces is empty and clusterWide is not true" in message and "clusterWide: true" in message
    assert not cluster.kubectl("get", "namespace", namespace, "-o", "name", check=False).strip()


def test_install_creates_every_object_and_uninstall_removes_them(cluster: LocalCluster, crds: None,
                                                                 helm: Helm) -> None:
    # Default values with the cluster-wide scope, as the README installs it; the two replicas land on KWOK
    # nodes, which run no containers, so they never act against this cluster.
    release = Release(helm, unique_name("chart"), unique_name("e2e-chart-sys"), {"clusterWide": True})
    expected = DEFAULT_KINDS.copy()
    if not release.installs_peering_crds:
        expected["CustomResourceDefinition"] = 0
    try:
        release.install()
        created = release.manifest()
        assert Counter(doc["kind"] for doc in created) == +expected
        # What install created is exactly what template renders for the same values.
        rendered = helm.template(release.name, release.namespace, release.values)
        assert sorted(map(resource_ref, created)) == sorted(map(resource_ref, rendered))
        for obj in created:
            assert _exists(cluster, obj), f"{resource_ref(obj)} missing after helm install"
        assert release.status()["info"]["status"] == "deployed"

        kube = Kube(cluster, release.namespace)
        deployment = next(doc for doc in created if doc["kind"] == "Deployment")
        live = kube.get("deployment", deployment["metadata"]["name"])
        assert live["status"].get("availableReplicas") == 2, live["status"]
        # The API server accepted the locked-down pod spec as rendered.
        container = live["spec"]["template"]["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        for pod in kube.items("pods", "app.kubernetes.io/instance=" + release.name):
            assert ipaddress.ip_address(pod["status"]["podIP"]).is_loopback

        release.uninstall()
        kept = [obj for obj in created
                if obj["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep"]
        assert sorted(obj["kind"] for obj in kept) == ["CustomResourceDefinition"] * expected[
            "CustomResourceDefinition"]
        for obj in created:
            if obj in kept:
                assert _exists(cluster, obj), f"{resource_ref(obj)} was deleted despite its keep policy"
            else:
                wait_for(f"{resource_ref(obj)} deleted", partial(_absent, cluster, obj), 60)
        # crds/ stays by Helm's design, and with it every SpeculativeModel.
        assert cluster.kubectl("get", "crd", SM_CRD, "-o", "name", check=False).strip(), f"{SM_CRD} was deleted"
    finally:
        release.cleanup()


# Every optional piece on at once, so the dry run below sees every template the chart can render.
ALL_OPTIONS: dict[str, object] = {
    "watchNamespaces": ["team-a", "team-b"],
    "crds": {"templated": True, "keep": True},
    "logging": {"format": "json"},
    "shard": {"name": "shard-a", "modelSelector": "specdec.io/shard=a"},
    "runtime": {"pod": {"weightsCacheClaim": "hf-cache"}},
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True}},
}


def test_every_option_rendered_passes_the_api_servers_validation(cluster: LocalCluster, helm: Helm,
                                                                 monitoring_crds: None) -> None:
    """The rendered manifests, every option on, validated by the real Kubernetes 1.36 API server: a
    server-side dry run checks each object against its built-in schema or its CRD's (Prometheus Operator's,
    installed from its module), and admission, without persisting anything."""
    namespace = unique_name("e2e-dryrun-sys")
    rendered = helm.template("specdec", namespace, ALL_OPTIONS)
    kinds = Counter(doc["kind"] for doc in rendered)
    assert {"PrometheusRule", "PodMonitor", "ServiceMonitor", "Role", "RoleBinding"} <= set(kinds), kinds
    assert any(doc["kind"] == "CustomResourceDefinition" and doc["metadata"]["name"] == SM_CRD for doc in rendered)
    # The namespaces must exist for a dry run of the objects in them; nothing else is created.
    for name in (namespace, "team-a", "team-b"):
        cluster.kubectl("create", "namespace", name, check=False)
    try:
        out = cluster.kubectl("apply", "--dry-run=server", "--server-side", "--force-conflicts",
                              "--field-manager", "helm", "-f", "-",
                              input_text=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": rendered}))
        accepted = [line for line in out.splitlines() if line.strip()]
        assert len(accepted) == len(rendered), out
        assert all("(server dry run)" in line for line in accepted), out
    finally:
        for name in (namespace, "team-a", "team-b"):
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


REPO = Path(__file__).resolve().parents[2]


def readme_install_commands() -> list[str]:
    """The README's "Installing into a real cluster" block, one command per entry (continuations joined)."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Installing into a real cluster"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's install section has no bash block"
    return [command.strip() for command in block.group(1).replace("\\\n", " ").splitlines() if command.strip()]


def test_the_readmes_install_commands_work_as_written_on_a_fresh_cluster(cluster: LocalCluster, crds: None,
                                                                         helm: Helm) -> None:
    """A newcomer's path: the README's commands, run by a shell from the checkout. The chart refuses a
    watched namespace that does not exist with a message naming it and the fix, before creating anything."""
    commands = readme_install_commands()
    helm_install = next(command for command in commands if command.startswith("helm install"))
    names = re.search(r"helm install (\S+) \S+ -n (\S+)", helm_install)
    assert names, helm_install
    release, release_namespace = names.groups()
    watched = re.findall(r"watchNamespaces='\{([^}]*)\}'", helm_install)[0].split(",")
    env = {**os.environ, "KUBECONFIG": str(cluster.paths.kubeconfig),
           "PATH": os.pathsep.join([str(cluster.binaries["kubectl"].parent), str(cluster.binaries["helm"].parent),
                                    os.environ["PATH"]])}
    # kopf's peering CRDs are shared and kept after an uninstall: on a fresh cluster the chart creates them,
    # here another release of this session may own them already (the chart's value for that case).
    if existing_peering_crds(cluster):
        commands = [command.replace("helm install", "helm install --set peering.installCRDs=false", 1)
                    if command is helm_install else command for command in commands]
        helm_install = next(command for command in commands if command.startswith("helm install"))

    def shell(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=180, check=False)

    def gone(namespace: str) -> bool:
        return not cluster.kubectl("get", "namespace", namespace, "-o", "name", check=False).strip()

    for namespace in [*watched, release_namespace]:
        wait_for(f"namespace {namespace} absent (a fresh cluster)", partial(gone, namespace), 120, 1)
    try:
        # Without the namespace the chart stops with its own message, and nothing of the release is left.
        refused = shell(helm_install)
        assert refused.returncode != 0, refused.stdout
        assert f"namespace(s) {', '.join(watched)} do not exist" in refused.stderr, refused.stderr
        assert f"kubectl create namespace {' '.join(watched)}" in refused.stderr, refused.stderr
        assert release not in helm.run("list", "-A", "-q").split()
        # As written, top to bottom.
        for command in commands:
            result = shell(command)
            assert result.returncode == 0, f"README command failed: {command}\n{result.stderr}"
        assert helm.run("status", release, "-n", release_namespace).count("STATUS: deployed") == 1
        models = Kube(cluster, watched[0]).items("sm")
        assert [model["metadata"]["name"] for model in models], "the README's example created no model"
    finally:
        listed = helm.run("list", "--namespace", release_namespace, "-q").split()
        if release in listed:
            helm.run("uninstall", release, "--namespace", release_namespace, "--wait", "--timeout", "120s")
        for namespace in [*watched, release_namespace]:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
