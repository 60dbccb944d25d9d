"""The argument lists the operator renders, for every example, every method, every gfx target and the K bounds.

Rendering is the operator's own (render.pool.runtime_config, decisions.runtime_env.plan_runtime,
specdec_runtime.config.serve_args); only the model names are swapped for the tiny local config directories
the vLLM driver writes, since vLLM reads config.json from them (offline, no weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specdec_operator.api.spec import Drafter, SpeculativeModelSpec
from specdec_operator.api.vocabulary import GFX_TARGETS, MAX_K, REFUSED_METHODS, SPECULATIVE_METHODS
from specdec_operator.decisions.drafter import FALLBACK, unsupported_reason
from specdec_operator.decisions.legal_k import legal_ks
from specdec_operator.decisions.runtime_env import plan_runtime
from specdec_operator.render.pool import (
    PoolIdentity,
    PoolTrack,
    config_map,
    engine_args,
    pod_template,
    runtime_config,
    with_attention_backend,
)
from specdec_runtime.config import RuntimeConfig, serve_args

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# Layer counts the driver writes DeepSeek-V3 targets for (target-deepseek-v3-mtp<N>).
MTP_LAYER_COUNTS = (1, 2, 3)
# A local directory per drafter method; custom_class names an importable class instead.
DRAFTER_DIRS = {
    "draft_model": "drafter-llama-draft-model",
    "eagle": "drafter-eagle-llama",
    "eagle3": "drafter-eagle3-llama",
    "dflash": "drafter-dflash-qwen3",
    "dspark": "drafter-dspark-qwen3",
    "custom_class": "custom-proposer",
}
PLACEHOLDER_DRAFTER = {method: f"org/{method}-drafter" for method in DRAFTER_DIRS}
PLACEHOLDER_DRAFTER["custom_class"] = "org_proposers.Proposer"


@dataclass(frozen=True)
class Case:
    """One rendered `vllm serve` argument list and where it came from."""

    id: str
    config: RuntimeConfig
    gfx: str
    env: dict[str, str] = field(default_factory=dict)
    mtp_layers: int | None = None

    # The arguments of the pod's `vllm` as the operator renders its container (render.pool); () for the
    # config's own serve_args (cases that never become a pod).
    args: tuple[str, ...] = ()

    def argv(self, models: dict[str, str]) -> list[str]:
        return localised(list(self.args) or serve_args(self.config), self.config, models, self.mtp_layers)


def localised(args: list[str], config: RuntimeConfig, models: dict[str, str], mtp_layers: int | None) -> list[str]:
    """The rendered args with the target and drafter swapped for the driver's local config directories."""
    out = list(args)
    method = config.speculative.method if config.speculative else None
    target = f"target-deepseek-v3-mtp{mtp_layers}" if method == "mtp" else "target-llama"
    assert out[1] == config.model
    out[1] = models[target]
    if config.speculative is not None and "--speculative-config" in out:
        index = out.index("--speculative-config") + 1
        speculative = json.loads(out[index])
        if speculative.get("model") is not None:
            speculative["model"] = models[DRAFTER_DIRS[speculative["method"]]]
        out[index] = json.dumps(speculative, sort_keys=True, separators=(",", ":"))
    return out


def render(
    spec: SpeculativeModelSpec, name: str, drafter: Drafter, k: int, gfx: str
) -> tuple[RuntimeConfig, dict[str, str]]:
    """What the reconciler renders for one pool: runtime config with the gfx target's attention backends."""
    user_env = {var.name: var.value for var in spec.runtime.env}
    image = spec.runtime.image or "vllm/vllm-openai-rocm:v0.33.0"
    plan = plan_runtime(gfx, image, None, user_env, spec.model.attention)
    config = with_attention_backend(
        runtime_config(spec, drafter, k), plan.attention_backend, plan.mla_attention_backend
    )
    return config, plan.env


UPSTREAM_IMAGE = "vllm/vllm-openai-rocm:v0.33.0"


