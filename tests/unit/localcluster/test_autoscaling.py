"""The local metrics pipeline's objects: the aggregator must reach KEDA's metrics server on loopback only."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

import pytest
import yaml

from localcluster.autoscaling import EXTERNAL_METRICS_APISERVICE, AutoscalingPorts, cluster_objects, prometheus_config
from localcluster.cluster import Ports


def test_the_apiservice_points_at_an_externalname_service_on_loopback(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    namespace, service, apiservice = cluster_objects(ca, 35643)
    assert service["spec"] == {"type": "ExternalName", "externalName": "127.0.0.1"}  # no ClusterIP, no Endpoints
    spec = apiservice["spec"]
    assert apiservice["metadata"] == {"name": EXTERNAL_METRICS_APISERVICE}
    # kube-aggregator dials https://<externalName>:<spec.service.port> and checks the cert against the CA bundle.
    assert spec["service"] == {"name": service["metadata"]["name"], "namespace": namespace["metadata"]["name"],
                               "port": 35643}
    assert base64.b64decode(spec["caBundle"]) == ca.read_bytes()
    assert "insecureSkipTLSVerify" not in spec


def test_prometheus_scrapes_only_the_file_sd_targets(tmp_path: Path) -> None:
    config = yaml.safe_load(prometheus_config(tmp_path / "targets.json"))
    (job,) = config["scrape_configs"]
    assert job["file_sd_configs"] == [{"files": [str(tmp_path / "targets.json")], "refresh_interval": "5s"}]
    assert "static_configs" not in job


@pytest.mark.parametrize("base", ["26000", "35000"])
def test_pipeline_ports_do_not_collide_with_the_control_plane(monkeypatch: pytest.MonkeyPatch, base: str) -> None:
    monkeypatch.setenv("SPECDEC_CLUSTER_PORT_BASE", base)
    pipeline = list(dataclasses.astuple(AutoscalingPorts.from_env()))
    control_plane = list(dataclasses.astuple(Ports.from_env()))
    assert len(set(pipeline + control_plane)) == len(pipeline) + len(control_plane)
