"""Closed vocabularies shared by the API, the decisions and the renderer.

Kept apart from the models so that pure decision code can import them without pydantic.
"""

from typing import Literal, get_args

# vLLM 0.33.0 `SpeculativeConfig.method` values (vllm/config/speculative.py). The legacy *_mtp
# aliases are rewritten to "mtp" by vLLM, so we accept only the canonical name. medusa and
# mlp_speculator were removed in 0.33.0.
SpeculativeMethod = Literal[
    "ngram",
    "ngram_gpu",
    "draft_model",
    "suffix",
    "eagle",
    "eagle3",
    "mtp",
    "dflash",
    "dspark",
    "extract_hidden_states",
    "custom_class",
]
SPECULATIVE_METHODS: tuple[str, ...] = get_args(SpeculativeMethod)

# Methods whose drafter is a separate checkpoint that must be named.
METHODS_REQUIRING_MODEL: tuple[str, ...] = ("draft_model", "eagle", "eagle3", "dflash", "dspark", "custom_class")
# Methods that draft from the prompt or output history and take no checkpoint at all.
METHODS_WITHOUT_MODEL: tuple[str, ...] = ("ngram", "ngram_gpu", "suffix")
# Drafters that propose a whole block at once: per-position counters do not give E(K') for them.
BLOCK_DRAFTERS: tuple[str, ...] = ("dflash", "dspark")

# Methods vLLM 0.33 accepts that the operator refuses at admission, and why (docs/vllm-contract.md).
# extract_hidden_states dumps the target's hidden states (to train EAGLE heads): its proposer asserts K == 1,
# needs eagle_aux_hidden_state_layer_ids in a draft config no field can set, and counts every token it
# "drafts" as accepted, so it neither speeds up serving nor gives the tuner a real acceptance to read.
REFUSED_METHODS: dict[str, str] = {
    "extract_hidden_states": "it is not a drafter: vLLM runs it only at K=1 with "
    "eagle_aux_hidden_state_layer_ids set, to dump hidden states, and counts all its tokens as accepted",
}


def vllm_accepts_k(method: str, k: int, mtp_layers: int | None) -> bool:
    """Whether vLLM 0.33 starts `method` with proposal length `k` (K=0 renders no speculative config).

    mtp reuses the target's MTP layers: SpeculativeConfig refuses a K above the layer count unless it is a
    multiple of it ("num_speculative_tokens:K must be divisible by n_predict=N"); an undeclared count is
    never legal because vLLM refuses mtp outright on a target without MTP layers.
    """
    if k == 0:
        return True
    if method == "mtp":
        return mtp_layers is not None and mtp_layers >= 1 and (k <= mtp_layers or k % mtp_layers == 0)
    if method == "extract_hidden_states":
        return k == 1
    return k >= 1


# AMD gfx targets that vLLM 0.33 supports on ROCm. gfx908 (MI100), gfx1102 and gfx103x are not.
GfxTarget = Literal["gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1150", "gfx1151", "gfx1200", "gfx1201"]
GFX_TARGETS: tuple[str, ...] = get_args(GfxTarget)

# Product names accepted in spec.placement.gfxTargets for the gfx target they run. A product names its target's
# pool, which also takes the target's other products (mi300x -> gfx942: MI300X, MI300A, MI308X, MI325X nodes);
# gpu/devices.py holds the device ids (tests/unit/api/test_gfx_aliases.py keeps the two in agreement).
GfxProduct = Literal[
    "mi210", "mi250", "mi250x", "mi300a", "mi300x", "mi308x", "mi325x", "mi350x", "mi355x",
    "w7800", "w7900", "rx7900xtx", "rx7800xt", "r9700", "rx9070xt", "rx9060xt",
]
GFX_PRODUCTS: dict[str, str] = {
    "mi210": "gfx90a", "mi250": "gfx90a", "mi250x": "gfx90a",
    "mi300a": "gfx942", "mi300x": "gfx942", "mi308x": "gfx942", "mi325x": "gfx942",
    "mi350x": "gfx950", "mi355x": "gfx950",
    "w7800": "gfx1100", "w7900": "gfx1100", "rx7900xtx": "gfx1100", "rx7800xt": "gfx1101",
    "r9700": "gfx1201", "rx9070xt": "gfx1201", "rx9060xt": "gfx1200",
}


