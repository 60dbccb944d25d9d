"""The slice of `vllm serve`'s command line the simulator understands, with vLLM 0.33's validation.

The simulator must start from exactly the argument list `serve_args()` renders for vLLM, and refuse
what vLLM refuses with vLLM's own message, so that a staging rehearsal fails where production would.
tests/contract runs the same argument lists through both (docs/vllm-contract.md).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
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


# Short aliases vLLM 0.33 merges into --speculative-config (EngineArgs.create_speculative_config).
SPEC_ALIASES: tuple[tuple[str, str], ...] = (
    ("--spec-method", "method"),
    ("--spec-model", "model"),
    ("--spec-tokens", "num_speculative_tokens"),
)
# config.json keys that declare a checkpoint's MTP layers, read the way vLLM reads them for method mtp.
MTP_LAYER_KEYS: tuple[str, ...] = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
# Methods whose drafter is a separate checkpoint: vLLM refuses them without `model`.
METHODS_NEEDING_MODEL = frozenset({"draft_model", "eagle", "eagle3", "dflash", "custom_class"})


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


def vllm_start_refusal(
    model: str, speculative: dict[str, Any] | None, attention_backend: str | None, attention_config: dict[str, Any]
) -> str | None:
    """vLLM 0.33's start-up refusal for a config that parsed, or None. Only local target configs are read:
    for a hub id the simulator cannot know the checkpoint's MTP layers and accepts mtp."""
    if attention_backend is not None and attention_config.get("backend") is not None:
        return "attention_backend and attention_config.backend are mutually exclusive"
    if speculative is None:
        return None
    method, k = speculative.get("method"), speculative.get("num_speculative_tokens")
    if method in METHODS_NEEDING_MODEL and speculative.get("model") is None:
        if method == "custom_class":
            return (
                "method='custom_class' requires 'model' to contain the custom proposer module path "
                "(e.g., 'my_module.MyProposer')."
            )
        return "num_speculative_tokens was provided but without speculative model."
    lookup_min, lookup_max = speculative.get("prompt_lookup_min"), speculative.get("prompt_lookup_max")
    if (
        method in ("ngram", "ngram_gpu")
        and isinstance(lookup_min, int)
        and isinstance(lookup_max, int)
        and lookup_min > lookup_max
    ):
        return f"prompt_lookup_min={lookup_min} must be <= prompt_lookup_max={lookup_max}"
    if method == "mtp":
        target = _local_hf_config(speculative.get("model") or model)
        if target is not None:
            layers = next((target[key] for key in MTP_LAYER_KEYS if target.get(key)), None)
            if layers is None:
                return "Unsupported speculative method: 'mtp'"
            if isinstance(k, int) and k > layers and k % layers != 0:
                return f"num_speculative_tokens:{k} must be divisible by n_predict={layers}"
    if method == "extract_hidden_states":
        if k != 1:
            # The speculator of vLLM's V2 model runner, which ROCm images (they have Triton) start.
            return "extract_hidden_states requires num_speculative_tokens to be 1"
        draft = speculative.get("draft_model_config")
        hf_config = draft.get("hf_config", {}) if isinstance(draft, dict) else {}
        if not hf_config.get("eagle_aux_hidden_state_layer_ids"):
            return (
                "eagle_aux_hidden_state_layer_ids must be set in the draft model config for "
                "extract_hidden_states method"
            )
    return None


def _local_hf_config(model: str) -> dict[str, Any] | None:
    """config.json of a local model directory (vLLM would read the same file), else None."""
    path = Path(model) / "config.json"
    try:
        config: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text_config = config.get("text_config")
    return {**text_config, **config} if isinstance(text_config, dict) else config


def flexible_args(argv: list[str]) -> list[str]:
    """vLLM 0.33's FlexibleArgumentParser rewriting: `--a_b` -> `--a-b` up to the first dot, and every
    `--json-flag.key[+]=value` merged into one `--json-flag JSON` argument appended at the end."""
    rewritten: list[str] = []
    for arg in argv:
        if arg.startswith("--"):
            key, sep, value = arg.partition("=")
            key = re.sub(r"(?<=--)[^.]*", lambda match: match.group(0).replace("_", "-"), key, count=1)
            rewritten.append(f"{key}{sep}{value}")
        else:
            rewritten.append(arg)
    merged: dict[str, dict[str, Any]] = defaultdict(dict)
    kept: list[str] = []
    index = 0
    while index < len(rewritten):
        arg = rewritten[index]
        index += 1
        name, sep, value = arg.partition("=")
        if not arg.startswith("-") or "." not in name:
            kept.append(arg)
            continue
        if not sep:
            value = rewritten[index] if index < len(rewritten) else ""
            index += 1
        if name.endswith("+"):
            name, value = name[:-1], json.dumps(value.split(","))
        flag, *keys = name.split(".")
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        node: dict[str, Any] = merged[flag]
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = parsed
    for flag, tree in merged.items():
        kept += [flag, json.dumps(tree)]
    return kept


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
    parser.add_argument("--attention-config", "-ac")
    for flag, _ in SPEC_ALIASES:
        parser.add_argument(flag)
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
    namespace, ignored = parser.parse_known_args(flexible_args(argv))
    speculative = _speculative(namespace, parser)
    attention_config: Any = {}
    if namespace.attention_config is not None:
        try:
            attention_config = json.loads(namespace.attention_config)
        except json.JSONDecodeError as err:
            parser.exit(2, f"{PROG}: error: --attention-config: not valid JSON: {err}\n")
        if not isinstance(attention_config, dict):
            parser.exit(2, f"{PROG}: error: --attention-config: must be a JSON object\n")
    refusal = vllm_start_refusal(namespace.model, speculative, namespace.attention_backend, attention_config)
    if refusal is not None:
        parser.exit(2, f"{PROG}: error: {refusal}\n")
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


def _speculative(namespace: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any] | None:
    """--speculative-config with the short aliases merged in, as vLLM merges them."""
    text: str | None = namespace.speculative_config
    aliases = {key: getattr(namespace, flag[2:].replace("-", "_")) for flag, key in SPEC_ALIASES}
    given = {key: value for key, value in aliases.items() if value is not None}
    if text is None and not given:
        return None
    try:
        raw: Any = json.loads(text) if text is not None else {}
    except json.JSONDecodeError as err:
        parser.exit(2, f"{PROG}: error: --speculative-config: not valid JSON: {err}\n")
    if isinstance(raw, dict):
        for flag, key in SPEC_ALIASES:
            if key in given and key in raw:
                parser.exit(2, f"{PROG}: error: {flag} and --speculative-config['{key}'] are mutually exclusive\n")
        if "num_speculative_tokens" in given:
            given["num_speculative_tokens"] = int(given["num_speculative_tokens"])
        raw = {**raw, **given}
    try:
        return check_speculative_config(json.dumps(raw))
    except SpeculativeConfigError as err:
        parser.exit(2, f"{PROG}: error: --speculative-config: {err}\n")
