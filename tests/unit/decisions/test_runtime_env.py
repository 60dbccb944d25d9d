"""Per-gfx runtime environment: AITER, HSA_OVERRIDE_GFX_VERSION only where the image lacks the card, visible devices."""

from __future__ import annotations

import pytest

from specdec_operator.api.vocabulary import GFX_TARGETS
from specdec_operator.decisions.runtime_env import (
    RuntimeEnvError,
    attention_backend,
    hsa_version,
    mla_attention_backend,
    plan_runtime,
)
from specdec_operator.settings import (
    CDNA_IMAGE,
    DEFAULT_IMAGE_TARGETS,
    DEFAULT_IMAGES,
    RDNA3_IMAGE,
)


@pytest.mark.parametrize(
    ("gfx", "version"),
    [
        ("gfx90a", "9.0.10"),
        ("gfx908", "9.0.8"),
        ("gfx942", "9.4.2"),
        ("gfx950", "9.5.0"),
        ("gfx1100", "11.0.0"),
        ("gfx1101", "11.0.1"),
        ("gfx1151", "11.5.1"),
        ("gfx1200", "12.0.0"),
        ("gfx1201", "12.0.1"),
    ],
)
def test_hsa_version(gfx: str, version: str) -> None:
    assert hsa_version(gfx) == version


def default_plan(gfx: str, user_env: dict[str, str] | None = None) -> dict[str, str]:
    image = DEFAULT_IMAGES[gfx]
    return plan_runtime(gfx, image, DEFAULT_IMAGE_TARGETS[image], user_env or {}).env


@pytest.mark.parametrize(
    ("gfx", "env"),
    [
        ("gfx90a", {}),
        ("gfx942", {"VLLM_ROCM_USE_AITER": "1"}),
        ("gfx950", {"VLLM_ROCM_USE_AITER": "1"}),
        ("gfx1100", {}),
        ("gfx1101", {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}),
        ("gfx1150", {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}),
        ("gfx1151", {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}),
        ("gfx1200", {}),
        ("gfx1201", {}),
    ],
)
def test_env_on_the_default_image_of_each_target(gfx: str, env: dict[str, str]) -> None:
    assert default_plan(gfx) == env


def test_every_accepted_gfx_target_has_a_default_image() -> None:
    assert set(DEFAULT_IMAGES) == set(GFX_TARGETS)


@pytest.mark.parametrize(
    ("gfx", "image", "targets", "override", "note"),
    [
        ("gfx1101", RDNA3_IMAGE, ["gfx1100"], "11.0.0", "lacks gfx1101; running gfx1100 code objects"),
        ("gfx1101", "custom:rdna3-full", ["gfx1100", "gfx1101"], None, None),
        ("gfx1101", CDNA_IMAGE, ["gfx90a", "gfx942", "gfx950"], None, "no code objects for gfx1101 or a sibling"),
        ("gfx1200", "custom:rdna4-1201", ["gfx1201"], "12.0.1", "running gfx1201 code objects"),
        ("gfx942", "custom:mi250-only", ["gfx90a"], None, None),  # never an override on datacenter targets
        ("gfx90a", "custom:mi300-only", ["gfx942"], None, None),
        ("gfx950", "custom:mi300-only", ["gfx942"], None, None),
        ("gfx1101", "my.registry/vllm:dev", None, None, "not in the image table"),
    ],
    ids=[
        "gfx1101-on-rdna3-build",
        "gfx1101-image-has-it",
        "gfx1101-on-cdna-image",
        "gfx1200-on-gfx1201-build",
        "gfx942-never",
        "gfx90a-never",
        "gfx950-never",
        "unknown-image",
    ],
)
def test_hsa_override_only_where_the_image_lacks_the_card(
    gfx: str, image: str, targets: list[str] | None, override: str | None, note: str | None
) -> None:
    plan = plan_runtime(gfx, image, targets, {})
    assert plan.env.get("HSA_OVERRIDE_GFX_VERSION") == override
    assert plan.image == image
    if note is not None:
        assert any(note in line for line in plan.notes), plan.notes


@pytest.mark.parametrize("gfx", ["gfx90a", "gfx942", "gfx950"])
def test_user_hsa_override_is_ignored_on_datacenter_targets(gfx: str) -> None:
    image = DEFAULT_IMAGES[gfx]
    plan = plan_runtime(gfx, image, DEFAULT_IMAGE_TARGETS[image], {"HSA_OVERRIDE_GFX_VERSION": "9.4.2"})
    assert "HSA_OVERRIDE_GFX_VERSION" not in plan.env
    assert any("ignored spec.runtime.env HSA_OVERRIDE_GFX_VERSION" in note for note in plan.notes)


