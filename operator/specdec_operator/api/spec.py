"""`SpeculativeModel.spec`: what a platform team declares (and keeps in Git)."""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from specdec_operator.api.base import ApiModel, cel
from specdec_operator.api.kubeformats import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    IMAGE_REFERENCE,
    MODEL_REFERENCE,
    SIMULATOR_PROFILE,
    format_message,
    formatted,
)
from specdec_operator.api.model import SecretKeyRef as SecretKeyRef
from specdec_operator.api.model import TargetModel
from specdec_operator.api.model import WeightsSource as WeightsSource
from specdec_operator.api.placement import Placement
from specdec_operator.api.placement import Toleration as Toleration
from specdec_operator.api.pod import HF_HOME, HF_TOKEN, EnvVar, PodOverlay, Resources, WeightsCache
from specdec_operator.api.vocabulary import (
    GPU_SIZING_GLUED_FLAGS,
    GPU_SIZING_REASON,
    GPU_SIZING_VLLM_FLAGS,
    MAX_K,
    METHODS_REQUIRING_MODEL,
    METHODS_WITHOUT_MODEL,
    OWNED_CONFIG_KEYS,
    OWNED_VLLM_FLAGS,
    REFUSED_METHODS,
    REFUSED_VLLM_FLAGS,
    VISIBLE_DEVICES,
    VISIBLE_DEVICES_DIFFER,
    SpeculativeMethod,
    gpu_sizing_flag_reached,
    owned_config_key_reached,
    refused_flag_reached,
    vllm_accepts_k,
    vllm_option_key,
)


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


PROMPT_LOOKUP_METHODS = ("ngram", "ngram_gpu")
_PROMPT_LOOKUP_ONLY_NGRAM = "spec.drafters[].promptLookupMin/Max apply only to methods ngram and ngram_gpu"
_EXTRACT_HIDDEN_STATES = (
    f"spec.drafters[].method extract_hidden_states is refused: {REFUSED_METHODS['extract_hidden_states']}"
)
_MTP_NEEDS_LAYERS = (
    "spec.drafters[].mtpLayers is required for method mtp: the target's MTP layer count "
    "(num_nextn_predict_layers in its config.json); vLLM refuses mtp on a target without MTP layers"
)
_MTP_LAYERS_ONLY_MTP = "spec.drafters[].mtpLayers applies only to method mtp"
# vLLM imports `module.Class` from the model field when the proposer starts, and refuses anything else.
_IMPORT_PATH = r"^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)+$"
_CUSTOM_CLASS_PATH = (
    "spec.drafters[].model must be the dotted import path of a proposer class (e.g. my_module.MyProposer) "
    "for method custom_class"
)
_DRAFTER_MODEL = format_message(MODEL_REFERENCE, "spec.drafters[].model")
# choose_drafter takes the first entry that is supported and fits, and both depend on method and model only.
_DRAFTERS_DISTINCT = "spec.drafters must not list the same method and model twice: only the first could ever be chosen"
# An empty list would silently run the ngram fallback at initialK, which is not what "no drafters" reads as.
_DRAFTERS_EMPTY = (
    "spec.drafters must list at least one drafter: leave it out for the ngram default, or set "
    "spec.speculation.initialK and maxK to 0 to turn speculation off"
)
_CEL_DRAFTERS_DISTINCT = (
    "self.all(d, self.exists_one(e, e.method == d.method && has(e.model) == has(d.model) "
    "&& (!has(e.model) || e.model == d.model)))"
)


