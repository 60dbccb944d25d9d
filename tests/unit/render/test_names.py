"""Names and label values of owned objects stay within Kubernetes' limits for any SpeculativeModel name."""

from __future__ import annotations

import re

import pytest

from specdec_operator.api.vocabulary import GFX_TARGETS
from specdec_operator.render import pool as render
from specdec_operator.render.names import label_value, model_labels, pool_name, service_name
from specdec_runtime import contract
from tests.unit.api.specfactories import spec
from tests.unit.render.renderfactories import context, runtime_plan

# The API server's own patterns (k8s.io/apimachinery/pkg/util/validation).
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

LONGEST = "a" * 253
MODEL_NAMES = [
    "llama8b",
    "llama-3.1-8b-instruct",
    "8b-model",
    "x" * 63,
    "meta-llama-llama-3.3-70b-instruct-eagle3-on-mi300x-and-mi250x-pools",
    LONGEST,
    "a" * 60 + "." + "b" * 60,
]


def valid_label_value(text: str) -> bool:
    return len(text) <= 63 and LABEL_VALUE.fullmatch(text) is not None


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_every_name_and_label_is_valid_for_any_resource_name(model: str) -> None:
    assert DNS_1123_SUBDOMAIN.fullmatch(model) and len(model) <= 253  # what the API server lets a CR be called
    assert all(valid_label_value(value) for value in model_labels(model).values())
    for gfx in GFX_TARGETS:
        pool = pool_name(model, gfx)
        assert valid_label_value(pool) and DNS_1123_SUBDOMAIN.fullmatch(pool), pool
        assert pool.endswith(f"-{gfx}")
    for track in (None, "stable", "canary"):
        name = service_name(model, track)
        assert len(name) <= 63 and DNS_1035_LABEL.fullmatch(name), name
        assert track is None or name.endswith(f"-{track}")


@pytest.mark.parametrize(
    ("model", "gfx", "pool"),
    [("llama8b", "gfx942", "llama8b-gfx942"), ("x" * 56, "gfx942", "x" * 56 + "-gfx942")],
    ids=["short", "exactly-63"],
)
def test_names_that_fit_are_left_alone(model: str, gfx: str, pool: str) -> None:
    assert pool_name(model, gfx) == pool
    assert label_value(model) == model


def test_names_that_do_not_fit_keep_a_readable_prefix_and_stay_distinct() -> None:
    first, second = "m" * 70 + "-a", "m" * 70 + "-b"  # differ only past the cut
    assert pool_name(first, "gfx942") != pool_name(second, "gfx942")
    assert label_value(first) != label_value(second)
    assert service_name(first) != service_name(second)
    assert pool_name(first, "gfx942").startswith("m" * 40)
    assert pool_name(first, "gfx942") == pool_name(first, "gfx942")  # deterministic across calls and restarts


def test_a_dotted_or_digit_first_name_gets_a_service_name_without_losing_its_identity() -> None:
    assert service_name("llama-3.1-8b").startswith("llama-3-1-8b-")
    assert service_name("llama-3.1-8b") != service_name("llama-3-1-8b")
    assert service_name("8b-model").startswith("b-model-")
    assert service_name("llama8b", "canary") == "llama8b-canary"


def test_selectors_of_a_long_named_model_match_its_pods() -> None:
    ctx = context(model=LONGEST)
    template = render.pod_template(ctx, spec(), runtime_plan(), render.PoolTrack("stable", 3, "cm"))
    deployment = render.deployment(ctx, template, 1, "stable")
    pdb = render.pod_disruption_budget(ctx)
    labels = template["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels[contract.LABEL_MODEL] == label_value(LONGEST)
    assert all(valid_label_value(value) for value in labels.values())
