"""`spec.model`: the target model and where its weights come from."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from specdec_operator.api.base import ApiModel, cel
from specdec_operator.api.kubeformats import (
    CONFIG_KEY,
    DNS1123_SUBDOMAIN,
    MODEL_REFERENCE,
    RELATIVE_PATH,
    SERVED_MODEL_NAME,
    formatted,
)


class SecretKeyRef(ApiModel):
    """A key in a Secret in the model's namespace."""

    name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.model.source.hubSecretRef.name")] = Field(
        description="Name of the Secret."
    )
    key: Annotated[str, *formatted(CONFIG_KEY, "spec.model.source.hubSecretRef.key")] = Field(
        default="token", description="Key inside the Secret."
    )


# The two attention families vLLM 0.33 selects different kernels for (AttentionSelectorConfig.use_mla).
AttentionKind = Literal["Standard", "MLA"]

_ONE_WEIGHTS_SOURCE = "spec.model.source: set either pvcName (weights on a volume) or hubSecretRef, not both"
# Without a claim nothing is mounted, so the path would be ignored and vLLM would load spec.model.name instead.
_PATH_NEEDS_CLAIM = "spec.model.source.path requires spec.model.source.pvcName: it is a path inside that claim"


class WeightsSource(ApiModel):
    """Where the runtime pod finds the target weights."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("!(has(self.pvcName) && has(self.hubSecretRef))", _ONE_WEIGHTS_SOURCE),
                cel("!has(self.path) || has(self.pvcName)", _PATH_NEEDS_CLAIM, ".path"),
            ]
        }
    )

    pvc_name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.model.source.pvcName")] | None = Field(
        default=None, description="PersistentVolumeClaim that holds the weights; mounted read-only at /models."
    )
    path: Annotated[str, *formatted(RELATIVE_PATH, "spec.model.source.path")] | None = Field(
        default=None, description="Path of the weights inside the PVC (defaults to model.name)."
    )
    hub_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret with a Hugging Face token, exported to the runtime as HF_TOKEN."
    )

    @model_validator(mode="after")
    def _one_source(self) -> WeightsSource:
        if self.pvc_name is not None and self.hub_secret_ref is not None:
            raise ValueError(_ONE_WEIGHTS_SOURCE)
        if self.path is not None and self.pvc_name is None:
            raise ValueError(_PATH_NEEDS_CLAIM)
        return self


class TargetModel(ApiModel):
    """The model that verifies drafts and produces the output."""

    name: Annotated[str, *formatted(MODEL_REFERENCE, "spec.model.name")] = Field(
        description="Hugging Face repo id of the target model, e.g. meta-llama/Llama-3.1-70B, or the absolute "
        "path of its directory in the image or a volume. With source.pvcName and no source.path it is also the "
        "path inside the claim."
    )
    served_name: Annotated[str, *formatted(SERVED_MODEL_NAME, "spec.model.servedName")] | None = Field(
        default=None,
        description="Name clients use in requests and vLLM's metrics carry as model_name (--served-model-name); "
        "defaults to spec.model.name (the hub id, e.g. meta-llama/Llama-3.1-8B-Instruct).",
    )
    tensor_parallel_size: Literal[1, 2, 4, 8] = Field(
        default=1, description="GPUs per replica (-tp). A power of two, at most 8."
    )
    max_model_len: int | None = Field(default=None, ge=128, description="Context length cap (--max-model-len).")
    weights_gib: float | None = Field(
        default=None,
        gt=0,
        description="Size of the target weights in GiB. Used for drafter and placement fit; "
        "estimated from the parameter count in the name when absent.",
    )
    source: WeightsSource | None = Field(default=None, description="Where the weights come from.")
    attention: AttentionKind = Field(
        default="Standard",
        description="The target's attention kind. Standard: multi-head or grouped-query attention (Llama, Qwen, "
        "Mistral, Gemma). MLA: multi-head latent attention (DeepSeek V2, V3 and R1, Kimi K2 and other DeepSeek-V3 "
        "architectures, the usual mtp targets). vLLM on ROCm runs MLA layers only with an MLA kernel, so for MLA the "
        "operator also renders --attention-config.backend_per_kind.mla_attention: ROCM_AITER_MLA on gfx942/gfx950, "
        "TRITON_MLA on every other gfx target; drafter layers with standard attention keep --attention-backend. "
        "A wrong value makes vLLM fail when it builds the model's attention layers.",
    )


