"""The slice of `vllm serve`'s command line the simulator understands, with vLLM 0.33's validation.

The simulator must start from exactly the argument list `serve_args()` renders for vLLM, and refuse
the speculative configs vLLM refuses, so that a config tested against it also starts real vLLM.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_runtime.simulator.engine import Speculation

PROG = "specdec-simulator"

# Every field of vLLM 0.33's SpeculativeConfig (vllm/config/speculative.py), which forbids extra keys.
# tests/contract compares this set with the wheel's source.
VLLM_SPECULATIVE_CONFIG_KEYS: frozenset[str] = frozenset(
    {
        "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
        "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype",
        "max_model_len", "revision", "code_revision", "index_share_for_mtp_iteration",
        "disable_padded_drafter_batch", "disable_eagle_block_drop", "disable_lookahead_block_hashes",
        "draft_lm_head_quantization", "use_local_argmax_reduction", "use_heterogeneous_vocab",
        "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting", "target_model_config",
        "target_parallel_config", "num_speculative_tokens_per_batch_size", "draft_model_config",
        "draft_parallel_config", "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob", "draft_load_config",
        "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
        "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk", "xpress_topc",
        "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k",
    }
)


class SpeculativeConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ServeOptions:
    model: str
    served_model_name: str
    host: str
    port: int
    tensor_parallel_size: int
    max_model_len: int | None
    speculative_config: dict[str, Any] | None
    profile: Path
    dynamic_k: bool
    seed: int | None
    ignored_args: tuple[str, ...]

    def speculation(self) -> Speculation | None:
        """The engine's view: K, and the batch-size table only behind the --simulate-dynamic-k switch."""
        config = self.speculative_config
        if config is None:
            return None
        table = config.get("num_speculative_tokens_per_batch_size")
        per_batch = tuple((int(s), int(e), int(k)) for s, e, k in table) if self.dynamic_k and table else None
        return Speculation(int(config["num_speculative_tokens"]), per_batch)


def check_speculative_config(text: str) -> dict[str, Any]:
    """Parse --speculative-config JSON as vLLM would: a JSON object with only SpeculativeConfig keys."""
    try:
        config: Any = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpeculativeConfigError(f"not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise SpeculativeConfigError("must be a JSON object")
    unknown = sorted(set(config) - VLLM_SPECULATIVE_CONFIG_KEYS)
    if unknown:
        raise SpeculativeConfigError(f"extra inputs are not permitted: {', '.join(unknown)}")
    k = config.get("num_speculative_tokens")
    # vLLM can infer K from some MTP checkpoints; a simulator has no checkpoint, so K must be given.
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise SpeculativeConfigError("num_speculative_tokens must be an integer > 0")
    table = config.get("num_speculative_tokens_per_batch_size")
    if table is not None:
        try:
            Speculation(k, tuple((int(s), int(e), int(n)) for s, e, n in table))
        except (TypeError, ValueError) as err:
            raise SpeculativeConfigError(f"num_speculative_tokens_per_batch_size: {err}") from err
    return config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="vLLM 0.33 `vllm serve` stand-in driven by a simulator profile."
    )
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--speculative-config", "-sc")
    parser.add_argument("--attention-backend")
    parser.add_argument("--profile", type=Path, required=True, help="simulator profile (YAML or JSON)")
    parser.add_argument(
        "--simulate-dynamic-k",
        action="store_true",
        help="honour num_speculative_tokens_per_batch_size (vLLM's built-in dynamic K)",
    )
    parser.add_argument("--seed", type=int, help="random seed (default: unseeded)")
    return parser


def parse_serve_args(argv: list[str]) -> ServeOptions:
    """Parse `serve MODEL ...`; vLLM flags the simulator has no use for are tolerated and reported.

    A bad speculative config exits with status 2 and one error line, like an argparse error.
    """
    parser = _parser()
    namespace, ignored = parser.parse_known_args(argv)
    speculative = None
    if namespace.speculative_config is not None:
        try:
            speculative = check_speculative_config(namespace.speculative_config)
        except SpeculativeConfigError as err:
            parser.exit(2, f"{PROG}: error: --speculative-config: {err}\n")
    names: list[str] | None = namespace.served_model_name
    return ServeOptions(
        model=namespace.model,
        # vLLM labels metrics with the first served name and falls back to the model path.
        served_model_name=names[0] if names else namespace.model,
        host=namespace.host,
        port=namespace.port,
        tensor_parallel_size=namespace.tensor_parallel_size,
        max_model_len=namespace.max_model_len,
        speculative_config=speculative,
        profile=namespace.profile,
        dynamic_k=namespace.simulate_dynamic_k,
        seed=namespace.seed,
        ignored_args=tuple(ignored),
    )
