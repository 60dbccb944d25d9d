"""Pinned versions of everything the local control plane builds. Bump here and in hack/gomod/*."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GOMOD_ROOT = Path(__file__).resolve().parent.parent / "gomod"

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
GATEWAY_API_VERSION = "v1.4.1"
# Prometheus tags its Go module v0.<major><minor>.<patch>: v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_VERSION = "v0.316.0"
PROMETHEUS_RELEASE = "3.16.0"  # what `prometheus --version` reports
# The module zip carries example/prometheus-operator-crd/*.yaml, the CRDs the e2e tests install.
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
# A real Gateway API implementation for the local data path (its kubernetesGateway provider writes HTTPRoute status).
TRAEFIK_VERSION = "v3.7.13"
# The lego release Traefik's go.mod requires; hack/gomod/traefik builds it without its DNS-01 providers.
LEGO_VERSION = "v5.4.1"
# Event-driven autoscaling for the local metrics pipeline (docs/autoscaling.md): KEDA's operator and metrics server.
KEDA_VERSION = "v2.21.0"


def _version_ldflags(version: str) -> list[str]:
    """-X flags so `kubectl version` reports the real release instead of v0.0.0-master."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return flags


@dataclass(frozen=True)
class GoBuild:
    """One wrapper module under hack/gomod and the commands built from it."""

    name: str
    version: str
    packages: dict[str, str]  # binary name -> Go package path
    tags: str = ""
    ldflags: tuple[str, ...] = ()

    @property
    def module_dir(self) -> Path:
        return GOMOD_ROOT / self.name


BUILDS: tuple[GoBuild, ...] = (
    GoBuild(
        name="kubernetes",
        version=KUBERNETES_VERSION,
        packages={
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        },
        tags="selinux,notest",
        ldflags=tuple(_version_ldflags(KUBERNETES_VERSION)),
    ),
    GoBuild(name="etcd", version=ETCD_VERSION, packages={"etcd": "go.etcd.io/etcd/server/v3"}),
    GoBuild(name="kwok", version=KWOK_VERSION, packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
    GoBuild(name="helm", version=HELM_VERSION, packages={"helm": "helm.sh/helm/v3/cmd/helm"}),
)

# Tools the tests use but the control plane does not need: built on demand (`hack/cluster tools`), so a
# cluster start never waits for them. promtool evaluates the chart's alerting rules (`promtool test rules`);
# remove_all_sd leaves out every service-discovery plugin, which promtool's rule tests never use.
TOOLS: tuple[GoBuild, ...] = (
    GoBuild(name="promtool", version=PROMETHEUS_VERSION,
            packages={"promtool": "github.com/prometheus/prometheus/cmd/promtool"}, tags="remove_all_sd"),
)

# Built only on request (`hack/cluster tools --gateway`): no test needs it yet (docs/local-traffic.md says why it
# cannot carry traffic to the fake pods), and a cold build is a thousand packages.
GATEWAY_TOOLS: tuple[GoBuild, ...] = (
    GoBuild(name="traefik", version=TRAEFIK_VERSION,
            packages={"traefik": "github.com/traefik/traefik/v3/cmd/traefik"}),
)

# Built only on request (`hack/cluster tools --autoscaling`): the metrics pipeline of docs/autoscaling.md. The
# Prometheus server keeps static_configs, file_sd and http_sd under remove_all_sd (its plugins/minimum.go); KEDA is
# the operator (ScaledObject -> HPA, the scalers) and its external metrics API server ("adapter"), a cold build of
# several thousand packages (hack/gomod/keda/README.md).
AUTOSCALING_TOOLS: tuple[GoBuild, ...] = (
    GoBuild(name="prometheus", version=PROMETHEUS_VERSION,
            packages={"prometheus": "github.com/prometheus/prometheus/cmd/prometheus"}, tags="remove_all_sd",
            ldflags=(f"-X github.com/prometheus/common/version.Version={PROMETHEUS_RELEASE}",
                     "-X github.com/prometheus/common/version.Branch=HEAD")),
    GoBuild(name="keda", version=KEDA_VERSION,
            packages={"keda": "github.com/kedacore/keda/v2/cmd/operator",
                      "keda-adapter": "github.com/kedacore/keda/v2/cmd/adapter"},
            ldflags=(f"-X github.com/kedacore/keda/v2/version.Version={KEDA_VERSION.lstrip('v')}",)),
)