class Drafter(ApiModel):
    """One drafter preference. The first that is supported on a pool's gfx target and fits in memory wins."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!(self.method in {_cel_list(METHODS_REQUIRING_MODEL)}) || has(self.model)",
                    "spec.drafters[].model is required for methods draft_model, eagle, eagle3, dflash, dspark "
                    "and custom_class",
                ),
                cel(
                    f"!(self.method in {_cel_list(METHODS_WITHOUT_MODEL)}) || !has(self.model)",
                    "spec.drafters[].model must not be set for methods ngram, ngram_gpu and suffix",
                ),
                cel(
                    "!has(self.promptLookupMin) || !has(self.promptLookupMax) "
                    "|| self.promptLookupMin <= self.promptLookupMax",
                    "spec.drafters[].promptLookupMin must not exceed promptLookupMax",
                ),
                cel(
                    "(!has(self.promptLookupMin) && !has(self.promptLookupMax)) "
                    f"|| self.method in {_cel_list(PROMPT_LOOKUP_METHODS)}",
                    _PROMPT_LOOKUP_ONLY_NGRAM,
                ),
                cel("self.method != 'extract_hidden_states'", _EXTRACT_HIDDEN_STATES),
                cel("self.method != 'mtp' || has(self.mtpLayers)", _MTP_NEEDS_LAYERS),
                cel("!has(self.mtpLayers) || self.method == 'mtp'", _MTP_LAYERS_ONLY_MTP),
                cel(
                    f"self.method != 'custom_class' || !has(self.model) || self.model.matches('{_IMPORT_PATH}')",
                    _CUSTOM_CLASS_PATH,
                ),
                cel(
                    f"self.method == 'custom_class' || !has(self.model) || ({MODEL_REFERENCE.cel('self.model')})",
                    _DRAFTER_MODEL,
                ),
            ]
        }
    )

    method: SpeculativeMethod = Field(description="vLLM 0.33 speculative method.")
    model: str | None = Field(
        default=None,
        max_length=512,  # bounds the cost of the CEL rules on it
        description="Drafter checkpoint (Hugging Face repo id or absolute path), or for custom_class the "
        "proposer's import path.",
    )
    draft_tensor_parallel_size: Literal[1, 2, 4, 8] | None = Field(
        default=None, description="Drafter TP: 1, or the target's TP (vLLM's draft_tensor_parallel_size)."
    )
    prompt_lookup_min: int | None = Field(
        default=None, ge=1, le=32, description="n-gram: shortest match to draft from."
    )
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=32, description="n-gram: longest match to draft from.")
    weights_gib: float | None = Field(
        default=None, ge=0, description="Size of the drafter weights in GiB; estimated from the name when absent."
    )
    mtp_layers: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="mtp: MTP layers in the target checkpoint (num_nextn_predict_layers in its config.json). "
        "Required for method mtp; vLLM accepts a K up to it or a multiple of it, and the tuner stays there.",
    )

    @model_validator(mode="after")
    def _model_matches_method(self) -> Drafter:
        if self.method in REFUSED_METHODS:
            raise ValueError(_EXTRACT_HIDDEN_STATES)
        if self.method == "mtp" and self.mtp_layers is None:
            raise ValueError(_MTP_NEEDS_LAYERS)
        if self.method != "mtp" and self.mtp_layers is not None:
            raise ValueError(_MTP_LAYERS_ONLY_MTP)
        if self.method == "custom_class" and self.model is not None and not re.fullmatch(_IMPORT_PATH, self.model):
            raise ValueError(_CUSTOM_CLASS_PATH)
        if self.method in METHODS_REQUIRING_MODEL and self.model is None:
            raise ValueError(f"spec.drafters[].model is required for method {self.method}")
        if self.method in METHODS_WITHOUT_MODEL and self.model is not None:
            raise ValueError(f"spec.drafters[].model must not be set for method {self.method}")
        if self.method != "custom_class" and self.model is not None and not MODEL_REFERENCE.valid(self.model):
            raise ValueError(_DRAFTER_MODEL)
        if (
            self.prompt_lookup_min is not None
            and self.prompt_lookup_max is not None
            and self.prompt_lookup_min > self.prompt_lookup_max
        ):
            raise ValueError("spec.drafters[].promptLookupMin must not exceed promptLookupMax")
        has_lookup = self.prompt_lookup_min is not None or self.prompt_lookup_max is not None
        if has_lookup and self.method not in PROMPT_LOOKUP_METHODS:
            raise ValueError(_PROMPT_LOOKUP_ONLY_NGRAM)
        return self


class Autotune(ApiModel):
    """How the operator re-tunes K from live acceptance counters."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.objective != 'Latency' || has(self.tpotTargetMs)",
                    "spec.speculation.autotune.tpotTargetMs is required when objective is Latency",
                )
            ]
        }
    )

    enabled: bool = Field(
        default=True,
        description="Re-tune K from live metrics. When false, the tuner stops and each pool keeps the K it runs "
        "(status.pools[].effectiveK, clamped into [minK, maxK]); a new pool starts at initialK.",
    )
    interval_seconds: int = Field(default=60, ge=5, le=86400, description="Seconds between tuning evaluations.")
    min_samples: int = Field(
        default=2000, ge=1, description="Drafts a pool must have observed at its current K before K may change."
    )
    min_gain: float = Field(
        default=0.03,
        ge=0,
        le=1,
        description="Smallest predicted relative gain of the objective worth a K change, on top of the restart's "
        "measured cost (the pool's pod start-to-Ready time and the capacity its rollout takes out, over the time "
        "the new K is expected to hold), which every decision's reason states.",
    )
    cooldown_seconds: int = Field(
        default=600, ge=0, description="Minimum seconds between two K changes of the same model (restarts cost)."
    )
    objective: Literal["Throughput", "Latency"] = Field(
        default="Throughput",
        description="Throughput: maximise generated tokens/s per GPU. Latency: maximise tokens/s subject to "
        "the time-per-output-token target.",
    )
    tpot_target_ms: float | None = Field(
        default=None, gt=0, description="Time-per-output-token target in ms (objective Latency)."
    )

    @model_validator(mode="after")
    def _latency_needs_target(self) -> Autotune:
        if self.objective == "Latency" and self.tpot_target_ms is None:
            raise ValueError("spec.speculation.autotune.tpotTargetMs is required when objective is Latency")
        return self


