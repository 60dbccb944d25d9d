"""Runs inside the vLLM venv that hack/vllm-env builds: feeds cases to vLLM 0.33.0's own code and prints what it says.

`python vllm_driver.py COMMAND < cases.json > results.json`; one JSON document in, one out. Nothing here
imports the project (its venv has no specdec packages): tests/contract renders the cases with the operator's
own code and compares. Always CPU, offline, and only tiny config directories written by `models`, no weights.

Commands:
  models       {"dir": D, "mtp_layers": [N...]}  write the tiny HF config directories, return their paths
  serve        {"cases": [{"id", "argv"}]}       `vllm serve` parser, validate_parsed_serve_args, then
                                                 EngineArgs.create_speculative_config via create_engine_config
  proposers    {"cases": [{"id", "argv"}]}       the above, then construct the proposer class on CPU
  attention    {"gfx": G, "cases": [...]}        RocmPlatform.get_attn_backend_cls with the device query stubbed
  options      {}                                every option string of the serve parser with its dest
  metrics      {"argv"}                          PrometheusStatLogger fed fake stats, its exposition text
  http_metrics {"requests": [[m, path, json]]}   vLLM's API-server http_requests instrumentation after requests
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

# Tiny sizes: 8 heads so that every tensor-parallel size we render (1..8) divides them.
LLAMA: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 8, "vocab_size": 512, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
}
DEEPSEEK_V3: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 512, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 16,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1,
    "max_position_embeddings": 32768, "torch_dtype": "bfloat16", "architectures": ["DeepseekV3ForCausalLM"],
}
QWEN3: dict[str, Any] = {**LLAMA, "head_dim": 16}


def _models(request: dict[str, Any]) -> dict[str, str]:
    from transformers import DeepseekV3Config, LlamaConfig, Qwen3Config

    root = Path(request["dir"])
    configs = {
        "target-llama": LlamaConfig(**LLAMA, architectures=["LlamaForCausalLM"]),
        **{
            f"target-deepseek-v3-mtp{layers}": DeepseekV3Config(**DEEPSEEK_V3, num_nextn_predict_layers=layers)
            for layers in request.get("mtp_layers", (1, 2))
        },
        "drafter-llama-draft-model": LlamaConfig(
            **{**LLAMA, "num_hidden_layers": 1}, architectures=["LlamaForCausalLM"]
        ),
        "drafter-eagle-llama": LlamaConfig(**{**LLAMA, "num_hidden_layers": 1}, architectures=["LlamaForCausalLM"]),
        "drafter-eagle3-llama": LlamaConfig(
            **{**LLAMA, "num_hidden_layers": 1}, architectures=["LlamaForCausalLMEagle3"]
        ),
        "drafter-dflash-qwen3": Qwen3Config(
            **{**QWEN3, "num_hidden_layers": 1}, architectures=["DFlashDraftModel"], block_size=4,
            dflash_config={"target_layer_ids": [0, 1], "mask_token_id": 511},
        ),
        "drafter-dspark-qwen3": Qwen3Config(
            **{**QWEN3, "num_hidden_layers": 1}, architectures=["Qwen3DSparkModel"], block_size=4,
            dspark_target_layer_ids=[0, 1], dspark_noise_token_id=511,
        ),
    }
    paths = {}
    for name, config in configs.items():
        config.save_pretrained(root / name)
        paths[name] = str(root / name)
    # A custom_class proposer is a class the image can import; this one only proves the loading path.
    (root / "specdec_contract_proposer.py").write_text(
        "class ContractProposer:\n"
        "    def __init__(self, vllm_config):\n"
        "        self.k = vllm_config.speculative_config.num_speculative_tokens\n\n"
        "    def propose(self, *args, **kwargs):\n"
        "        return [[] for _ in range(self.k)]\n"
    )
    paths["custom-proposer"] = "specdec_contract_proposer.ContractProposer"
    return paths


def _serve_parser() -> tuple[Any, Any]:
    """The parser `vllm serve` builds (vllm/entrypoints/cli/main.py), with only the serve subcommand."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    return parser, command