def pod_container(spec: SpeculativeModelSpec, name: str, config: RuntimeConfig, gfx: str, k: int) -> dict[str, Any]:
    """The pool's container as the operator renders it (render.pool.pod_template): the image's `vllm` and its
    arguments."""
    identity = PoolIdentity("contract", name, "contract-uid", f"{name}-{gfx}", gfx)
    plan = plan_runtime(gfx, spec.runtime.image or UPSTREAM_IMAGE, None,
                        {var.name: var.value for var in spec.runtime.env}, spec.model.attention)
    track = PoolTrack("stable", k, config_map(identity, config)["metadata"]["name"], engine_args(config))
    container: dict[str, Any] = pod_template(identity, spec, plan, track)["spec"]["containers"][0]
    assert container["command"] == ["vllm"], container["command"]
    return container


def upstream_image_case() -> tuple[Case, dict[str, Any]]:
    """A pool whose spec.runtime.image is the upstream vLLM ROCm image, unmodified: its pod runs that image's vllm."""
    wire = {**method_spec("eagle3").to_wire(), "runtime": {"image": UPSTREAM_IMAGE}}
    spec = SpeculativeModelSpec.model_validate(wire)
    config, env = render(spec, "target", spec.drafters[0], 3, "gfx942")
    container = pod_container(spec, "target", config, "gfx942", 3)
    return Case("upstream-image/gfx942/eagle3/k3", config, "gfx942", env, args=tuple(container["args"])), container


def example_specs() -> list[tuple[str, SpeculativeModelSpec]]:
    specs = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "SpeculativeModel":
                name = f"{path.stem}/{doc['metadata']['name']}"
                specs.append((name, SpeculativeModelSpec.model_validate(doc["spec"])))
    return specs


def example_cases() -> list[Case]:
    """Every example x each of its gfx targets x every drafter it may run there (its preferences that are not
    blocked on that target, and the ngram fallback) x initialK and the K bounds."""
    cases = []
    for name, spec in example_specs():
        bounds = spec.speculation
        for gfx in spec.placement.gfx_targets:
            for drafter in [*spec.drafters, FALLBACK]:
                if unsupported_reason(drafter.method, gfx):
                    continue
                for k in sorted({bounds.initial_k, bounds.min_k, bounds.max_k}):
                    model = name.split("/")[1]
                    config, env = render(spec, model, drafter, k, gfx)
                    args = tuple(pod_container(spec, model, config, gfx, k)["args"])
                    cases.append(Case(f"{name}/{gfx}/{drafter.method}/k{k}", config, gfx, env, drafter.mtp_layers,
                                      args))
    return cases


def method_spec(method: str, mtp_layers: int | None = None) -> SpeculativeModelSpec:
    drafter: dict[str, Any] = {"method": method}
    if method in PLACEHOLDER_DRAFTER:
        drafter["model"] = PLACEHOLDER_DRAFTER[method]
    model: dict[str, Any] = {"name": "org/target-8B", "servedName": "target", "maxModelLen": 8192}
    if method == "mtp":
        drafter["mtpLayers"] = mtp_layers
        model["attention"] = "MLA"  # mtp runs on the driver's DeepSeek-V3 targets
    return SpeculativeModelSpec.model_validate({
        "model": model,
        "drafters": [drafter],
        "speculation": {"initialK": 1, "minK": 0, "maxK": MAX_K},
        "placement": {"gfxTargets": list(GFX_TARGETS)},
    })


def method_cases() -> list[Case]:
    """Every admitted method at every gfx target and the K bounds (0, 1, MAX_K); mtp at every K its declared
    layer count makes legal. Methods admission refuses are in `refused_method_cases`."""
    cases = []
    for method in SPECULATIVE_METHODS:
        if method in REFUSED_METHODS:
            continue
        for layers in MTP_LAYER_COUNTS if method == "mtp" else (None,):
            spec = method_spec(method, layers)
            drafter = spec.drafters[0]
            ks = legal_ks(method, layers, 0, MAX_K) if method == "mtp" else (0, 1, 2, MAX_K)
            for gfx in GFX_TARGETS:
                if unsupported_reason(method, gfx):
                    continue
                for k in ks:
                    config, env = render(spec, "target", drafter, k, gfx)
                    suffix = f"/mtp{layers}" if layers else ""
                    cases.append(Case(f"method/{method}{suffix}/{gfx}/k{k}", config, gfx, env, layers))
    return cases


