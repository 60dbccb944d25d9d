"""The slice of `vllm serve`'s command line the simulator understands, with vLLM 0.33's validation.

The simulator must start from exactly the argument list `serve_args()` renders for vLLM, and refuse
what vLLM refuses with vLLM's own message, so that a staging rehearsal fails where production would.
tests/contract runs the same argument lists through both (docs/vllm-contract.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
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
# Legacy per-architecture MTP names vLLM 0.33 accepts and rewrites to "mtp" (MTPModelTypes).
MTP_ALIASES: tuple[str, ...] = (
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "glm_ocr_mtp",
    "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp",
    "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp", "mtp",
    "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "step5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp",
    "inkling_mtp", "glm5_next_mtp",
)
# SpeculativeConfig.method, in the order vLLM's Literal expands (pydantic lists them in this order).
VLLM_METHODS: tuple[str, ...] = (
    "ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3", "extract_hidden_states", *MTP_ALIASES,
    "dflash", "ngram_gpu", "dspark",
)
# Methods that load a drafter checkpoint (`model`, or the target's own weights for mtp and dspark).
METHODS_WITH_CHECKPOINT = frozenset({"draft_model", "eagle", "eagle3", "dflash", "dspark", "mtp"})
# Methods whose drafter is a separate checkpoint: vLLM refuses them without `model`.
METHODS_NEEDING_MODEL = frozenset({"draft_model", "eagle", "eagle3", "dflash", "custom_class"})
# Fields with a lower bound (pydantic's Field(gt=..) / Field(ge=..)) and closed vocabularies.
_GREATER_THAN_0 = ("num_speculative_tokens",)
_AT_LEAST_1 = ("draft_tensor_parallel_size", "max_model_len", "prompt_lookup_max", "prompt_lookup_min")
_LITERALS: dict[str, tuple[str, ...]] = {
    "method": VLLM_METHODS,
    "rejection_sample_method": ("standard", "synthetic", "block", "fly"),
    "draft_sample_method": ("greedy", "probabilistic"),
    "draft_lm_head_quantization": ("fp8", "nvfp4"),
}

EXIT_PARSE_ERROR = 2  # argparse's status, as `vllm serve` exits on a command line it cannot parse
EXIT_STARTUP_REFUSED = 1  # Python's status for the uncaught exception vLLM dies of at start-up


class SpeculativeConfigError(ValueError):
    pass


class StartupRefusal(Exception):
    """What vLLM 0.33 raises when it refuses a config at start-up: its exception class name and its message.

    The simulator prints `line()` as the last line on stderr and exits EXIT_STARTUP_REFUSED, as vLLM's
    traceback ends with that line; ValueErrors raised inside vLLM's pydantic configs surface as
    `ValidationError` with the ValueError's message (pydantic's "Value error, " prefix left out).
    """

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message

    def line(self) -> str:
        return f"{self.error}: {self.message}"


def _config_error(message: str) -> StartupRefusal:
    """A ValueError raised inside SpeculativeConfig: pydantic wraps it in a ValidationError."""
    return StartupRefusal("ValidationError", message)


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
    # vLLM's --shutdown-timeout: on SIGTERM, seconds in-flight requests may finish (0 aborts them, vLLM's default).
    shutdown_timeout: int = 0

    def speculation(self) -> Speculation | None:
        """The engine's view: K, and the batch-size table only behind the --simulate-dynamic-k switch."""
        config = self.speculative_config
        if config is None:
            return None
        table = config.get("num_speculative_tokens_per_batch_size")
        per_batch = tuple((int(s), int(e), int(k)) for s, e, k in table) if self.dynamic_k and table else None
        return Speculation(int(config["num_speculative_tokens"]), per_batch)