def _message(err: BaseException) -> str:
    """vLLM's own words: pydantic wraps a config's ValueError as `Value error, <message>`."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            first = errors()[0]
            return str(first.get("msg", "")).removeprefix("Value error, ")
    return str(err)


def _engine_config(argv: list[str]) -> tuple[dict[str, Any], Any]:
    """Run argv the way `vllm serve` starts up until the engine config exists; (result, VllmConfig or None)."""
    import vllm.config.vllm
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

    # ROCm images ship Triton, so vLLM picks its model runner (V2 unless a feature needs V1) as on the GPU;
    # without Triton here it would fall back to V1, which refuses dspark. The choice itself stays vLLM's.
    vllm.config.vllm.HAS_TRITON = True

    parser, command = _serve_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
    except SystemExit:
        lines = stderr.getvalue().strip().splitlines()
        return {"stage": "parse", "error": "SystemExit", "message": lines[-1] if lines else ""}, None
    try:
        command.validate(args)  # validate_parsed_serve_args
    except Exception as err:
        return {"stage": "validate", "error": type(err).__name__, "message": _message(err)}, None
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    engine_args = AsyncEngineArgs.from_cli_args(args)
    seen: dict[str, Any] = {}
    create = EngineArgs.create_speculative_config

    def recording(self: Any, *a: Any, **kw: Any) -> Any:
        try:
            seen["speculative"] = create(self, *a, **kw)
        except BaseException:
            seen["failed"] = True
            raise
        return seen["speculative"]

    EngineArgs.create_speculative_config = recording  # type: ignore[method-assign]
    try:
        config = engine_args.create_engine_config()
    except Exception as err:
        stage = "speculative" if seen.get("failed") else "engine"
        return {"stage": stage, "error": type(err).__name__, "message": _message(err)}, None
    finally:
        EngineArgs.create_speculative_config = create  # type: ignore[method-assign]
    speculative = config.speculative_config
    result: dict[str, Any] = {
        "stage": None,
        "model": config.model_config.model,
        "served_model_name": config.model_config.served_model_name,
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "max_model_len": config.model_config.max_model_len,
        "attention_backend": None if config.attention_config.backend is None else config.attention_config.backend.name,
        "backend_per_kind": {kind: backend.name for kind, backend in config.attention_config.backend_per_kind.items()},
        "disable_log_stats": bool(getattr(args, "disable_log_stats", False)),
        "host": args.host,
        "port": args.port,
        "shutdown_timeout": config.shutdown_timeout,
    }
    if speculative is not None:
        result["speculative"] = {
            "method": speculative.method,
            "num_speculative_tokens": speculative.num_speculative_tokens,
            "model": speculative.model,
            "prompt_lookup_min": speculative.prompt_lookup_min,
            "prompt_lookup_max": speculative.prompt_lookup_max,
            "draft_tensor_parallel_size": speculative.draft_tensor_parallel_size,
        }
    return result, config


def _serve(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": case["id"], **_engine_config(case["argv"])[0]} for case in request["cases"]]


def _proposer(config: Any) -> Any:
    """The drafter the model runner vLLM picks for this config would build, on CPU: the V2 runner's
    init_speculator (vllm/v1/worker/gpu/spec_decode), else the V1 GPUModelRunner's choice."""
    import torch
    from vllm.config import set_current_vllm_config

    speculative = config.speculative_config
    device = torch.device("cpu")
    with set_current_vllm_config(config):
        if config.use_v2_model_runner:
            from vllm.v1.worker.gpu.spec_decode import init_speculator

            return init_speculator(config, device, None)  # type: ignore[arg-type]
        if speculative.method == "custom_class":
            from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer

            return create_custom_proposer(config)
        if speculative.method == "ngram":
            from vllm.v1.spec_decode.ngram_proposer import NgramProposer

            return NgramProposer(config)
        if speculative.uses_draft_model():
            from vllm.v1.spec_decode.draft_model import DraftModelProposer

            return DraftModelProposer(vllm_config=config, device=device, runner=None)
        if speculative.use_ngram_gpu():
            from vllm.v1.spec_decode.ngram_proposer_gpu import NgramProposerGPU

            return NgramProposerGPU(config, device, None)
        if speculative.use_dflash():
            from vllm.v1.spec_decode.dflash import DFlashProposer

            return DFlashProposer(config, device, None)
        if speculative.method == "suffix":
            from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

            return SuffixDecodingProposer(config)
        if speculative.use_eagle():
            from vllm.v1.spec_decode.eagle import EagleProposer

            return EagleProposer(config, device, None)
        if speculative.method == "extract_hidden_states":
            from vllm.v1.spec_decode.extract_hidden_states import ExtractHiddenStatesProposer

            return ExtractHiddenStatesProposer(vllm_config=config, device=device)
    raise ValueError(f"Unknown speculative decoding method: {speculative.method}")