class Speculation(ApiModel):
    """Bounds of the proposal length K. The operator keeps the effective K (in status) within them."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.minK <= self.maxK", "spec.speculation.minK must be <= spec.speculation.maxK"),
                cel(
                    "self.initialK >= self.minK && self.initialK <= self.maxK",
                    "spec.speculation.initialK must lie within [minK, maxK]",
                ),
            ]
        }
    )

    initial_k: int = Field(default=3, ge=0, le=MAX_K, description="K a new pool starts with (0 = speculation off).")
    min_k: int = Field(default=0, ge=0, le=MAX_K, description="Lowest K the tuner may choose (0 = may switch off).")
    max_k: int = Field(default=8, ge=0, le=MAX_K, description="Highest K the tuner may choose (at most 16).")
    autotune: Autotune = Field(default_factory=Autotune, description="Closed-loop tuning policy.")

    @model_validator(mode="after")
    def _bounds_ordered(self) -> Speculation:
        if self.min_k > self.max_k:
            raise ValueError("spec.speculation.minK must be <= spec.speculation.maxK")
        if not self.min_k <= self.initial_k <= self.max_k:
            raise ValueError("spec.speculation.initialK must lie within [minK, maxK]")
        return self


# Names are unique (a list map), so the plain values of the two variables are at most two; nesting two loops over
# the list instead would exceed the rule's cost budget.
_CEL_PLAIN_VISIBLE = (
    f"self.filter(e, e.name in {_cel_list(VISIBLE_DEVICES)} && !has(e.valueFrom)).map(e, has(e.value) ? e.value : '')"
)
_CEL_VISIBLE_DEVICES_EQUAL = f"{_CEL_PLAIN_VISIBLE}.all(v, v == {_CEL_PLAIN_VISIBLE}[0])"

_ATTENTION_CONFIG_CLASH = (
    "spec.runtime.extraArgs may not set --attention-config as a whole nor its backend key, nor backend_per_kind "
    "(in any spelling: -ac, underscores, --attention-config.backend=X, an abbreviation): the operator renders "
    "--attention-backend and the MLA backend per gfx target; set other keys as --attention-config.KEY=VALUE"
)


# The key vLLM resolves an extraArgs element `a` to (vocabulary.vllm_option_key).
_CEL_OPTION_KEY = "a.split('=')[0].split('.')[0].replace('_', '-')"


def _owned_config_keys_cel() -> str:
    """Mirrors vocabulary.owned_config_key_reached, one JSON config flag per clause."""
    key = _CEL_OPTION_KEY
    path = "a.split('=')[0].split('.')"
    clauses = [
        f"!('{flag}'.startsWith({key}) && (size({path}) == 1 || {path}[1].replace('+', '') in {_cel_list(keys)}))"
        for flag, keys in OWNED_CONFIG_KEYS.items()
    ]
    return "!has(self.extraArgs) || self.extraArgs.all(a, !a.startsWith('-') || (" + " && ".join(clauses) + "))"


# Mirrors vocabulary.gpu_sizing_flag_reached; the message expression names the first such argument as given, in the
# words the models use, and the static message is what the API server says should that expression fail.
_CEL_GPU_SIZING = (
    "a.startsWith('-') && ("
    + "".join(f"a.startsWith('{flag}') || " for flag in GPU_SIZING_GLUED_FLAGS)
    + f"{_cel_list(GPU_SIZING_VLLM_FLAGS)}.exists(f, f.startsWith({_CEL_OPTION_KEY})))"
)
_GPU_SIZING_FLAGS = (
    "spec.runtime.extraArgs may not set a flag that sizes vLLM's GPUs or nodes (--pipeline-parallel-size, "
    "--prefill-context-parallel-size, --data-parallel-*, --nnodes, --node-rank, --master-addr, --headless, "
    f"--device-ids, ...) in any spelling: {GPU_SIZING_REASON}"
)
_GPU_SIZING_MESSAGE_EXPRESSION = (
    f"'spec.runtime.extraArgs may not set ' + self.extraArgs.filter(a, {_CEL_GPU_SIZING})[0].split('=')[0] + "
    f"': {GPU_SIZING_REASON}'"
)


class Runtime(ApiModel):
    """How the runtime container is built."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # Mirrors vocabulary.refused_flag_reached: the key vLLM resolves, then argparse's prefixes.
                # Its cost is bounded by extraArgs' maxItems and maxLength.
                cel(
                    "!has(self.extraArgs) || self.extraArgs.all(a, !a.startsWith('-') || "
                    f"!{_cel_list(REFUSED_VLLM_FLAGS)}.exists(f, f.startsWith({_CEL_OPTION_KEY})))",
                    "spec.runtime.extraArgs may not set a flag the operator owns "
                    "(--speculative-config, --port, --host, --served-model-name, -tp, --attention-backend, ...) "
                    "nor --config, in any spelling vLLM accepts: underscores, --flag.key=value or an abbreviation",
                ),
                cel(_owned_config_keys_cel(), _ATTENTION_CONFIG_CLASH),
                {
                    **cel(f"!has(self.extraArgs) || !self.extraArgs.exists(a, {_CEL_GPU_SIZING})", _GPU_SIZING_FLAGS),
                    "messageExpression": _GPU_SIZING_MESSAGE_EXPRESSION,
                },
            ]
        }
    )

    image: Annotated[str, *formatted(IMAGE_REFERENCE, "spec.runtime.image")] | None = Field(
        default=None, description="Image override for every pool (default: per gfx target)."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables (names unique).",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [cel(_CEL_VISIBLE_DEVICES_EQUAL, VISIBLE_DEVICES_DIFFER)],
        },
    )
    extra_args: list[Annotated[str, Field(max_length=512)]] = Field(
        default_factory=list, max_length=64, description="Extra `vllm serve` arguments, passed through as given."
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="Container resources, key by key over the defaults: cpu and memory requests derived from the "
        "weights the pod loads, memory limited to its request (docs/runtime-pods.md).",
    )
    simulate: bool = Field(
        default=False, description="Run the CPU-only vLLM simulator instead of vLLM (staging rehearsals)."
    )
    simulator_profile: Annotated[str, *formatted(SIMULATOR_PROFILE, "spec.runtime.simulatorProfile")] | None = Field(
        default=None,
        description="Simulator profile name (simulate only): sets acceptance, step times and load.",
    )
    pod: PodOverlay = Field(
        default_factory=PodOverlay, description="Pod knobs from an allow-list (docs/runtime-pods.md)."
    )
    weights_cache: WeightsCache | None = Field(
        default=None, description="Shared Hugging Face cache claim, so a new revision starts from cached weights."
    )
    drain_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="How long a pod being replaced or removed may finish the requests it is serving (vLLM's "
        "--shutdown-timeout; 0 aborts them). It stops receiving new requests first: its preStop hook waits "
        "10 s while Services and Gateways drop it, and its terminationGracePeriodSeconds is that wait, this "
        "drain and 30 s for vLLM to exit (docs/runtime-pods.md).",
    )

    @model_validator(mode="after")
    def _no_owned_flags(self) -> Runtime:
        for arg in self.extra_args:
            refused = refused_flag_reached(arg)
            if refused is None:
                continue
            flag = arg.split("=", 1)[0]
            why = "the operator owns it" if refused in OWNED_VLLM_FLAGS else "its file can set any flag"
            if flag != refused:
                how = "reads it as" if vllm_option_key(arg) == refused else "can expand it to"
                why = f"vLLM {how} {refused}, and {why}"
            raise ValueError(f"spec.runtime.extraArgs may not set {flag}: {why}")
        sizing = next((arg for arg in self.extra_args if gpu_sizing_flag_reached(arg)), None)
        if sizing is not None:
            raise ValueError(f"spec.runtime.extraArgs may not set {sizing.split('=', 1)[0]}: {GPU_SIZING_REASON}")
        if any(owned_config_key_reached(arg) for arg in self.extra_args):
            raise ValueError(_ATTENTION_CONFIG_CLASH)
        names = [var.name for var in self.env]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"spec.runtime.env: duplicate name {duplicates[0]}")
        visible = {var.value or "" for var in self.env if var.name in VISIBLE_DEVICES and var.value_from is None}
        if len(visible) > 1:
            raise ValueError(VISIBLE_DEVICES_DIFFER)
        return self