def mtp_k_cases() -> list[tuple[int, int, list[str]]]:
    """(layers, K, args) for every K in 1..MAX_K, legal or not: vLLM's verdict must equal vllm_accepts_k's."""
    out = []
    for layers in MTP_LAYER_COUNTS:
        spec = method_spec("mtp", layers)
        for k in range(1, MAX_K + 1):
            config = runtime_config(spec, spec.drafters[0], k)
            out.append((layers, k, serve_args(config)))
    return out


def refused_method_cases() -> list[tuple[str, int, RuntimeConfig]]:
    """Configs for the methods admission refuses, rendered as if admitted: vLLM must refuse each too."""
    out = []
    for method in REFUSED_METHODS:
        drafter = Drafter.model_construct(method=method)  # admission would refuse it: build it unvalidated
        spec = method_spec("ngram")
        for k in (1, 2):
            out.append((method, k, runtime_config(spec, drafter, k)))
    return out


def unique(cases: list[Case], models: dict[str, str]) -> dict[str, list[str]]:
    """Distinct argument lists (gfx targets share most of them), keyed by their JSON."""
    return {json.dumps(case.argv(models)): case.argv(models) for case in cases}


# Every way vLLM 0.33's FlexibleArgumentParser + argparse let extraArgs set attention_config.backend.
ATTENTION_CONFIG_BACKEND_SPELLINGS: list[list[str]] = [
    form
    for flag in ("--attention-config", "--attention_config", "-ac", "--attention-conf", "--attention-c")
    for form in (
        [f"{flag}.backend=TRITON_ATTN"],
        [f"{flag}.backend", "TRITON_ATTN"],
        [flag, '{"backend":"TRITON_ATTN"}'],
        [f'{flag}={{"backend":"TRITON_ATTN"}}'],
    )
]
# attention_config keys that do not clash: extraArgs may set them, and vLLM starts with them.
ATTENTION_CONFIG_OTHER_KEYS: list[list[str]] = [
    ["--attention-config.flash_attn_version=3"],
    ["-ac.use_prefill_query_quantization", "true"],
]
# Other refusals the simulator must mirror, as extra args or speculative configs on a rendered base.
SPEC_ALIAS_CLASH = ["--spec-tokens", "2"]


def base_case(models: dict[str, str], method: str = "eagle3", k: int = 3, gfx: str = "gfx942") -> list[str]:
    spec = method_spec(method, 2 if method == "mtp" else None)
    config, _ = render(spec, "target", spec.drafters[0], k, gfx)
    return localised(serve_args(config), config, models, 2 if method == "mtp" else None)


def with_speculative(argv: list[str], **speculative: object) -> list[str]:
    out = list(argv)
    out[out.index("--speculative-config") + 1] = json.dumps(speculative, sort_keys=True, separators=(",", ":"))
    return out


def refusal_argvs(models: dict[str, str]) -> list[list[str]]:
    """Argument lists vLLM refuses at start-up that the operator can render or a user can reach."""
    base = base_case(models)
    llama = models["target-llama"]
    out = [[*base, *extra] for extra in ATTENTION_CONFIG_BACKEND_SPELLINGS]
    out.append([*base, *SPEC_ALIAS_CLASH])
    out.append(with_speculative(base, method="mtp", num_speculative_tokens=1))  # llama: no MTP layers
    out.append(with_speculative(base, method="ngram", num_speculative_tokens=3, prompt_lookup_min=6,
                                prompt_lookup_max=2))
    out.append(with_speculative(base, method="eagle3", num_speculative_tokens=3))  # without its model
    out += [localised(serve_args(config), config, models, None) for _, _, config in refused_method_cases()]
    assert all(argv[1] == llama for argv in out)
    return out


