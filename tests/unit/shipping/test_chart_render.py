"""`helm lint` and `helm template`: the Deployment, settings, CRDs and the add-ons the chart renders."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kopf._cogs.structs import references as kopf_references

from specdec_operator.crdfiles import CRD_FILE_NAME
from specdec_operator.settings import OperatorEnvSettings
from tests.unit.shipping.chart import (
    CHART_DIR,
    RELEASE,
    RELEASE_NAMESPACE,
    REPO_ROOT,
    Manifest,
    of_kind,
    one,
    render,
    run_helm,
)


def _container(manifests: list[Manifest]) -> dict[str, Any]:
    containers = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _settings_env(manifests: list[Manifest]) -> dict[str, str]:
    return {var["name"]: var["value"] for var in _container(manifests)["env"] if var["name"].startswith("SPECDEC_")}


def _settings_from_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> OperatorEnvSettings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return OperatorEnvSettings()


# Lint reports the default values' missing scope but passes: `helm install` is what refuses it.
@pytest.mark.parametrize("set_args", [[], ["watchNamespaces={team-a,team-b}"], ["metrics.serviceMonitor.enabled=true"]])
def test_helm_lint_passes(helm: str, set_args: list[str]) -> None:
    result = run_helm(
        helm, "lint", "--strict", str(CHART_DIR), *(arg for value in set_args for arg in ("--set", value))
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("set_args", "says"), [
    ([], "watchNamespaces is empty and clusterWide is not true"),
    (["--set-json", "watchNamespaces=[]"], "watchNamespaces is empty and clusterWide is not true"),
    (["--set", "clusterWide=false"], "watchNamespaces is empty and clusterWide is not true"),
    (["--set", "clusterWide=true", "--set", "watchNamespaces={team-a}"], "set one of them, not both"),
])
def test_rendering_without_an_explicit_scope_fails_naming_both_values(
    helm: str, set_args: list[str], says: str
) -> None:
    # What `helm install` renders; tests/e2e/test_chart_install.py runs the install itself against a cluster.
    args = ["template", RELEASE, str(CHART_DIR), "--namespace", RELEASE_NAMESPACE, *set_args]
    result = run_helm(helm, *args)
    assert result.returncode != 0, result.stdout
    assert says in result.stderr and "watchNamespaces" in result.stderr and "clusterWide" in result.stderr, (
        result.stderr)


def test_cluster_wide_and_namespaced_scopes_reach_the_operator(helm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    wide = _settings_from_env(_settings_env(render(helm, "clusterWide=true")), monkeypatch)
    assert (wide.cluster_wide, wide.namespaces, wide.scope_problem()) == (True, [], None)
    monkeypatch.delenv("SPECDEC_CLUSTER_WIDE")
    scoped = _settings_from_env(_settings_env(render(helm, "watchNamespaces={team-a}")), monkeypatch)
    assert (scoped.cluster_wide, scoped.namespaces, scoped.scope_problem()) == (False, ["team-a"], None)


def test_operator_runs_two_peered_replicas(default_manifests: list[Manifest]) -> None:
    deployment = one(default_manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    env = _settings_env(default_manifests)
    assert env["SPECDEC_STANDALONE"] == "false"
    # kopf takes its peering identity from POD_ID; the pod name tells the replicas apart.
    pod_id = next(var for var in _container(default_manifests)["env"] if var["name"] == "POD_ID")
    assert pod_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert one(default_manifests, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_container_is_locked_down(default_manifests: list[Manifest]) -> None:
    pod = one(default_manifests, "Deployment")["spec"]["template"]["spec"]
    container = _container(default_manifests)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"].keys() >= {"cpu", "memory"}
    assert container["resources"]["limits"]["memory"]


@pytest.mark.parametrize("kind", ["livenessProbe", "readinessProbe"])
def test_the_probes_hit_the_endpoint_kopf_serves(default_manifests: list[Manifest], kind: str) -> None:
    # Readiness too: kopf serves the endpoint only once the startup handlers are done, and it fails while
    # a background task cannot recover (handlers/services/supervisor.py).
    container = _container(default_manifests)
    args = container["args"]
    assert args[0] == "run"
    liveness_url = args[args.index("--liveness") + 1]
    probe = container[kind]["httpGet"]
    port = next(port["containerPort"] for port in container["ports"] if port["name"] == probe["port"])
    assert liveness_url == f"http://0.0.0.0:{port}{probe['path']}"


def test_settings_env_parses_to_the_operator_defaults(
    default_manifests: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The chart's defaults are the operator's defaults: installing the chart changes no behaviour.
    # default_manifests are the cluster-wide install (tests/unit/shipping/chart.py): the chart's other defaults
    # are the operator's, but for metrics.auth.enabled (on in the chart, off for a bare operator).
    expected = OperatorEnvSettings(cluster_wide=True, metrics_auth=True)
    assert _settings_from_env(_settings_env(default_manifests), monkeypatch) == expected


def test_settings_env_carries_the_values(helm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render(
        helm,
        "watchNamespaces={team-a}",
        "runtime.images.gfx942=registry.example/vllm:gfx942-1",
        "scrape.intervalSeconds=20",
        "scrape.loopbackOnly=true",
        "peering.name=fleet-peering",
        "shard.name=blue",
        "shard.modelSelector=specdec.io/shard in (blue)",
        "nodeMissingGraceSeconds=90",
    )
    settings = _settings_from_env(_settings_env(manifests), monkeypatch)
    assert settings.namespaces == ["team-a"]
    assert settings.runtime_images["gfx942"] == "registry.example/vllm:gfx942-1"
    assert settings.scrape_interval_seconds == 20
    assert settings.scrape_loopback_only is True
    assert settings.peering_name == "fleet-peering"
    assert settings.shard == "blue" and settings.model_selector == "specdec.io/shard in (blue)"
    assert settings.node_missing_grace_seconds == 90


def test_gpu_devices_value_extends_the_operator_device_table(helm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render(
        helm,
        "gpuDevices[0].deviceId=7fff", "gpuDevices[0].product=Custom VF", "gpuDevices[0].gfx=gfx942",
        "gpuDevices[0].vramGib=96",
    )
    table = _settings_from_env(_settings_env(manifests), monkeypatch).device_table
    device = table.get("7fff")
    assert device is not None and (device.product, device.gfx, device.vram_gib) == ("Custom VF", "gfx942", 96)
    assert table.get("74b5") is not None  # the built-in rows stay


# Settings the chart already sets that the operator has yet to read. Strict: once the field exists in
# OperatorEnvSettings the mark fails, so it is removed together with the pending entry.


def _env_names() -> list[Any]:
    names = [
        "SPECDEC_NAMESPACES",
        "SPECDEC_CLUSTER_WIDE",
        "SPECDEC_GPU_DEVICES",
        "SPECDEC_FIELD_MANAGER",
        "SPECDEC_RUNTIME_IMAGES",
        "SPECDEC_IMAGE_TARGETS",
        "SPECDEC_SIMULATOR_IMAGE",
        "SPECDEC_RUNTIME_POD_SECURITY",
        "SPECDEC_RUNTIME_SUPPLEMENTAL_GROUPS",
        "SPECDEC_RUNTIME_FS_GROUP",
        "SPECDEC_WEIGHTS_CACHE_CLAIM",
        "SPECDEC_RECONCILE_INTERVAL_SECONDS",
        "SPECDEC_FREEZE_ROLLOUTS",
        "SPECDEC_MAX_CONCURRENT_ROLLOUTS",
        "SPECDEC_NODE_MISSING_GRACE_SECONDS",
        "SPECDEC_FLEET_AUDIT_INTERVAL_SECONDS",
        "SPECDEC_SCRAPE_INTERVAL_SECONDS",
        "SPECDEC_SCRAPE_TIMEOUT_SECONDS",
        "SPECDEC_SCRAPE_CONCURRENCY",
        "SPECDEC_SCRAPE_LOOPBACK_ONLY",
        "SPECDEC_KV_HEADROOM_FRACTION",
        "SPECDEC_METRICS_PORT",
        "SPECDEC_METRICS_AUTH",
        "SPECDEC_PEERING_NAME",
        "SPECDEC_STANDALONE",
        "SPECDEC_SHARD",
        "SPECDEC_MODEL_SELECTOR",
        "SPECDEC_LOG_FORMAT",
    ]
    return names


def test_env_names_cover_what_the_chart_renders(default_manifests: list[Manifest]) -> None:
    rendered = set(_settings_env(default_manifests))
    listed = {param if isinstance(param, str) else param.values[0] for param in _env_names()}
    assert rendered == listed


@pytest.mark.parametrize("env_name", _env_names())
def test_every_env_var_is_an_operator_setting(env_name: str) -> None:
    field = env_name.removeprefix("SPECDEC_").lower()
    assert field in OperatorEnvSettings.model_fields


def test_standalone_needs_a_single_replica(helm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AssertionError, match="set replicaCount to 1"):
        render(helm, "peering.enabled=false")
    manifests = render(helm, "peering.enabled=false", "replicaCount=1")
    assert _settings_from_env(_settings_env(manifests), monkeypatch).standalone is True
    assert of_kind(manifests, "PodDisruptionBudget") == []
    crd_groups = {crd["spec"]["group"] for crd in of_kind(manifests, "CustomResourceDefinition")}
    assert crd_groups == {"specdec.io"}


def test_chart_crds_are_the_generated_crds(default_manifests: list[Manifest]) -> None:
    generated = yaml.safe_load((REPO_ROOT / "crds" / CRD_FILE_NAME).read_text())
    rendered = [
        crd for crd in of_kind(default_manifests, "CustomResourceDefinition") if crd["spec"]["group"] == "specdec.io"
    ]
    assert rendered == [generated]


def test_kopf_peering_crds_define_the_resources_kopf_uses(default_manifests: list[Manifest]) -> None:
    defined = {
        kopf_references.Resource(
            group=crd["spec"]["group"],
            version=version["name"],
            plural=crd["spec"]["names"]["plural"],
            kind=crd["spec"]["names"]["kind"],
            singular=crd["spec"]["names"]["singular"],
            namespaced=crd["spec"]["scope"] == "Namespaced",
        )
        for crd in of_kind(default_manifests, "CustomResourceDefinition")
        for version in crd["spec"]["versions"]
    }
    # kopf looks its peering resources up with these selectors (kopf.dev first, zalando.org as legacy).
    for selector, namespaced in [
        (kopf_references.CLUSTER_PEERINGS_K, False),
        (kopf_references.NAMESPACED_PEERINGS_K, True),
    ]:
        matches = selector.select(defined)
        assert [resource.namespaced for resource in matches] == [namespaced], selector


def test_kopf_peering_crds_can_be_left_to_another_release(helm: str) -> None:
    manifests = render(helm, "peering.installCRDs=false")
    assert {crd["spec"]["group"] for crd in of_kind(manifests, "CustomResourceDefinition")} == {"specdec.io"}


def test_metrics_service_selects_the_operator_port(default_manifests: list[Manifest]) -> None:
    service = one(default_manifests, "Service")
    pod_labels = one(default_manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {port["name"] for port in _container(default_manifests)["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= container_ports
    assert of_kind(default_manifests, "ServiceMonitor") == []


def test_service_monitor_scrapes_the_metrics_service(helm: str) -> None:
    manifests = render(helm, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.interval=15s")
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [RELEASE_NAMESPACE]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["interval"] == "15s"
    # The series carry the SpeculativeModel's namespace label, which must not be renamed exported_namespace.
    assert endpoint["honorLabels"] is True


def test_authenticated_metrics_by_default_and_the_service_monitor_sends_a_reader_token(helm: str) -> None:
    manifests = render(helm, "clusterWide=true", "metrics.serviceMonitor.enabled=true",
                       "metrics.auth.readers[0].kind=ServiceAccount", "metrics.auth.readers[0].name=prometheus-k8s",
                       "metrics.auth.readers[0].namespace=monitoring")
    env = _settings_env(manifests)
    assert env["SPECDEC_METRICS_AUTH"] == "true"
    endpoint = one(manifests, "ServiceMonitor")["spec"]["endpoints"][0]
    secret_name = endpoint["authorization"]["credentials"]["name"]
    secret = next(s for s in of_kind(manifests, "Secret") if s["metadata"]["name"] == secret_name)
    assert secret["type"] == "kubernetes.io/service-account-token"
    scraper = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    reader = next(r for r in of_kind(manifests, "ClusterRole") if r["metadata"]["name"].endswith("-metrics-reader"))
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = next(b for b in of_kind(manifests, "ClusterRoleBinding")
                   if b["roleRef"]["name"] == reader["metadata"]["name"])
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": scraper, "namespace": RELEASE_NAMESPACE},
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"},
    ]
    off = render(helm, "clusterWide=true", "metrics.serviceMonitor.enabled=true", "metrics.auth.enabled=false")
    assert _settings_env(off)["SPECDEC_METRICS_AUTH"] == "false"
    assert "authorization" not in one(off, "ServiceMonitor")["spec"]["endpoints"][0]
    assert of_kind(off, "Secret") == []


def test_dashboard_config_map_ships_the_dashboard(default_manifests: list[Manifest]) -> None:
    dashboards = [cm for cm in of_kind(default_manifests, "ConfigMap") if cm["metadata"]["name"].endswith("-dashboard")]
    (config_map,) = dashboards
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(config_map["data"]["specdec-operator.json"])
    assert shipped == json.loads((CHART_DIR / "dashboards" / "specdec-operator.json").read_text())


def test_argocd_health_check_ships_the_lua_file(default_manifests: list[Manifest]) -> None:
    lua_file = CHART_DIR / "files" / "argocd-health.lua"
    health = [cm for cm in of_kind(default_manifests, "ConfigMap") if cm["metadata"]["name"].endswith("-argocd-health")]
    if not lua_file.exists():
        # Rendering an empty health check would make Argo CD report every model Healthy.
        assert health == []
        return
    (config_map,) = health
    assert config_map["data"] == {
        "resource.customizations.health.specdec.io_SpeculativeModel": lua_file.read_text().rstrip("\n")
    }


def test_every_namespaced_object_lands_in_the_release_namespace(default_manifests: list[Manifest]) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    for manifest in default_manifests:
        if manifest["kind"] not in cluster_scoped:
            assert manifest["metadata"]["namespace"] == RELEASE_NAMESPACE, manifest["metadata"]["name"]


def test_network_policy_is_off_by_default(default_manifests: list[Manifest]) -> None:
    assert of_kind(default_manifests, "NetworkPolicy") == []


def test_network_policy_opens_exactly_what_the_operator_serves_and_calls(helm: str) -> None:
    from specdec_runtime import contract
    from tests.unit.api.specfactories import spec
    from tests.unit.render.renderfactories import rendered_pool

    manifests = render(helm, "networkPolicy.enabled=true", "watchNamespaces={team-a,team-b}",
                       "networkPolicy.apiServer.cidrs={10.0.0.10/32}")
    policy = one(manifests, "NetworkPolicy")["spec"]
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    # Ingress: the container's metrics and liveness ports, nothing else.
    served = {port["port"] for rule in policy["ingress"] for port in rule["ports"]}
    assert served == {port["name"] for port in _container(manifests)["ports"]} == {"metrics", "health"}
    api_server, runtime = policy["egress"]
    assert {port["port"] for port in api_server["ports"]} == {443, 6443}
    assert api_server["to"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    # Egress to the runtime pods: the port and labels of the pods the operator renders, in the watched namespaces.
    pool = rendered_pool(spec())
    (runtime_port,) = [p["containerPort"] for p in pool.container["ports"] if p["name"] == contract.PORT_NAME]
    assert runtime["ports"] == [{"port": runtime_port, "protocol": "TCP"}]
    (peer,) = runtime["to"]
    assert peer["podSelector"]["matchLabels"].items() <= pool.template["metadata"]["labels"].items()
    assert peer["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]


def test_network_policy_without_cidrs_or_watched_namespaces_allows_any_address_on_the_api_ports(helm: str) -> None:
    policy = one(render(helm, "networkPolicy.enabled=true"), "NetworkPolicy")["spec"]
    api_server, runtime = policy["egress"]
    assert "to" not in api_server
    assert runtime["to"][0]["namespaceSelector"] == {}