class CanaryStep(ApiModel):
    """One canary step: route `weight` percent to the canary, analyse, then wait `pauseSeconds`."""

    weight: int = Field(ge=1, le=100, description="Percent of traffic (or replicas) on the canary, 1..100.")
    pause_seconds: int = Field(default=60, ge=0, le=86400, description="Analysis window of this step, in seconds.")


class CanaryAnalysis(ApiModel):
    """Thresholds the canary must meet against the stable revision over the same window."""

    min_accepted_length_ratio: float = Field(
        default=0.9, ge=0, le=2,
        description="Canary acceptance / stable, at least this, per draft position both sides draft (accepted "
        "length when per-position counters are missing); at different K the stable's rates are re-weighted to "
        "the canary's K for the same requests. A shortfall fails only when significant.",
    )
    min_tokens_per_second_ratio: float = Field(
        default=0.9, gt=0, le=2,
        description="Canary goodput per running sequence (tokens per request-second, normalised by load) / "
        "stable, at least this; for a tuner K change, at least this times the gain the tuner predicted. A "
        "shortfall fails only when significant.",
    )
    max_tpot_ratio: float = Field(
        default=1.15, ge=1, le=10,
        description="Canary TPOT p90 / stable TPOT p90, at most this; an excess fails only when an always-valid "
        "sequential test on the share of canary requests above this multiple of the stable's p90 makes it "
        "significant.",
    )
    max_tpot_p99_ratio: float = Field(
        default=2.0, ge=1, le=100,
        description="Canary TPOT p99 / stable TPOT p99, at most this (the tail gate); an excess fails only when "
        "significant, as for the p90. The tail passes once it is known: at most 1.5% of the canary's requests "
        "beyond this multiple of the stable's p99 (95% bound, however the histogram buckets are read), which takes "
        "about 120 stable requests.",
    )
    max_error_rate: float = Field(
        default=0.01, ge=0, le=1,
        description="Highest tolerated canary error fraction. A step passes only when the 95% upper confidence "
        "bound of the canary's error rate is below it; it fails when a sequential test proves the rate above it.",
    )
    min_requests: int = Field(
        default=100, ge=1, description="Finished requests each side needs before any verdict but a failure."
    )
    min_drafts: int = Field(
        default=500, ge=0, description="Drafts each side needs before acceptance per position is compared."
    )
    timeout_seconds: int = Field(
        default=900, ge=30, description="A step still inconclusive after this long rolls back."
    )