# What spec.placement.gfxTargets admits: one enum of gfx names and product aliases (a union would not be a
# structural schema). tests/unit/decisions/test_placement_discovery.py checks it is GFX_TARGETS + GFX_PRODUCTS.
GfxTargetOrProduct = Literal[
    "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1150", "gfx1151", "gfx1200", "gfx1201",
    "mi210", "mi250", "mi250x", "mi300a", "mi300x", "mi308x", "mi325x", "mi350x", "mi355x",
    "w7800", "w7900", "rx7900xtx", "rx7800xt", "r9700", "rx9070xt", "rx9060xt",
]


def gfx_of(target: str) -> str:
    """The gfx target a spec.placement.gfxTargets entry names (a gfx target, or a product alias)."""
    return GFX_PRODUCTS.get(target, target)

# Compute/memory partition modes the AMD GPU operator exposes (amd.com/gpu.compute-memory-partition).
PartitionMode = Literal["spx_nps1", "dpx_nps1", "dpx_nps2", "qpx_nps1", "qpx_nps4", "cpx_nps1", "cpx_nps4"]

# vLLM flags the operator renders itself; a user's extraArgs may not override them.
OWNED_VLLM_FLAGS: tuple[str, ...] = (
    "--speculative-config",
    "-sc",
    "--spec-method",
    "--spec-model",
    "--spec-tokens",
    "--port",
    "--host",
    "--served-model-name",
    "--tensor-parallel-size",
    "-tp",
    "--attention-backend",
    "--disable-log-stats",
    "--model",
    "--max-model-len",
    "--speculative-model",
    "--num-speculative-tokens",
    "--shutdown-timeout",
)
# Refused in extraArgs on top of the owned flags: vLLM's `--config FILE` reads any flag from YAML.
REFUSED_VLLM_FLAGS: tuple[str, ...] = (*OWNED_VLLM_FLAGS, "--config")


def vllm_option_key(arg: str) -> str:
    """The option vLLM 0.33's FlexibleArgumentParser resolves `arg` to, before abbreviation.

    It cuts `=value`, turns `--a_b` into `--a-b` and reads `--json-flag.key=v` as a sub-key of
    `--json-flag`. The CRD's CEL rule on spec.runtime.extraArgs computes the same key.
    """
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def refused_flag_reached(arg: str) -> str | None:
    """The refused flag `arg` names in any spelling, or None.

    argparse also accepts any unambiguous prefix of a long option, so a key that is a prefix of a
    refused flag is refused too (no vLLM 0.33 flag that we let through is a strict prefix of one we refuse).
    """
    return _flag_reached(arg, REFUSED_VLLM_FLAGS)


def _flag_reached(arg: str, flags: tuple[str, ...]) -> str | None:
    """The flag of `flags` that `arg` names, by the key vLLM resolves it to or an abbreviation of it, or None."""
    if not arg.startswith("-"):
        return None  # the value of the previous flag
    key = vllm_option_key(arg)
    return next((flag for flag in flags if flag.startswith(key)), None)


