"""Names and label values of owned objects stay within Kubernetes' limits for any SpeculativeModel name."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.api.vocabulary import GFX_TARGETS
from specdec_operator.render import pool as render
from specdec_operator.render.names import TRACKS, deployment_name, label_value, model_labels, pool_name, service_name
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


def every_name(model: str) -> set[tuple[str, str]]:
    """Each name and label value the operator computes for `model`, with the kind of object or label it names."""
    names = {("label", label_value(model))}
    for gfx in GFX_TARGETS:
        names |= {("pool", pool_name(model, gfx))}
        names |= {("Deployment", deployment_name(pool_name(model, gfx), track)) for track in TRACKS}
    names |= {("Service", service_name(model, track)) for track in (None, *TRACKS)}
    return names


def crafted_from(model: str) -> list[str]:
    """Short names a tenant could pick to land on `model`'s names: each computed name, and it minus a suffix."""
    names = [name for _, name in every_name(model)]
    suffixes = [f"-{gfx}" for gfx in GFX_TARGETS] + [f"-{track}" for track in TRACKS] + ["-canary-gfx942"]
    return names + [name.removesuffix(suffix) for name in names for suffix in suffixes if name.endswith(suffix)]


@pytest.mark.parametrize("model", [*MODEL_NAMES, "llama-stable", "llama-canary", "llama-0123456789",
                                   "llama-gfx942", "a.b-canary"])
def test_a_name_crafted_from_another_models_names_shares_none_of_them(model: str) -> None:
    """A shortened name ends in a hash and a track Service in its track: a short model named like either is
    itself shortened, so no model can take another's label, pool, Deployment or Service in the namespace."""
    for crafted in crafted_from(model):
        if crafted != model and DNS_1123_SUBDOMAIN.fullmatch(crafted):
            assert not every_name(model) & every_name(crafted), (model, crafted)


def test_the_examples_that_used_to_collide_are_now_apart() -> None:
    long = "m" * 70
    assert label_value(label_value(long)) != label_value(long)  # a model named after a long one's label
    assert pool_name(pool_name(long, "gfx942").removesuffix("-gfx942"), "gfx942") != pool_name(long, "gfx942")
    assert service_name("llama-canary") != service_name("llama", "canary") == "llama-canary"
    assert service_name("llama-stable").startswith("llama-stable-")
    assert service_name("llama") == "llama" and service_name("llama-canary-x") == "llama-canary-x"


subdomain_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
model_names = st.lists(subdomain_label, min_size=1, max_size=12).map(".".join).filter(lambda n: len(n) <= 253) | \
    st.lists(st.sampled_from(["m", "llama", "0123456789", "abcdef0123", "stable", "canary", "gfx942", "x" * 30]),
             min_size=1, max_size=9).map("-".join)


@settings(max_examples=300, deadline=None)
@given(model_names, st.data())
def test_distinct_models_never_share_a_name(model: str, data: st.DataObject) -> None:
    other = data.draw(model_names | st.sampled_from(crafted_from(model)).filter(DNS_1123_SUBDOMAIN.fullmatch))
    if other != model:
        assert not every_name(model) & every_name(other), (model, other)