_RouteNamespace = Annotated[str, *formatted(DNS1123_LABEL, "spec.rollout.canary.traffic.httpRouteRef.namespace")]


class ObjectRef(ApiModel):
    """A reference to a namespaced object."""

    name: Annotated[str, *formatted(DNS1123_SUBDOMAIN, "spec.rollout.canary.traffic.httpRouteRef.name")] = Field(
        description="Object name."
    )
    namespace: _RouteNamespace | None = Field(
        default=None, description="Namespace; defaults to the SpeculativeModel's."
    )


class CanaryTraffic(ApiModel):
    """How canary traffic is split."""

    http_route_ref: ObjectRef | None = Field(
        default=None,
        description="Gateway API HTTPRoute whose backendRefs to our Services the operator weights. "
        "Without it the split is the replica ratio behind the shared Service.",
    )


class InsufficientTraffic(ApiModel):
    """What a canary does when its model gets too few requests to judge it."""

    max_wait_seconds: int = Field(
        default=3600, ge=30, le=604800,
        description="A step that lacks only requests (fewer than minRequests finished) is not rolled back at "
        "analysis.timeoutSeconds: it holds with reason InsufficientTraffic and carries on when traffic comes. "
        "After this long in the step (counted like the timeout), `action` decides.",
    )
    action: Literal["Promote", "RollBack"] = Field(
        default="Promote",
        description="After maxWaitSeconds without enough requests: Promote when the canary's window is clean "
        "(no failed health check or container restart, its error rate within maxErrorRate, no estimate beyond "
        "its limit): the canary goes on to the next step, which judges its own window, or is promoted at the "
        "last step. RollBack otherwise or when set to RollBack. A canary is never rolled back for lack of "
        "requests alone before then.",
    )