# Refused in extraArgs whatever their value: the operator runs one vLLM engine per pod on exactly
# spec.model.tensorParallelSize GPUs, which the device plugin picks, and scales out with replicas. In vLLM 0.33
# (engine/arg_utils.py's ParallelConfig group, config/parallel.py) an engine's world size is pp * tp * pcp and data
# parallel starts one engine per rank, so these want more GPUs than the pod has ("World size ... is larger than the
# number of available GPUs" long after admission) or spread one engine over other pods and nodes: the data parallel
# ranks, address, ports, backend and load-balancing modes, the elastic EP bound on DP size, the multi-node master,
# node count and rank, and --headless (the serve parser's: engines without an API server, for secondary nodes).
# --device-ids picks physical GPUs. Not here: -dcp (shares the tp GPUs), -ep, --distributed-executor-backend, and the
# --no-data-parallel-*-lb negations (they set the default).
GPU_SIZING_VLLM_FLAGS: tuple[str, ...] = (
    "--pipeline-parallel-size", "-pp",
    "--prefill-context-parallel-size", "-pcp",
    "--data-parallel-size", "-dp",
    "--data-parallel-size-local", "-dpl",
    "--data-parallel-rank", "-dpn",
    "--data-parallel-start-rank", "-dpr",
    "--data-parallel-address", "-dpa",
    "--data-parallel-rpc-port", "-dpp",
    "--data-parallel-backend", "-dpb",
    "--data-parallel-hybrid-lb", "-dph",
    "--data-parallel-external-lb", "-dpe",
    "--data-parallel-multi-port-external-lb", "-dpm",
    "--elastic-ep-max-dp-size",
    "--nnodes", "-n",
    "--node-rank", "-r",
    "--master-addr",
    "--master-port",
    "--headless",
    "--device-ids",
)
# argparse reads a one-letter short option's value glued on: `-n2` is `--nnodes 2` (no other option starts -n or -r).
GPU_SIZING_GLUED_FLAGS: tuple[str, ...] = tuple(flag for flag in GPU_SIZING_VLLM_FLAGS if len(flag) == 2)
GPU_SIZING_REASON = (
    "a pod runs one vLLM engine on the spec.model.tensorParallelSize GPUs the device plugin gives it; "
    "scale out with replicas"
)


def gpu_sizing_flag_reached(arg: str) -> str | None:
    """The GPU- or node-sizing flag `arg` names in any spelling (as refused_flag_reached reads it), or None."""
    glued = next((flag for flag in GPU_SIZING_GLUED_FLAGS if arg.startswith(flag)), None)
    return glued or _flag_reached(arg, GPU_SIZING_VLLM_FLAGS)


# JSON config flags with a key that sets what a rendered flag sets. vLLM 0.33 refuses the pair at start-up
# ("attention_backend and attention_config.backend are mutually exclusive", vllm/engine/arg_utils.py), and
# takes a user's `backend_per_kind.mla_attention` over the MLA backend the operator renders in that map,
# silently. A whole JSON value may carry the keys, so only the dotted form `--attention-config.KEY=VALUE` of
# other keys passes; its first key is compared as vLLM's parser passes it on: verbatim, without a list `+`.
_ATTENTION_KEYS = ("backend", "backend_per_kind")
OWNED_CONFIG_KEYS: dict[str, tuple[str, ...]] = {"--attention-config": _ATTENTION_KEYS, "-ac": _ATTENTION_KEYS}


def owned_config_key_reached(arg: str) -> tuple[str, str | None] | None:
    """(JSON config flag, its owned key or None for a whole JSON value) that `arg` sets, or None."""
    if not arg.startswith("-"):
        return None
    key = vllm_option_key(arg)
    flag = next((flag for flag in OWNED_CONFIG_KEYS if flag.startswith(key)), None)
    if flag is None:
        return None
    path = arg.split("=", 1)[0].split(".")
    if len(path) == 1:
        return flag, None
    first = path[1].removesuffix("+")
    return (flag, first) if first in OWNED_CONFIG_KEYS[flag] else None


MAX_K = 16

# The two names of the GPUs a ROCm process sees: vLLM reads both, so the operator sets both from one value and the
# API refuses two plain values that differ (api/spec.py, decisions/runtime_env.py).
VISIBLE_DEVICES = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
VISIBLE_DEVICES_DIFFER = (
    "spec.runtime.env: HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES differ; vLLM on ROCm needs them equal"
)
