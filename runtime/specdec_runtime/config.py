"""The runtime config the operator renders into each pool's ConfigMap, and the one mapping to vLLM 0.33 args.

Both the operator (to build pod templates and to validate) and the launcher (to exec vLLM) call
`serve_args`, so the two can never disagree about flag names.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CONFIG_FILE_NAME = "runtime.json"
DEFAULT_PORT = 8000


class SpeculativeSettings(BaseModel):
    """The subset of vLLM's SpeculativeConfig we render. Field names are vLLM's own keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str
    num_speculative_tokens: int = Field(ge=1)
    model: str | None = None
    draft_tensor_parallel_size: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    # vLLM's built-in dynamic K: inclusive batch-size ranges (start, end, K). Off when unset.
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None

    def to_vllm_json(self) -> str:
        """`--speculative-config` value: compact, sorted, without unset keys (vLLM rejects unknown ones)."""
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True, separators=(",", ":"))


class RuntimeConfig(BaseModel):
    """Everything one pool's runtime needs. Serialised as runtime.json in the pool's ConfigMap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    served_model_name: str = Field(min_length=1)
    tensor_parallel_size: int = Field(default=1, ge=1, le=8)
    max_model_len: int | None = None
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    host: str = "0.0.0.0"
    speculative: SpeculativeSettings | None = None
    attention_backend: str | None = None
    # The backend of MLA layers (DeepSeek-style targets); attention_backend keeps serving the other layers.
    mla_attention_backend: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    # vLLM's --shutdown-timeout: seconds a SIGTERM lets in-flight requests finish (0, vLLM's default, aborts them).
    shutdown_timeout: int = Field(default=0, ge=0)
    engine: Literal["vllm", "simulator"] = "vllm"
    simulator_profile: str | None = None

    @property
    def k(self) -> int:
        return self.speculative.num_speculative_tokens if self.speculative else 0

    def to_json(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RuntimeConfig:
        data: Any = json.loads(text)
        return cls.model_validate(data)


def serve_args(config: RuntimeConfig) -> list[str]:
    """Arguments after `vllm` for vLLM 0.33's `vllm serve`; the simulator accepts the same list."""
    args = [
        "serve",
        config.model,
        "--served-model-name",
        config.served_model_name,
        "--tensor-parallel-size",
        str(config.tensor_parallel_size),
        "--host",
        config.host,
        "--port",
        str(config.port),
    ]
    if config.max_model_len is not None:
        args += ["--max-model-len", str(config.max_model_len)]
    if config.speculative is not None:
        args += ["--speculative-config", config.speculative.to_vllm_json()]
    if config.attention_backend is not None:
        args += ["--attention-backend", config.attention_backend]
    if config.mla_attention_backend is not None:
        args.append(f"--attention-config.backend_per_kind.mla_attention={config.mla_attention_backend}")
    if config.shutdown_timeout:
        args += ["--shutdown-timeout", str(config.shutdown_timeout)]
    return args + list(config.extra_args)
