"""canonical_quantity against apimachinery v0.36's Quantity.CanonicalizeBytes, and the rendered pod using it."""

from __future__ import annotations

from typing import Any

import pytest

from specdec_operator.render.drift import canonical_quantity
from tests.unit.api.specfactories import spec
from tests.unit.render.renderfactories import rendered_pool

# (input, what k8s.io/apimachinery v0.36.3 serialises after ParseQuantity), produced once with a small
# Go program against the module; every output is also a fixed point of the server (parses to itself).
APIMACHINERY: list[tuple[str, str]] = [
    ("0.5", "500m"),
    ("1000m", "1"),
    ("1200m", "1200m"),
    ("1.5", "1500m"),
    (".5", "500m"),
    ("5.", "5"),
    ("1.000", "1"),
    ("01", "1"),
    ("+1", "1"),
    ("-0.5", "-500m"),
    ("0", "0"),
    ("0m", "0"),
    ("0Gi", "0"),
    ("1000", "1k"),
    ("1000k", "1M"),
    ("1000000", "1M"),
    ("1.5k", "1500"),
    ("1.5G", "1500M"),
    ("1024", "1024"),
    ("123456789", "123456789"),
    ("0.001", "1m"),
    ("0.0015", "1500u"),
    ("0.1m", "100u"),
    ("1000n", "1u"),
    ("0.0000000001", "1n"),
    ("1.1n", "2n"),  # rounded up to nano precision
    ("3.14159", "3141590u"),
    ("1Gi", "1Gi"),
    ("1024Mi", "1Gi"),
    ("1024Ki", "1Mi"),
    ("1024Gi", "1Ti"),
    ("1.5Gi", "1536Mi"),
    ("2.5Gi", "2560Mi"),
    ("0.5Gi", "512Mi"),
    ("1.25Mi", "1280Ki"),
    ("1.000Gi", "1Gi"),
    ("1.5Ki", "1536"),  # not a whole number of Ki: no binary suffix fits
    ("0.5Ki", "512"),  # below 1024 a binary value is written decimal
    ("0.001Ki", "1024m"),
    ("1025Ki", "1025Ki"),
    ("-1Ki", "-1Ki"),
    ("-0.5Gi", "-512Mi"),
    ("8Ei", "9223372036854775807"),  # binary values are capped at int64
    ("1e3", "1e3"),  # a decimal exponent stays an exponent: it is not rewritten to 1k
    ("1E3", "1e3"),
    ("1e+3", "1e3"),
    ("1e1", "10"),
    ("1e7", "10e6"),
    ("1.5e3", "1500"),
    ("12e2", "1200"),
    ("1e-3", "1e-3"),
    ("2e-2", "20e-3"),
    ("1e-10", "1e-9"),
    ("1e19", "10e18"),
    ("1E", "1E"),
    ("3E", "3E"),
    ("12345E", "12345E"),
]


@pytest.mark.parametrize(("text", "canonical"), APIMACHINERY, ids=[text for text, _ in APIMACHINERY])
def test_matches_apimachinery(text: str, canonical: str) -> None:
    assert canonical_quantity(text) == canonical


@pytest.mark.parametrize(("text", "canonical"), APIMACHINERY, ids=[text for text, _ in APIMACHINERY])
def test_canonical_form_is_a_fixed_point(text: str, canonical: str) -> None:
    assert canonical_quantity(canonical_quantity(text)) == canonical


@pytest.mark.parametrize("text", ["", "abc", "1.5.5", "1GB", "1 Gi", "1gi", "1m5", "1e", "."])
def test_text_that_is_no_quantity_is_left_for_the_api_server_to_refuse(text: str) -> None:
    assert canonical_quantity(text) == text


def container(runtime: dict[str, Any]) -> dict[str, Any]:
    return rendered_pool(spec(runtime=runtime)).container


def test_rendered_resources_are_canonical_and_the_gpu_count_is_untouched() -> None:
    requested = {"requests": {"cpu": "0.5", "memory": "1.5Gi"}, "limits": {"memory": "2048Mi"}}
    resources = container({"resources": requested})["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "1536Mi", "amd.com/gpu": "1"}
    assert resources["limits"] == {"memory": "2Gi", "amd.com/gpu": "1"}


def test_an_empty_env_value_is_rendered_as_the_server_stores_it() -> None:
    env = container({"env": [{"name": "EMPTY"}, {"name": "SET", "value": "1"}]})["env"]
    assert {"name": "EMPTY"} in env and {"name": "SET", "value": "1"} in env