class Canary(ApiModel):
    """Canary steps, analysis and traffic."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.steps) || (self.steps.map(s, s.weight).isSorted() && "
                    "self.steps.all(s, self.steps.exists_one(t, t.weight == s.weight)))",
                    "spec.rollout.canary.steps[].weight must strictly increase",
                )
            ]
        }
    )

    steps: list[CanaryStep] = Field(
        default_factory=lambda: [
            CanaryStep(weight=10, pause_seconds=120),
            CanaryStep(weight=50, pause_seconds=120),
            CanaryStep(weight=100, pause_seconds=0),
        ],
        min_length=1,
        max_length=10,
        description="Steps in order; weights strictly increase within 1..100. The last step promotes.",
    )
    analysis: CanaryAnalysis = Field(default_factory=CanaryAnalysis, description="Pass/fail thresholds.")
    traffic: CanaryTraffic = Field(default_factory=CanaryTraffic, description="Traffic split backend.")
    insufficient_traffic: InsufficientTraffic = Field(
        default_factory=InsufficientTraffic,
        description="Quiet models: how long a step waits for requests, and what happens then.",
    )

    @model_validator(mode="after")
    def _weights_increase(self) -> Canary:
        weights = [step.weight for step in self.steps]
        if any(later <= earlier for earlier, later in pairwise(weights)):
            raise ValueError("spec.rollout.canary.steps[].weight must strictly increase")
        return self


_NO_ROLLOUT_BUDGET = (
    "spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0: a new revision could never replace a pod"
)


class Rollout(ApiModel):
    """How a new revision (a spec change or a tuner K change) replaces the old one."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.canary) || !has(self.canary.traffic) || !has(self.canary.traffic.httpRouteRef) "
                    "|| self.strategy == 'Canary'",
                    "spec.rollout.canary.traffic.httpRouteRef requires spec.rollout.strategy Canary",
                ),
                # Both default to 1, so only an explicit pair of zeros trips this.
                cel(
                    "(has(self.maxSurge) ? self.maxSurge : 1) + (has(self.maxUnavailable) ? self.maxUnavailable : 1)"
                    " >= 1",
                    _NO_ROLLOUT_BUDGET,
                ),
            ]
        }
    )

    strategy: Literal["Rolling", "Canary"] = Field(
        default="Rolling", description="Rolling: a Deployment rolling update. Canary: stepped, analysed canary."
    )
    paused: bool = Field(default=False, description="Hold a canary at its current step (analysis keeps running).")
    freeze: bool = Field(
        default=False,
        description="Hold every rollout and K change of this model (a change freeze): Deployments keep the pod "
        "template they run, no canary starts, one in flight keeps its step and route weight, and the tuner records "
        "no K change; Progressing=False (RolloutsFrozen) says what waits. Scaling and pods the kubelet restarts "
        "are not held. Off again, what waited rolls out. The operator setting SPECDEC_FREEZE_ROLLOUTS freezes "
        "every model.",
    )
    canary: Canary | None = Field(
        default=None,
        description="Canary settings (strategy Canary). Omitted with strategy Canary, the default steps and "
        "analysis apply.",
    )
    max_surge: int = Field(
        default=1,
        ge=0,
        le=100,
        description="Replicas a rollout may add beside the serving ones, used only while the pool has that many "
        "free GPU slots (a full pool replaces in place instead). 0 always replaces in place.",
    )
    max_unavailable: int = Field(
        default=1,
        ge=0,
        le=100,
        description="Replicas a rollout may take out of service at once when the pool has no free GPUs for a surge "
        "replica (replace in place; a canary then takes its replicas out of the stable set). 0 never does: a "
        "rollout on a full pool then waits for free GPUs and reports the Pending pod.",
    )

    @model_validator(mode="before")
    @classmethod
    def _canary_defaults(cls, data: Any) -> Any:
        # `strategy: Canary` alone gets the default steps and analysis, never a canary without thresholds.
        if isinstance(data, dict) and data.get("strategy") == "Canary" and data.get("canary") is None:
            return {**data, "canary": {}}
        return data

    @model_validator(mode="after")
    def _route_needs_canary(self) -> Rollout:
        if self.canary and self.canary.traffic.http_route_ref and self.strategy != "Canary":
            raise ValueError("spec.rollout.canary.traffic.httpRouteRef requires spec.rollout.strategy Canary")
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError(_NO_ROLLOUT_BUDGET)
        return self