def startup_argvs(models: dict[str, str]) -> list[tuple[str, list[str]]]:
    """Speculative configs a user could hand vLLM (through the simulator, or a config the operator would
    render with another rule): each rule of vLLM 0.33's SpeculativeConfig and of the speculator the ROCm
    runner builds, broken once, beside neighbours that start. The simulator must start iff vLLM starts, and
    refuse with vLLM's exception class and message."""
    base = base_case(models)
    eagle3 = models[DRAFTER_DIRS["eagle3"]]
    mtp = base_case(models, "mtp", 2)
    layer_ids = {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1]}}
    configs: list[tuple[str, list[str], dict[str, Any]]] = [
        ("unknown-key", base, {"method": "eagle3", "model": eagle3, "num_speculative_tokens": 3,
                               "speculative_model": eagle3}),
        ("unknown-method", base, {"method": "medusa", "model": eagle3, "num_speculative_tokens": 3}),
        ("k-zero", base, {"method": "eagle3", "model": eagle3, "num_speculative_tokens": 0}),
        ("k-not-an-integer", base, {"method": "ngram", "num_speculative_tokens": "three"}),
        ("k-as-a-string", base, {"method": "ngram", "num_speculative_tokens": "3"}),
        ("lookup-min-zero", base, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}),
        ("lookup-max-only", base, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}),
        ("ngram-without-k", base, {"method": "ngram"}),
        ("k-without-method-or-model", base, {"num_speculative_tokens": 3}),
        ("custom-class-without-model", base, {"method": "custom_class", "num_speculative_tokens": 3}),
        ("custom-class-inferred", base, {"model": models["custom-proposer"], "num_speculative_tokens": 2}),
        ("suffix", base, {"method": "suffix", "num_speculative_tokens": 3}),
        ("draft-tp-not-1-or-target", base, {"method": "eagle3", "model": eagle3, "num_speculative_tokens": 3,
                                            "draft_tensor_parallel_size": 2}),
        ("tensor-parallel-size-key", base, {"method": "ngram", "num_speculative_tokens": 3,
                                            "tensor_parallel_size": 1}),
        ("lm-head-quantization-on-ngram", base, {"method": "ngram", "num_speculative_tokens": 3,
                                                 "draft_lm_head_quantization": "fp8"}),
        ("synthetic-length-without-synthetic", base, {"method": "ngram", "num_speculative_tokens": 3,
                                                      "synthetic_acceptance_length": 2.0}),
        ("synthetic-rates-increasing", base, {"method": "ngram", "num_speculative_tokens": 2,
                                              "rejection_sample_method": "synthetic",
                                              "synthetic_acceptance_rates": [0.5, 0.6]}),
        ("synthetic-rates-wrong-length", base, {"method": "ngram", "num_speculative_tokens": 3,
                                                "rejection_sample_method": "synthetic",
                                                "synthetic_acceptance_rates": [0.5]}),
        ("synthetic-ok", base, {"method": "ngram", "num_speculative_tokens": 3,
                                "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}),
        ("fly-k1", base, {"method": "ngram", "num_speculative_tokens": 1, "rejection_sample_method": "fly"}),
        ("fly-window-too-wide", base, {"method": "ngram", "num_speculative_tokens": 3,
                                       "rejection_sample_method": "fly", "fly_window_size": 3}),
        ("fly-ok", base, {"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "fly"}),
        ("heterogeneous-vocab-on-eagle3", base, {"method": "eagle3", "model": eagle3, "num_speculative_tokens": 3,
                                                 "use_heterogeneous_vocab": True}),
        ("index-share-on-ngram", base, {"method": "ngram", "num_speculative_tokens": 3,
                                        "index_share_for_mtp_iteration": True}),
        ("adaptive-verification-with-local-argmax", base, {"method": "ngram", "num_speculative_tokens": 3,
                                                           "enable_adaptive_verification": True,
                                                           "use_local_argmax_reduction": True}),
        ("legacy-mtp-name", mtp, {"method": "deepseek_mtp", "num_speculative_tokens": 2}),
        ("extract-without-k", base, {"method": "extract_hidden_states"}),
        ("extract-probabilistic", base, {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                         "draft_sample_method": "probabilistic", "draft_model_config": layer_ids}),
        ("extract-padded-batch-off", base, {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                            "disable_padded_drafter_batch": True, "draft_model_config": layer_ids}),
    ]
    return [(case_id, with_speculative(argv, **config)) for case_id, argv, config in configs]


def mtp_k_argvs(models: dict[str, str]) -> list[tuple[int, int, list[str]]]:
    out = []
    for layers, k, args in mtp_k_cases():
        spec = method_spec("mtp", layers)
        config = runtime_config(spec, spec.drafters[0], k)
        out.append((layers, k, localised(args, config, models, layers)))
    return out


# A user's own MLA backend in extraArgs, after the one rendered for an MLA target on gfx942.
MLA_OVERRIDE = ["--attention-config.backend_per_kind.mla_attention=TRITON_MLA"]


def mla_override_argv(models: dict[str, str]) -> list[str]:
    return [*base_case(models, "mtp", 2), *MLA_OVERRIDE]


def all_serve_argvs(models: dict[str, str]) -> list[list[str]]:
    base = base_case(models)
    return [
        mla_override_argv(models),
        *(case.argv(models) for case in [*example_cases(), *method_cases(), upstream_image_case()[0]]),
        *(argv for _, _, argv in mtp_k_argvs(models)),
        *refusal_argvs(models),
        *([*base, *extra] for extra in ATTENTION_CONFIG_OTHER_KEYS),
        base_case(models, "suffix"),
    ]


def proposer_argvs(models: dict[str, str]) -> list[list[str]]:
    """One config per method at K=2 (K=1 too for the methods admission refuses), as the gfx942 pool renders."""
    out = [base_case(models, method, 2) for method in SPECULATIVE_METHODS if method not in REFUSED_METHODS]
    out += [localised(serve_args(config), config, models, None) for _, _, config in refused_method_cases()]
    return out


# An MLA layer's head size as vLLM selects its backend: kv_lora_rank + qk_rope_head_dim (DeepSeek V2/V3, Kimi K2).
MLA_HEAD_SIZE = 512 + 64


def attention_request(gfx: str, user_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The backends the operator renders for the gfx target, with the environment it sets: the global one for a
    target with ordinary attention (head size 128, as Llama/Qwen) and the smaller head sizes tiny drafters use,
    and for an MLA target the per-kind one its MLA layers get. `mla-global` asks whether an MLA layer could
    run on the global backend (the operator's rendering before spec.model.attention), `standard-on-mla-backend`
    whether a standard layer (a drafter's) could run on the MLA one. `user_env`: spec.runtime.env (AITER off)."""
    spec = method_spec("eagle3")
    _, env = render(spec, "target", spec.drafters[0], 3, gfx)
    plan = plan_runtime(gfx, "vllm/vllm-openai-rocm:v0.33.0", None, user_env or {}, "MLA")
    if user_env:
        env = plan.env
    mla = {"use_mla": True, "head_size": MLA_HEAD_SIZE}
    return {
        "gfx": gfx,
        "env": env,
        "cases": [
            *({"id": f"head{size}", "backend": plan.attention_backend, "head_size": size} for size in (64, 128)),
            {"id": "mla", "backend": plan.mla_attention_backend, **mla},
            {"id": "mla-global", "backend": plan.attention_backend, **mla},
            {"id": "mla-auto", "backend": None, **mla},
            {"id": "standard-on-mla-backend", "backend": plan.mla_attention_backend, "head_size": 128},
        ],
    }