def check_speculative_config(text: str) -> dict[str, Any]:
    """Parse --speculative-config JSON as vLLM's argument parser does: a JSON object, else a parse error."""
    try:
        config: Any = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpeculativeConfigError(f"not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise SpeculativeConfigError("must be a JSON object")
    return config


def _literal_message(values: tuple[str, ...]) -> str:
    quoted = [f"'{value}'" for value in values]
    return f"Input should be {', '.join(quoted[:-1])} or {quoted[-1]}"


def _lax_int(value: Any) -> int | str:
    """pydantic's lax int: the integer, or the message it refuses the value with."""
    if isinstance(value, int):  # bool included, as in pydantic's lax mode
        return int(value)
    if isinstance(value, float):
        fractional = "Input should be a valid integer, got a number with a fractional part"
        return int(value) if value.is_integer() else fractional
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return "Input should be a valid integer, unable to parse string as an integer"
    return "Input should be a valid integer"


def _field_refusal(config: dict[str, Any]) -> StartupRefusal | None:
    """pydantic's field validation of SpeculativeConfig, before its __post_init__: the first error's text.
    Integer fields are coerced in place as pydantic's lax mode does ("3" and 3.0 read as 3)."""
    if set(config) - VLLM_SPECULATIVE_CONFIG_KEYS:
        return _config_error("Unexpected keyword argument")  # a pydantic dataclass takes no extra kwargs
    for key, values in _LITERALS.items():
        if key in config and config[key] is not None and config[key] not in values:
            return _config_error(_literal_message(values))
    for key in (*_GREATER_THAN_0, *_AT_LEAST_1):
        if config.get(key) is None:
            continue
        value = _lax_int(config[key])
        if isinstance(value, str):
            return _config_error(value)
        config[key] = value
        if key in _GREATER_THAN_0 and value <= 0:
            return _config_error("Input should be greater than 0")
        if key in _AT_LEAST_1 and value < 1:
            return _config_error("Input should be greater than or equal to 1")
    return None


def _is_custom_proposer_path(model: object) -> bool:
    """SpeculativeConfig._is_custom_proposer_path: a dotted import path such as pkg.MyProposer."""
    if not isinstance(model, str) or model.startswith(("http://", "https://", "file://")) or "/" in model:
        return False
    parts = model.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def _synthetic_refusal(k: int, rates: Any, length: Any) -> StartupRefusal | None:
    """SpeculativeConfig._resolve_synthetic_acceptance_rates."""
    if (rates is None) == (length is None):
        return _config_error(
            "rejection_sample_method='synthetic' requires exactly one of "
            "synthetic_acceptance_rates or synthetic_acceptance_length."
        )
    if rates is not None:
        if len(rates) != k:
            return _config_error(f"synthetic_acceptance_rates must have length {k}, got {rates}.")
        if not all(0.0 <= r <= 1.0 for r in rates):
            return _config_error(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}.")
        if any(rates[i] > rates[i - 1] for i in range(1, k)):
            return _config_error(f"synthetic_acceptance_rates must be non-increasing, got {rates}.")
        return None
    if not 1.0 <= length <= float(k + 1):
        return _config_error(f"synthetic_acceptance_length must be in [1, {k + 1}], got {length}.")
    return None


def resolve_speculative_config(
    config: dict[str, Any], model: str, tensor_parallel_size: int
) -> dict[str, Any]:
    """vLLM 0.33's SpeculativeConfig on the config, then the V2 model runner's proposer construction (what a
    ROCm image, which ships Triton, starts): the config with method and K as vLLM resolves them, or the
    StartupRefusal vLLM raises. Checks that need a checkpoint run only on a local target directory."""
    # EngineArgs.create_speculative_config: '-' in keys reads as '_'.
    config = {key.replace("-", "_"): value for key, value in config.items()}
    refusal = _field_refusal(config)
    if refusal is not None:
        raise refusal
    method, k, drafter = config.get("method"), config.get("num_speculative_tokens"), config.get("model")
    if method is None:
        method = "custom_class" if _is_custom_proposer_path(drafter) else (
            "ngram" if drafter in ("ngram", "[ngram]") else "draft_model"
        )
    if method in MTP_ALIASES:
        method = "mtp"
    if drafter is None and k is not None:
        if method == "custom_class":
            raise _config_error(
                "method='custom_class' requires 'model' to contain the custom proposer module path "
                "(e.g., 'my_module.MyProposer')."
            )
        if method in METHODS_NEEDING_MODEL:
            raise _config_error("num_speculative_tokens was provided but without speculative model.")
    if method in ("ngram", "ngram_gpu"):
        lookup_min, lookup_max = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        lookup_min = lookup_max if lookup_min is None else lookup_min
        lookup_max = lookup_min if lookup_max is None else lookup_max
        if lookup_min is not None and lookup_max is not None and lookup_min > lookup_max:
            raise _config_error(f"prompt_lookup_min={lookup_min} must be <= prompt_lookup_max={lookup_max}")
    elif method == "suffix":
        # Not wrapped by pydantic: an ImportError is no ValueError. vLLM's ROCm images lack the package.
        raise StartupRefusal(
            "ImportError",
            "Arctic Inference is required for suffix decoding. Install via `pip install arctic-inference==0.1.1`.",
        )
    elif method in METHODS_WITH_CHECKPOINT:
        k = _checkpoint_refusal_or_k(method, k, drafter, model, config, tensor_parallel_size)
    if config.get("index_share_for_mtp_iteration") is not None and method != "mtp":
        raise _config_error("index_share_for_mtp_iteration is only supported with method='mtp'")
    if method != "dspark" and config.get("enable_adaptive_verification") and config.get("use_local_argmax_reduction"):
        raise _config_error(
            "Adaptive verification estimates per-position acceptance from the draft logits, which "
            "use_local_argmax_reduction never materializes. Disable one of them."
        )
    k = _verify_args(config, method, k)
    if method == "extract_hidden_states":
        _extract_hidden_states_speculator(config, k)
    table = config.get("num_speculative_tokens_per_batch_size")
    if table is not None:
        try:
            Speculation(k, tuple((int(s), int(e), int(n)) for s, e, n in table))
        except (TypeError, ValueError) as err:
            raise _config_error(f"num_speculative_tokens_per_batch_size: {err}") from err
    return {**config, "num_speculative_tokens": k}


def _checkpoint_refusal_or_k(
    method: str, k: int | None, drafter: Any, model: str, config: dict[str, Any], tensor_parallel_size: int
) -> int | None:
    """The part of __post_init__ that loads the drafter's (or for mtp the target's) config: K, or a refusal."""
    if method == "mtp":
        target = _local_hf_config(drafter or model)
        if target is not None:
            layers = next((target[key] for key in MTP_LAYER_KEYS if target.get(key)), None)
            if layers is None:
                raise StartupRefusal("NotImplementedError", "Unsupported speculative method: 'mtp'")
            if k is None:
                k = layers
            elif k > layers and k % layers != 0:
                raise _config_error(f"num_speculative_tokens:{k} must be divisible by n_predict={layers}")
    if k is None and method != "dspark":
        raise _config_error("A speculative model was provided, but `num_speculative_tokens` was not provided")
    draft_tp = config.get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp not in (1, tensor_parallel_size):
        raise _config_error(
            f"speculative_draft_tensor_parallel_size={draft_tp} cannot be other value than 1 or target model "
            "tensor_parallel_size"
        )
    return k


def _verify_args(config: dict[str, Any], method: str, k: int | None) -> int:
    """SpeculativeConfig._verify_args (a model validator after __post_init__); returns K, now known."""
    if config.get("tensor_parallel_size") is not None:
        raise _config_error(
            "'tensor_parallel_size' is not a valid argument in the speculative_config. "
            "Please pass 'draft_tensor_parallel_size' instead."
        )
    if k is None:
        raise _config_error(
            "num_speculative_tokens must be provided with speculative model unless the draft model config "
            "contains an n_predict parameter."
        )
    if config.get("draft_lm_head_quantization") is not None and method not in ("eagle", "eagle3", "mtp"):
        raise _config_error(f"draft_lm_head_quantization is not supported for method {method!r}.")
    rates, length = config.get("synthetic_acceptance_rates"), config.get("synthetic_acceptance_length")
    if config.get("rejection_sample_method") == "synthetic":
        refusal = _synthetic_refusal(k, rates, length)
        if refusal is not None:
            raise refusal
    elif rates is not None or length is not None:
        raise _config_error(
            "synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
            "rejection_sample_method='synthetic'."
        )
    if config.get("use_heterogeneous_vocab"):
        if method != "draft_model":
            raise _config_error("use_heterogeneous_vocab only works with method='draft_model'")
        if config.get("draft_sample_method", "greedy") != "greedy":
            raise _config_error(
                "use_heterogeneous_vocab currently only supports greedy draft sampling. Set "
                "draft_sample_method='greedy' (the default) or omit it."
            )
        if config.get("use_local_argmax_reduction"):
            raise _config_error(
                "use_heterogeneous_vocab is not compatible with use_local_argmax_reduction because token-level "
                "intersection requires the full draft logits."
            )
    if config.get("rejection_sample_method") == "fly":
        if method == "extract_hidden_states":
            raise _config_error(
                "FLy is not compatible with method='extract_hidden_states', which does not perform speculative "
                "decoding."
            )
        if k < 2:
            raise _config_error("FLy requires num_speculative_tokens to be at least 2.")
        window = config.get("fly_window_size")
        if window is not None and window >= k:
            raise _config_error("FLy requires fly_window_size to be smaller than num_speculative_tokens.")
    return k


def _extract_hidden_states_speculator(config: dict[str, Any], k: int) -> None:
    """ExtractHiddenStatesSpeculator.__init__ (vllm/v1/worker/gpu/spec_decode): plain ValueErrors in the
    engine core's process when the model runner builds its speculator."""
    if config.get("draft_sample_method", "greedy") != "greedy":
        raise StartupRefusal("ValueError", "extract_hidden_states only supports draft_sample_method='greedy'")
    if k != 1:
        raise StartupRefusal("ValueError", "extract_hidden_states requires num_speculative_tokens to be 1")
    if config.get("disable_padded_drafter_batch"):
        raise StartupRefusal(
            "ValueError", "disable_padded_drafter_batch is not supported with extract_hidden_states method"
        )
    draft = config.get("draft_model_config")
    hf_config = draft.get("hf_config", {}) if isinstance(draft, dict) else {}
    if not isinstance(hf_config, dict) or not hf_config.get("eagle_aux_hidden_state_layer_ids"):
        raise StartupRefusal(
            "ValueError",
            "eagle_aux_hidden_state_layer_ids must be set in the draft model config for extract_hidden_states method",
        )


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
    parser.add_argument("--shutdown-timeout", type=int, default=0)
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
    """Parse `serve MODEL ...` as the simulator's process does; vLLM flags it has no use for are tolerated.

    A command line vLLM's parser refuses exits EXIT_PARSE_ERROR (2) with one `specdec-simulator: error: ...`
    line. A config vLLM refuses at start-up exits EXIT_STARTUP_REFUSED (1), the last line on stderr being
    `<vLLM's exception class>: <vLLM's message>` (StartupRefusal.line), as vLLM's own traceback ends.
    """
    try:
        return check_serve_args(argv)
    except StartupRefusal as refusal:
        sys.stderr.write(f"{refusal.line()}\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_STARTUP_REFUSED) from None


def check_serve_args(argv: list[str]) -> ServeOptions:
    """The options vLLM 0.33 would start with; raises StartupRefusal for what it refuses at start-up (parse
    errors still exit, as argparse does)."""
    parser = _parser()
    namespace, ignored = parser.parse_known_args(flexible_args(argv))
    raw = _speculative(namespace, parser)
    attention_config: Any = {}
    if namespace.attention_config is not None:
        try:
            attention_config = json.loads(namespace.attention_config)
        except json.JSONDecodeError as err:
            parser.exit(EXIT_PARSE_ERROR, f"{PROG}: error: --attention-config: not valid JSON: {err}\n")
        if not isinstance(attention_config, dict):
            parser.exit(EXIT_PARSE_ERROR, f"{PROG}: error: --attention-config: must be a JSON object\n")
    if namespace.attention_backend is not None and attention_config.get("backend") is not None:
        raise StartupRefusal("ValueError", "attention_backend and attention_config.backend are mutually exclusive")
    speculative = None
    if raw is not None:
        speculative = resolve_speculative_config(raw, namespace.model, namespace.tensor_parallel_size)
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
        shutdown_timeout=namespace.shutdown_timeout,
    )


def _speculative(namespace: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any] | None:
    """--speculative-config with the short aliases merged in, as vLLM merges them."""
    text: str | None = namespace.speculative_config
    aliases = {key: getattr(namespace, flag[2:].replace("-", "_")) for flag, key in SPEC_ALIASES}
    given = {key: value for key, value in aliases.items() if value is not None}
    if text is None and not given:
        return None
    try:
        raw = check_speculative_config(text) if text is not None else {}
    except SpeculativeConfigError as err:
        parser.exit(EXIT_PARSE_ERROR, f"{PROG}: error: --speculative-config: {err}\n")
    for flag, key in SPEC_ALIASES:
        if key in given and key in raw:
            # Raised by EngineArgs.create_speculative_config at start-up, outside any pydantic model.
            raise StartupRefusal("ValueError", f"{flag} and --speculative-config['{key}'] are mutually exclusive")
    if "num_speculative_tokens" in given:
        given["num_speculative_tokens"] = int(given["num_speculative_tokens"])
    return {**raw, **given}