_DRAFT_TP = "spec.drafters[].draftTensorParallelSize must be 1 or spec.model.tensorParallelSize"
_DRAFT_TP_POOLS = ("spec.drafters[].draftTensorParallelSize other than 1 must equal every "
                   "spec.placement.pools[].tensorParallelSize too (vLLM runs a drafter at 1 or the target's TP)")
_MTP_INITIAL_K = (
    "spec.speculation.initialK must be a K vLLM accepts for every mtp drafter: 0, at most its "
    "spec.drafters[].mtpLayers, or a multiple of it"
)
_OWNED_ENV = (
    "spec.runtime.env may not set HF_TOKEN when spec.model.source.hubSecretRef is set, nor HF_HOME when "
    "spec.runtime.weightsCache names a claim: the operator sets them"
)


class SpeculativeModelSpec(ApiModel):
    """A target model served by vLLM with speculative decoding on AMD GPUs, and how it is tuned and rolled out."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # vLLM refuses any other drafter TP at start-up; admission says so first.
                cel(
                    "!has(self.drafters) || self.drafters.all(d, !has(d.draftTensorParallelSize) "
                    "|| d.draftTensorParallelSize == 1 || d.draftTensorParallelSize == "
                    "(has(self.model.tensorParallelSize) ? self.model.tensorParallelSize : 1))",
                    _DRAFT_TP,
                ),
                cel(
                    "!has(self.drafters) || !has(self.placement.pools) || self.drafters.all(d, "
                    "!has(d.draftTensorParallelSize) || d.draftTensorParallelSize == 1 || self.placement.pools.all("
                    "p, !has(p.tensorParallelSize) || p.tensorParallelSize == d.draftTensorParallelSize))",
                    _DRAFT_TP_POOLS,
                ),
                # initialK defaults to 3 when spec.speculation is left out (an absent object is not defaulted).
                cel(
                    "!has(self.drafters) || self.drafters.all(d, d.method != 'mtp' || !has(d.mtpLayers) || "
                    "(has(self.speculation) ? self.speculation.initialK : 3) == 0 || "
                    "(has(self.speculation) ? self.speculation.initialK : 3) <= d.mtpLayers || "
                    "(has(self.speculation) ? self.speculation.initialK : 3) % d.mtpLayers == 0)",
                    _MTP_INITIAL_K,
                ),
                cel(
                    "!has(self.runtime) || !has(self.runtime.env) || !self.runtime.env.exists(e, "
                    "(e.name == 'HF_TOKEN' && has(self.model.source) && has(self.model.source.hubSecretRef)) || "
                    "(e.name == 'HF_HOME' && has(self.runtime.weightsCache) && has(self.runtime.weightsCache.claimName)"
                    " && (!has(self.runtime.weightsCache.enabled) || self.runtime.weightsCache.enabled)))",
                    _OWNED_ENV,
                ),
            ]
        }
    )

    model: TargetModel = Field(description="The target model.")
    drafters: list[Drafter] = Field(
        default_factory=lambda: [Drafter(method="ngram")],
        max_length=8,
        description="Drafter preferences, in order, each method and model at most once. Falls back to ngram "
        "(no weights) where none fits.",
        json_schema_extra={
            "x-kubernetes-validations": [cel("self.size() > 0", _DRAFTERS_EMPTY),
                                         cel(_CEL_DRAFTERS_DISTINCT, _DRAFTERS_DISTINCT)]
        },
    )
    speculation: Speculation = Field(default_factory=Speculation, description="Bounds of K and the autotune policy.")
    placement: Placement = Field(description="Allowed gfx targets and node constraints.")
    runtime: Runtime = Field(default_factory=Runtime, description="Runtime container settings.")
    rollout: Rollout = Field(default_factory=Rollout, description="Rollout strategy for new revisions.")

    @model_validator(mode="after")
    def _drafters_listed_once(self) -> SpeculativeModelSpec:
        if not self.drafters:
            raise ValueError(_DRAFTERS_EMPTY)
        chosen = [(drafter.method, drafter.model) for drafter in self.drafters]
        if len(set(chosen)) < len(chosen):
            raise ValueError(_DRAFTERS_DISTINCT)
        return self

    @model_validator(mode="after")
    def _draft_tp_fits_target(self) -> SpeculativeModelSpec:
        allowed = (None, 1, self.model.tensor_parallel_size)
        if any(drafter.draft_tensor_parallel_size not in allowed for drafter in self.drafters):
            raise ValueError(_DRAFT_TP)
        pool_tps = {pool.tensor_parallel_size for pool in self.placement.pools} - {None}
        if any(drafter.draft_tensor_parallel_size not in (None, 1) and pool_tps - {drafter.draft_tensor_parallel_size}
               for drafter in self.drafters):
            raise ValueError(_DRAFT_TP_POOLS)
        initial_k = self.speculation.initial_k
        if any(not vllm_accepts_k(d.method, initial_k, d.mtp_layers) for d in self.drafters if d.method == "mtp"):
            raise ValueError(_MTP_INITIAL_K)
        names = {var.name for var in self.runtime.env}
        cache = self.runtime.weights_cache
        if (HF_TOKEN in names and self.model.source and self.model.source.hub_secret_ref) or (
            HF_HOME in names and cache and cache.enabled and cache.claim_name
        ):
            raise ValueError(_OWNED_ENV)
        return self

    def for_pool(self, gfx: str) -> SpeculativeModelSpec:
        """The spec as the gfx target's pool runs it: its spec.placement.pools entry, if any, in place of the
        model-wide tensor parallelism, image and replicasPerPool. Everything that sizes, places or renders one
        pool reads this, so a pool's settings live in one place."""
        settings = self.placement.pool_settings(gfx)
        if settings is None:
            return self
        update: dict[str, Any] = {}
        if settings.tensor_parallel_size is not None:
            update["model"] = self.model.model_copy(update={"tensor_parallel_size": settings.tensor_parallel_size})
        if settings.image is not None:
            update["runtime"] = self.runtime.model_copy(update={"image": settings.image})
        if settings.replicas is not None:
            update["placement"] = self.placement.model_copy(update={"replicas_per_pool": settings.replicas})
        return self.model_copy(update=update) if update else self

    def tensor_parallel_of(self, gfx: str) -> int:
        """GPUs per replica in the gfx target's pool."""
        return int(self.for_pool(gfx).model.tensor_parallel_size)

    @property
    def tensor_parallel(self) -> dict[str, int]:
        """GPUs per replica of each allowed gfx target's pool."""
        return {gfx: self.tensor_parallel_of(gfx) for gfx in self.placement.targets}