def _proposers(request: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    for case in request["cases"]:
        result, config = _engine_config(case["argv"])
        if config is not None and config.speculative_config is not None:
            result["runner"] = "v2" if config.use_v2_model_runner else "v1"
            try:
                result["proposer"] = type(_proposer(config)).__name__
            except BaseException as err:
                result.update(stage="proposer", error=type(err).__name__, message=_message(err))
                result["where"] = traceback.extract_tb(err.__traceback__)[-1].name
        results.append({"id": case["id"], **result})
    return results


def _attention(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The device-properties query vLLM's ROCm platform makes once at import is stubbed to report `gfx`
    (amdsmi is absent here, so rocm.py falls back to torch.cuda.get_device_properties)."""
    import torch

    gfx = request["gfx"]

    class Properties:
        gcnArchName = f"{gfx}:sramecc+:xnack-"
        name = f"AMD {gfx}"
        multi_processor_count = 304
        total_memory = 192 * 2**30

    torch.cuda.get_device_properties = lambda *a, **kw: Properties()  # type: ignore[assignment]
    for key, value in request.get("env", {}).items():
        os.environ[key] = value
    import vllm.envs as envs

    with contextlib.suppress(AttributeError):
        envs.disable_envs_cache()
    from vllm.platforms import rocm
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    results = []
    for case in request["cases"]:
        selector = AttentionSelectorConfig(
            head_size=case.get("head_size", 128),
            dtype=torch.bfloat16,
            kv_cache_dtype=None,
            block_size=case.get("block_size"),
            use_mla=case.get("use_mla", False),
        )
        selected = None if case["backend"] is None else AttentionBackendEnum[case["backend"]]
        try:
            path = rocm.RocmPlatform.get_attn_backend_cls(selected, selector, num_heads=case.get("num_heads", 8))
            results.append({"id": case["id"], "gcn_arch": rocm._GCN_ARCH, "backend_class": path})
        except Exception as err:
            results.append({"id": case["id"], "gcn_arch": rocm._GCN_ARCH, "error": type(err).__name__,
                            "message": _message(err)})
    return results


def _options(request: dict[str, Any]) -> list[dict[str, Any]]:
    parser, _ = _serve_parser()
    serve = next(action for action in parser._actions if action.dest == "subparser").choices["serve"]
    return [
        {"option": option, "dest": action.dest, "json": getattr(action.type, "__name__", "") == "parse_dataclass"}
        for action in serve._actions
        for option in action.option_strings
    ]


def _metrics(request: dict[str, Any]) -> str:
    """PrometheusStatLogger for a config with K speculative tokens, fed one iteration and one scheduler
    snapshot of fake stats; the text is what GET /metrics serves (its registry, vllm: families only)."""
    import prometheus_client
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    _, config = _engine_config(request["argv"])
    if config is None:
        raise SystemExit(f"the metrics config was refused: {request['argv']}")
    k = config.speculative_config.num_speculative_tokens
    logger = PrometheusStatLogger(config, engine_indexes=[0])
    spec = SpecDecodingStats.new(k)
    spec.observe_draft(num_draft_tokens=k, num_accepted_tokens=max(k - 1, 0))
    scheduler = SchedulerStats(num_running_reqs=3, num_waiting_reqs=1, kv_cache_usage=0.25,
                               spec_decoding_stats=spec)
    iteration = IterationStats()
    iteration.num_generation_tokens = 7
    iteration.inter_token_latencies_iter = [0.02, 0.03]
    logger.record(scheduler_stats=scheduler, iteration_stats=iteration, engine_idx=0)
    return prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()


def _http_metrics(request: dict[str, Any]) -> str:
    """vLLM's API-server instrumentation (vllm/entrypoints/serve/instrumentator/metrics.py attach_router) on a
    FastAPI app with stand-in routes, after the given (method, path, json) requests; the registry's text."""
    import prometheus_client
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient
    from vllm.entrypoints.serve.instrumentator.metrics import attach_router
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    app = FastAPI()

    async def completions(request: Any) -> JSONResponse:  # Starlette-style: gets the Request itself
        good = "prompt" in await request.json()
        return JSONResponse({"ok": True} if good else {"error": "bad"}, status_code=200 if good else 400)

    async def ok(request: Any) -> JSONResponse:
        return JSONResponse({})

    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/models", ok, methods=["GET"])
    app.add_route("/health", ok, methods=["GET"])
    attach_router(app)
    client = TestClient(app)
    for method, path, body in request["requests"]:
        client.request(method, path, json=body)
    return prometheus_client.generate_latest(get_prometheus_registry()).decode()


def _env_defaults(request: dict[str, Any]) -> dict[str, Any]:
    """vLLM's defaults of the named VLLM_* settings, with none of them set in the environment."""
    for name in request["names"]:
        os.environ.pop(name, None)
    import vllm.envs as envs

    return {name: getattr(envs, name) for name in request["names"]}


COMMANDS = {
    "env_defaults": _env_defaults,
    "http_metrics": _http_metrics,
    "models": _models,
    "serve": _serve,
    "proposers": _proposers,
    "attention": _attention,
    "options": _options,
    "metrics": _metrics,
}


def main() -> None:
    command = sys.argv[1]
    request = json.load(sys.stdin)
    if request.get("models_dir"):
        sys.path.insert(0, request["models_dir"])  # where `models` wrote the custom_class proposer module
    with contextlib.redirect_stdout(sys.stderr):  # vLLM may print; stdout carries only the answer
        answer = COMMANDS[command](request)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