def test_user_hsa_override_passes_through_on_rdna() -> None:
    assert default_plan("gfx1100", {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}) == {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}


@pytest.mark.parametrize(
    ("user_env", "visible"),
    [
        ({"HIP_VISIBLE_DEVICES": "0,1"}, "0,1"),
        ({"CUDA_VISIBLE_DEVICES": "2"}, "2"),
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"}, "0"),
        ({}, None),
    ],
    ids=["hip-only", "cuda-only", "both-equal", "neither"],
)
def test_visible_devices_are_mirrored(user_env: dict[str, str], visible: str | None) -> None:
    env = default_plan("gfx942", user_env)
    assert env.get("HIP_VISIBLE_DEVICES") == env.get("CUDA_VISIBLE_DEVICES") == visible


def test_conflicting_visible_devices_are_rejected_naming_the_field() -> None:
    with pytest.raises(RuntimeEnvError, match=r"^spec\.runtime\.env: HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES"):
        default_plan("gfx942", {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"})


def test_other_user_env_passes_through() -> None:
    assert default_plan("gfx90a", {"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "1"}) == {
        "NCCL_DEBUG": "INFO",
        "HF_HUB_OFFLINE": "1",
    }


@pytest.mark.parametrize(
    ("gfx", "backend"),
    [("gfx942", "ROCM_AITER_FA"), ("gfx950", "ROCM_AITER_FA"), ("gfx90a", "TRITON_ATTN"), ("gfx1100", "TRITON_ATTN")],
)
def test_attention_backend_supports_k_above_1(gfx: str, backend: str) -> None:
    assert attention_backend(gfx) == backend
    assert plan_runtime(gfx, "img", None, {}).attention_backend == backend



@pytest.mark.parametrize(
    ("gfx", "backend"),
    [("gfx942", "ROCM_AITER_MLA"), ("gfx950", "ROCM_AITER_MLA"), ("gfx90a", "TRITON_MLA"), ("gfx1100", "TRITON_MLA"),
     ("gfx1151", "TRITON_MLA"), ("gfx1201", "TRITON_MLA")],
)
def test_an_mla_target_plans_the_mla_backend_vllm_puts_first_and_keeps_the_standard_one(gfx: str, backend: str) -> None:
    plan = plan_runtime(gfx, "img", None, {}, "MLA")
    assert plan.mla_attention_backend == mla_attention_backend(gfx) == backend
    assert plan.attention_backend == attention_backend(gfx)


def test_aiter_mla_comes_with_aiter_enabled() -> None:
    """ROCm picks ROCM_AITER_MLA only where VLLM_ROCM_USE_AITER is on: the plan turns it on wherever it renders it."""
    for gfx in ("gfx942", "gfx950"):
        plan = plan_runtime(gfx, "img", None, {}, "MLA")
        assert plan.mla_attention_backend == "ROCM_AITER_MLA"
        assert plan.env["VLLM_ROCM_USE_AITER"] == "1"


@pytest.mark.parametrize("off", ["0", "false", "False", " off "])
def test_aiter_turned_off_in_the_spec_stays_off_and_the_backends_follow(off: str) -> None:
    """spec.runtime.env VLLM_ROCM_USE_AITER off is the user's choice: the operator neither overrides it nor renders
    an AITER backend that would need it (a backend vLLM cannot build without AITER)."""
    for gfx in ("gfx942", "gfx950"):
        plan = plan_runtime(gfx, "img", None, {"VLLM_ROCM_USE_AITER": off}, "MLA")
        assert plan.env["VLLM_ROCM_USE_AITER"] == off
        assert (plan.attention_backend, plan.mla_attention_backend) == ("TRITON_ATTN", "TRITON_MLA")
    on = plan_runtime("gfx942", "img", None, {"VLLM_ROCM_USE_AITER": "1"})
    assert on.env["VLLM_ROCM_USE_AITER"] == "1" and on.attention_backend == "ROCM_AITER_FA"


def test_a_standard_target_plans_no_mla_backend() -> None:
    assert plan_runtime("gfx942", "img", None, {}).mla_attention_backend is None
    assert plan_runtime("gfx942", "img", None, {}, "Standard").mla_attention_backend is None
