"""The simulator's /metrics against what vLLM 0.33.0's own PrometheusStatLogger exposes for the same config
(fed fake stats): every family the simulator serves must exist in vLLM with the same type, HELP, sample
names, label names in the same order, histogram buckets and label values (positions 0..K-1, finish reasons)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.profile import PACKAGED_PROFILES_DIR, load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from tests.contract import cases as rendered
from tests.contract.vllm_env import VllmDriver

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]

KS = (1, 4)
SAMPLE_LINE = re.compile(r"^(?P<name>[^\s{]+)(?:\{(?P<labels>[^}]*)\})?\s")


def shape(text: str) -> dict[str, dict[str, Any]]:
    """Per family: type, HELP, and per sample name the label-name orders and label values seen."""
    families: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:"):
            continue
        samples: dict[str, Any] = defaultdict(lambda: {"label_orders": set(), "values": defaultdict(set)})
        for sample in family.samples:
            entry = samples[sample.name]
            entry["label_orders"].add(tuple(sample.labels))
            for key, value in sample.labels.items():
                if key != "model_name":
                    entry["values"][key].add(value)
        families[family.name] = {"type": family.type, "help": family.documentation, "samples": samples}
    return families


def raw_label_orders(text: str) -> dict[str, set[tuple[str, ...]]]:
    """Label names per sample name in the order the exposition text writes them."""
    orders: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for line in text.splitlines():
        match = SAMPLE_LINE.match(line)
        if match and not line.startswith("#"):
            labels = match.group("labels") or ""
            orders[match.group("name")].add(tuple(re.findall(r'(\w+)="', labels)))
    return orders


@pytest.fixture(scope="module", params=KS, ids=[f"k{k}" for k in KS])
def expositions(request: pytest.FixtureRequest, driver: VllmDriver, models: dict[str, str]) -> tuple[int, str, str]:
    k: int = request.param
    argv = rendered.base_case(models, "eagle3", k)
    vllm_text: str = driver.run("metrics", {"argv": argv})
    served_name = argv[argv.index("--served-model-name") + 1]
    speculative = json.loads(argv[argv.index("--speculative-config") + 1])
    profile = load_profile(PACKAGED_PROFILES_DIR / "default.yaml")
    replica = VirtualReplica(profile, SpeculativeSettings(**speculative), model_name=served_name, seed=1)
    replica.advance_to(profile.restart_s + 60)
    return k, vllm_text, replica.metrics_text()


def test_every_simulated_family_matches_vllms(expositions: tuple[int, str, str]) -> None:
    k, vllm_text, simulated_text = expositions
    vllm, simulated = shape(vllm_text), shape(simulated_text)
    assert simulated, "the simulator exposes no vllm: families"
    for name, family in simulated.items():
        assert name in vllm, f"{name}: vLLM 0.33 exposes no such family"
        theirs = vllm[name]
        assert (family["type"], family["help"]) == (theirs["type"], theirs["help"]), name
        assert set(family["samples"]) == set(theirs["samples"]), name
        for sample, seen in family["samples"].items():
            wanted = theirs["samples"][sample]
            assert seen["label_orders"] == wanted["label_orders"], sample
            assert dict(seen["values"]) == dict(wanted["values"]), sample
    positions = simulated["vllm:spec_decode_num_accepted_tokens_per_pos"]["samples"]
    assert positions["vllm:spec_decode_num_accepted_tokens_per_pos_total"]["values"]["position"] == {
        str(i) for i in range(k)
    }


def test_label_order_in_the_text_matches_vllms(expositions: tuple[int, str, str]) -> None:
    _, vllm_text, simulated_text = expositions
    vllm, simulated = raw_label_orders(vllm_text), raw_label_orders(simulated_text)
    for sample, orders in simulated.items():
        if sample.startswith("vllm:"):
            assert orders == vllm[sample], sample


def test_the_spec_decode_families_are_all_of_vllms(expositions: tuple[int, str, str]) -> None:
    """The tuner reads spec-decode counters only; vLLM must not have one the simulator lacks."""
    _, vllm_text, simulated_text = expositions
    spec_decode = {name for name in shape(vllm_text) if name.startswith("vllm:spec_decode")}
    assert spec_decode == {name for name in shape(simulated_text) if name.startswith("vllm:spec_decode")}
