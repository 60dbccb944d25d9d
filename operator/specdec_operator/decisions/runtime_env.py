"""Image, environment and attention backend for a pool's gfx target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specdec_operator.api.vocabulary import VISIBLE_DEVICES, VISIBLE_DEVICES_DIFFER

# AITER kernels exist only for CDNA3 and newer.
AITER_TARGETS = frozenset({"gfx942", "gfx950"})
# A card may run code objects of a sibling target in its family: HSA_OVERRIDE_GFX_VERSION makes the
# runtime report that sibling. Datacenter targets always have their own code objects and never need it.
OVERRIDE_SIBLINGS: dict[str, str] = {
    "gfx1101": "gfx1100",
    "gfx1102": "gfx1100",
    "gfx1150": "gfx1100",
    "gfx1151": "gfx1100",
    "gfx1200": "gfx1201",
}
NEVER_OVERRIDE = frozenset({"gfx90a", "gfx942", "gfx950"})
# vLLM's switch for the AITER kernels, which the operator turns on where they exist unless the spec turns it off.
AITER_ENV = "VLLM_ROCM_USE_AITER"
_OFF = frozenset({"0", "false", "no", "off"})


class RuntimeEnvError(ValueError):
    """The requested environment cannot be made consistent; the message names the field."""


@dataclass(frozen=True)
class RuntimePlan:
    image: str
    env: dict[str, str]
    attention_backend: str
    notes: tuple[str, ...] = ()
    # For an MLA target: the backend of its MLA layers (vLLM's attention_config.backend_per_kind.mla_attention).
    mla_attention_backend: str | None = None


def hsa_version(gfx: str) -> str:
    """gfx1100 -> 11.0.0, gfx90a -> 9.0.10 (the stepping is hex)."""
    digits = gfx.removeprefix("gfx")
    major, minor, stepping = digits[:-2], digits[-2], digits[-1]
    return f"{int(major)}.{int(minor, 16)}.{int(stepping, 16)}"


def aiter_on(gfx: str, user_env: Mapping[str, str]) -> bool:
    """AITER runs where its kernels exist, unless spec.runtime.env sets VLLM_ROCM_USE_AITER off (0/false/no/off):
    the user's choice wins, and the attention backends follow it."""
    return gfx in AITER_TARGETS and user_env.get(AITER_ENV, "1").strip().lower() not in _OFF


def attention_backend(gfx: str, aiter: bool = True) -> str:
    """A backend that verifies K>1 draft tokens on ROCm (vllm#28222): AITER FA where AITER exists and is on."""
    return "ROCM_AITER_FA" if aiter and gfx in AITER_TARGETS else "TRITON_ATTN"


def mla_attention_backend(gfx: str, aiter: bool = True) -> str:
    """The backend vLLM 0.33's RocmPlatform puts first for MLA layers (rocm.py `_get_backend_priorities`):
    ROCM_AITER_MLA where AITER MLA is enabled (CDNA3+, VLLM_ROCM_USE_AITER, which plan_runtime sets on AITER
    targets), else TRITON_MLA, whose support check accepts every compute capability. Both verify K>1 drafts
    (their metadata builders take uniform multi-token decode queries)."""
    return "ROCM_AITER_MLA" if aiter and gfx in AITER_TARGETS else "TRITON_MLA"


def plan_runtime(
    gfx: str,
    image: str,
    image_targets: Sequence[str] | None,
    user_env: Mapping[str, str],
    attention: str = "Standard",
) -> RuntimePlan:
    """`attention` is spec.model.attention: for MLA the MLA layers get their own backend, while
    `attention_backend` still serves the layers with standard attention (most drafters)."""
    env: dict[str, str] = {}
    notes: list[str] = []
    aiter = aiter_on(gfx, user_env)
    if aiter:
        env[AITER_ENV] = "1"
    if image_targets is None:
        notes.append(f"image {image} is not in the image table; no HSA_OVERRIDE_GFX_VERSION applied")
    elif gfx not in image_targets and gfx not in NEVER_OVERRIDE:
        sibling = OVERRIDE_SIBLINGS.get(gfx)
        if sibling is not None and sibling in image_targets:
            env["HSA_OVERRIDE_GFX_VERSION"] = hsa_version(sibling)
            notes.append(f"image {image} lacks {gfx}; running {sibling} code objects via HSA_OVERRIDE_GFX_VERSION")
        else:
            notes.append(f"image {image} has no code objects for {gfx} or a sibling target")
    visible = {key: user_env[key] for key in VISIBLE_DEVICES if key in user_env}
    if len(set(visible.values())) > 1:
        raise RuntimeEnvError(VISIBLE_DEVICES_DIFFER)
    if visible:
        value = next(iter(visible.values()))
        env.update({key: value for key in VISIBLE_DEVICES})
    for key, value in user_env.items():
        if key == "HSA_OVERRIDE_GFX_VERSION" and gfx in NEVER_OVERRIDE:
            notes.append(f"ignored spec.runtime.env HSA_OVERRIDE_GFX_VERSION: {gfx} images carry their own target")
        elif key not in env:
            env[key] = value
    return RuntimePlan(
        image=image,
        env=env,
        attention_backend=attention_backend(gfx, aiter),
        notes=tuple(notes),
        mla_attention_backend=mla_attention_backend(gfx, aiter) if attention == "MLA" else None,
    )
