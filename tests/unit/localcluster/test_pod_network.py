"""Two local clusters on one machine must hand out different loopback pod IPs."""

from __future__ import annotations

import ipaddress

import pytest

from localcluster.cluster import pod_network_octet
from localcluster.errors import ClusterError
from localcluster.fleet import Fleet, node_objects

FLEET = {
    "gpuModels": {"mi300x": {"deviceId": "74a1", "productName": "AMD_Instinct_MI300X_OAM", "vram": "192G",
                           "family": "AI", "cuCount": 304, "simdCount": 1216}},
    "nodeGroups": [{"prefix": "mi300x", "count": 2, "gpus": [{"model": "mi300x", "count": 8}]}],
}


@pytest.mark.parametrize(
    ("env", "octet"),
    [({}, 0), ({"SPECDEC_CLUSTER_PORT_BASE": "27000"}, 1), ({"SPECDEC_CLUSTER_PORT_BASE": "31000"}, 5),
     ({"SPECDEC_CLUSTER_PORT_BASE": "27000", "SPECDEC_CLUSTER_POD_OCTET": "42"}, 42)],
)
def test_pod_network_follows_the_port_base(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], octet: int) -> None:
    monkeypatch.delenv("SPECDEC_CLUSTER_PORT_BASE", raising=False)
    monkeypatch.delenv("SPECDEC_CLUSTER_POD_OCTET", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert pod_network_octet() == octet


def test_out_of_range_octet_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CLUSTER_POD_OCTET", "300")
    with pytest.raises(ClusterError, match="SPECDEC_CLUSTER_POD_OCTET"):
        pod_network_octet()


def test_node_pod_cidrs_are_loopback_and_disjoint_between_clusters() -> None:
    fleet = Fleet.model_validate(FLEET)
    first = [node["spec"]["podCIDR"] for node in node_objects(fleet, 0)]
    second = [node["spec"]["podCIDR"] for node in node_objects(fleet, 1)]
    assert first == ["127.0.1.0/24", "127.0.2.0/24"]
    assert second == ["127.1.1.0/24", "127.1.2.0/24"]
    loopback = ipaddress.ip_network("127.0.0.0/8")
    assert all(ipaddress.ip_network(cidr).subnet_of(loopback) for cidr in first + second)
