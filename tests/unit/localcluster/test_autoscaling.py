"""The local metrics pipeline's objects: the aggregator must reach KEDA's metrics server on loopback only."""

from __future__ import annotations

import base64
import dataclasses
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import yaml

from localcluster.autoscaling import (
    EXTERNAL_METRICS_APISERVICE,
    AutoscalingPipeline,
    AutoscalingPorts,
    cluster_objects,
    free_loopback_port,
    prometheus_config,
)
from localcluster.cluster import LocalCluster, Ports


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


def test_a_taken_port_moves_to_a_free_one_and_the_ports_are_remembered(tmp_path: Path) -> None:
    # A base in the ephemeral range shares ports with client sockets: a taken port must not stop the pipeline.
    cluster = SimpleNamespace(paths=SimpleNamespace(root=tmp_path, pids=tmp_path / "pids"), log=lambda _: None)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        free = [free_loopback_port() for _ in dataclasses.fields(AutoscalingPorts)]
        ports = dataclasses.replace(AutoscalingPorts(*free), keda_metrics=taken)
        pipeline = AutoscalingPipeline(cast(LocalCluster, cluster), ports)
        pipeline._claim_ports()
    assert pipeline.ports.keda_metrics != taken
    assert dataclasses.replace(pipeline.ports, keda_metrics=taken) == ports  # only the taken one moved
    # A later pipeline (the test's fixture, `hack/cluster autoscaling` again) finds the processes' ports.
    assert AutoscalingPipeline(cast(LocalCluster, cluster)).ports == pipeline.ports
