"""The local fleets advertise the host cores and memory that runtime pods now request.

Runtime pods request cpu and memory for what they load (render/podspec.py), and the local control plane's real
scheduler places them by it: every GPU node of the demo and scale fleets must hold a full node of the pods the
examples and e2e models render, or e2e pods would stay Pending for want of host memory instead of GPUs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from localcluster.fleet import load_fleet, node_objects
from localcluster.scale import fleet_yaml
from specdec_operator.api.kubeformats import quantity_value
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.decisions.weights import target_weights
from specdec_operator.render.podspec import container_resources

REPO_ROOT = Path(__file__).resolve().parents[3]
# The largest shapes the examples and e2e tests run: model, drafters, tensor-parallel sizes.
SHAPES: list[dict[str, Any]] = [
    {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
     "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
                  {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct"}]},
    {"model": {"name": "meta-llama/Llama-3.3-70B-Instruct"},
     "drafters": [{"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct"}]},
]
KV_HEADROOM = 0.2  # the chart's kvHeadroomFraction: a shape runs only where its weights fit


def fleet_nodes() -> list[tuple[str, dict[str, Any]]]:
    """(fleet, node) for every GPU node of the demo fleet and of a 16-pod scale fleet."""
    fleets = {"demo": load_fleet(REPO_ROOT / "hack" / "fleets" / "demo.yaml")}
    with tempfile.TemporaryDirectory() as directory:
        scale = Path(directory) / "scale.yaml"
        scale.write_text(fleet_yaml(16))
        fleets["scale"] = load_fleet(scale)
    nodes = [(name, node) for name, fleet in fleets.items() for node in node_objects(fleet)]
    return [(name, node) for name, node in nodes if int(node["status"]["allocatable"].get("amd.com/gpu", "0"))]


def vram_gib(node: dict[str, Any]) -> float:
    """The smallest GPU memory: `amd.com/gpu.vram` on a homogeneous node, `amd.com/gpu.vram.<value>` if mixed."""
    labels = node["metadata"]["labels"]
    values = [labels["amd.com/gpu.vram"]] if "amd.com/gpu.vram" in labels else [
        key.rsplit(".", 1)[1] for key in labels if key.startswith("amd.com/gpu.vram.")]
    return min(float(value.rstrip("G")) for value in values)


@pytest.mark.parametrize(("fleet", "node"), fleet_nodes(), ids=lambda value: value if isinstance(value, str)
                         else value["metadata"]["name"])
def test_a_full_gpu_node_of_runtime_pods_fits_the_nodes_cpu_and_memory(fleet: str, node: dict[str, Any]) -> None:
    allocatable = node["status"]["allocatable"]
    gpus = int(allocatable["amd.com/gpu"])
    checked = 0
    for shape in SHAPES:
        for tp in (1, 2, 4, 8):
            spec = SpeculativeModelSpec.model_validate({**shape, "model": {**shape["model"], "tensorParallelSize": tp},
                                                        "placement": {"gfxTargets": ["gfx942"]}})
            weights = target_weights(spec.model.name, None)
            assert weights is not None
            if tp > gpus or weights.gib > tp * vram_gib(node) * (1 - KV_HEADROOM):
                continue  # placement would not put this shape here
            pods = gpus // tp
            requests = container_resources(spec)["requests"]
            for resource in ("cpu", "memory"):
                wanted = pods * quantity_value(requests[resource])
                assert wanted <= quantity_value(allocatable[resource]), (
                    f"{fleet} node {node['metadata']['name']}: {pods} pods of {spec.model.name} at TP {tp} request "
                    f"{resource} {pods} x {requests[resource]}, more than its allocatable {allocatable[resource]}")
            checked += 1
    assert checked, "no shape runs on this node"
