"""SpeculativeModel spec: the defaults of a minimal spec, and every Python-side validator, table-driven."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specdec_operator.api.crdgen import build_crd
from specdec_operator.api.spec import Canary, SpeculativeModelSpec
from specdec_operator.api.vocabulary import (
    GFX_TARGETS,
    GPU_SIZING_REASON,
    GPU_SIZING_VLLM_FLAGS,
    OWNED_VLLM_FLAGS,
    REFUSED_METHODS,
    SPECULATIVE_METHODS,
)
from specdec_operator.reconcile.plan import validation_message
from tests.unit.api.specfactories import MINIMAL_WIRE, drafter_wire, spec, spec_wire

MINIMAL_DEFAULTS_GOLDEN: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "tensorParallelSize": 1, "attention": "Standard"},
    "drafters": [{"method": "ngram"}],
    "speculation": {
        "initialK": 3,
        "minK": 0,
        "maxK": 8,
        "autotune": {
            "enabled": True,
            "intervalSeconds": 60,
            "minSamples": 2000,
            "minGain": 0.03,
            "cooldownSeconds": 600,
            "objective": "Throughput",
        },
    },
    "placement": {"gfxTargets": ["gfx942"], "nodeSelector": {}, "tolerations": [], "pools": []},
    "runtime": {
        "env": [],
        "extraArgs": [],
        "resources": {"requests": {}, "limits": {}},
        "simulate": False,
        "pod": {"labels": {}, "annotations": {}, "imagePullSecrets": [], "volumes": []},
        "drainSeconds": 30,
    },
    "rollout": {"strategy": "Rolling", "paused": False, "freeze": False, "maxSurge": 1, "maxUnavailable": 1},
}


def rejection(**overrides: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        SpeculativeModelSpec.model_validate(spec_wire(**overrides))
    return validation_message(caught.value)


def test_minimal_spec_defaults_golden() -> None:
    assert spec().to_wire() == MINIMAL_DEFAULTS_GOLDEN


def test_minimal_spec_round_trips_through_the_wire() -> None:
    parsed = spec()
    assert SpeculativeModelSpec.model_validate(parsed.to_wire()) == parsed


def test_canary_defaults_step_10_50_100_and_promote() -> None:
    canary = Canary()
    assert [(s.weight, s.pause_seconds) for s in canary.steps] == [(10, 120), (50, 120), (100, 0)]
    analysis = canary.analysis
    assert (analysis.min_accepted_length_ratio, analysis.max_tpot_ratio, analysis.max_error_rate) == (0.9, 1.15, 0.01)
    assert canary.traffic.http_route_ref is None


def test_snake_case_names_are_accepted_too() -> None:
    parsed = SpeculativeModelSpec.model_validate(
        {"model": {"name": "m-8B", "tensor_parallel_size": 2}, "placement": {"gfx_targets": ["gfx90a"]}}
    )
    assert parsed.model.tensor_parallel_size == 2


def test_unknown_fields_are_ignored_so_an_older_operator_reads_newer_objects() -> None:
    parsed = SpeculativeModelSpec.model_validate({**MINIMAL_WIRE, "futureField": {"x": 1}})
    assert "futureField" not in parsed.to_wire()


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("k-bounds-unordered", {"speculation": {"minK": 5, "maxK": 4, "initialK": 4}}, "spec.speculation.minK"),
    ("initial-k-below-min", {"speculation": {"minK": 2, "initialK": 1}}, "spec.speculation.initialK"),
    ("initial-k-above-max", {"speculation": {"maxK": 4, "initialK": 5}}, "spec.speculation.initialK"),
    ("max-k-over-16", {"speculation": {"maxK": 17}}, "spec.speculation.maxK"),
    ("initial-k-negative", {"speculation": {"initialK": -1}}, "spec.speculation.initialK"),
    ("eagle3-without-model", {"drafters": [drafter_wire("eagle3")]}, "spec.drafters[].model is required"),
    ("draft-model-without-model", {"drafters": [drafter_wire("draft_model")]}, "spec.drafters[].model is required"),
    ("dflash-without-model", {"drafters": [drafter_wire("dflash")]}, "spec.drafters[].model is required"),
    ("custom-class-without-model", {"drafters": [drafter_wire("custom_class")]}, "spec.drafters[].model is required"),
    ("ngram-with-model", {"drafters": [drafter_wire("ngram", "x/y-1B")]}, "spec.drafters[].model must not be set"),
    ("suffix-with-model", {"drafters": [drafter_wire("suffix", "x/y-1B")]}, "spec.drafters[].model must not be set"),
    (
        "prompt-lookup-min-over-max",
        {"drafters": [drafter_wire("ngram", promptLookupMin=6, promptLookupMax=3)]},
        "spec.drafters[].promptLookupMin",
    ),
    ("prompt-lookup-over-32", {"drafters": [drafter_wire("ngram", promptLookupMax=33)]}, "spec.drafters.0"),
    ("unknown-method-medusa", {"drafters": [drafter_wire("medusa", "x/medusa")]}, "spec.drafters.0.method"),
    ("unknown-method-legacy-mtp-alias", {"drafters": [drafter_wire("deepseek_mtp")]}, "spec.drafters.0.method"),
    ("too-many-drafters", {"drafters": [drafter_wire("ngram")] * 9}, "spec.drafters"),
    ("unknown-gfx-gfx908", {"placement": {"gfxTargets": ["gfx908"]}}, "spec.placement.gfxTargets.0"),
    ("unsupported-gfx1102", {"placement": {"gfxTargets": ["gfx942", "gfx1102"]}}, "spec.placement.gfxTargets.1"),
    ("no-gfx-targets", {"placement": {"gfxTargets": []}}, "spec.placement.gfxTargets"),
    ("tp-not-power-of-two", {"model": {"tensorParallelSize": 3}}, "spec.model.tensorParallelSize"),
    ("tp-over-8", {"model": {"tensorParallelSize": 16}}, "spec.model.tensorParallelSize"),
    ("draft-tp-not-power-of-two", {"drafters": [drafter_wire("ngram", draftTensorParallelSize=3)]}, "spec.drafters.0"),
    ("max-model-len-tiny", {"model": {"maxModelLen": 64}}, "spec.model.maxModelLen"),
    ("target-weights-zero", {"model": {"weightsGib": 0}}, "spec.model.weightsGib"),
    ("attention-unknown-kind", {"model": {"attention": "GQA"}}, "spec.model.attention"),
    ("attention-lower-case", {"model": {"attention": "mla"}}, "spec.model.attention"),
    ("latency-without-tpot", {"speculation": {"autotune": {"objective": "Latency"}}}, "spec.speculation.autotune"),
    ("autotune-interval-too-short", {"speculation": {"autotune": {"intervalSeconds": 1}}}, "spec.speculation"),
    (
        "canary-weights-equal",
        {"rollout": {"strategy": "Canary", "canary": {"steps": [{"weight": 50}, {"weight": 50}]}}},
        "spec.rollout.canary.steps[].weight must strictly increase",
    ),
    (
        "canary-weights-decrease",
        {"rollout": {"strategy": "Canary", "canary": {"steps": [{"weight": 50}, {"weight": 10}]}}},
        "spec.rollout.canary.steps[].weight must strictly increase",
    ),
    (
        "canary-weight-zero",
        {"rollout": {"strategy": "Canary", "canary": {"steps": [{"weight": 0}]}}},
        "spec.rollout.canary.steps.0.weight",
    ),
    (
        "canary-weight-over-100",
        {"rollout": {"strategy": "Canary", "canary": {"steps": [{"weight": 50}, {"weight": 101}]}}},
        "spec.rollout.canary.steps.1.weight",
    ),
    ("canary-no-steps", {"rollout": {"strategy": "Canary", "canary": {"steps": []}}}, "spec.rollout.canary.steps"),
    (
        "httproute-without-canary-strategy",
        {"rollout": {"strategy": "Rolling", "canary": {"traffic": {"httpRouteRef": {"name": "r"}}}}},
        "spec.rollout.canary.traffic.httpRouteRef requires spec.rollout.strategy Canary",
    ),
    ("unknown-strategy", {"rollout": {"strategy": "BlueGreen"}}, "spec.rollout.strategy"),
    (
        "rollout-budget-both-zero",
        {"rollout": {"maxSurge": 0, "maxUnavailable": 0}},
        "spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0",
    ),
    ("rollout-max-unavailable-negative", {"rollout": {"maxUnavailable": -1}}, "spec.rollout.maxUnavailable"),
    ("rollout-max-surge-over-100", {"rollout": {"maxSurge": 101}}, "spec.rollout.maxSurge"),
    ("replicas-negative", {"placement": {"replicasPerPool": -1}}, "spec.placement.replicasPerPool"),
    ("unknown-partition", {"placement": {"partition": "xpx_nps9"}}, "spec.placement.partition"),
    ("toleration-bad-effect", {"placement": {"tolerations": [{"effect": "Never"}]}}, "spec.placement.tolerations.0"),
    ("env-without-name", {"runtime": {"env": [{"name": ""}]}}, "spec.runtime.env[].name"),
    ("missing-model-name", {"model": {"name": None}}, "spec.model.name"),
    # vLLM 0.33 cannot serve these (tests/contract shows its refusal for each).
    (
        "extract-hidden-states",
        {"drafters": [drafter_wire("extract_hidden_states")], "speculation": {"initialK": 1, "minK": 1, "maxK": 1}},
        "spec.drafters[].method extract_hidden_states is refused",
    ),
    ("mtp-without-layers", {"drafters": [drafter_wire("mtp")]}, "spec.drafters[].mtpLayers is required for method mtp"),
    ("mtp-layers-on-eagle", {"drafters": [drafter_wire("eagle", "x/e", mtpLayers=1)]}, "applies only to method mtp"),
    ("mtp-layers-zero", {"drafters": [drafter_wire("mtp", mtpLayers=0)]}, "spec.drafters.0.mtpLayers"),
    (
        "mtp-initial-k-not-divisible",
        {"drafters": [drafter_wire("mtp", mtpLayers=2)], "speculation": {"initialK": 3}},
        "spec.speculation.initialK must be a K vLLM accepts for every mtp drafter",
    ),
]


@pytest.mark.parametrize(("overrides", "field"), [(o, f) for _, o, f in INVALID], ids=[i for i, _, _ in INVALID])
def test_invalid_spec_is_rejected_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    assert field in rejection(**overrides)


@pytest.mark.parametrize("flag", OWNED_VLLM_FLAGS)
@pytest.mark.parametrize("form", ["bare", "with-value"])
def test_extra_args_may_not_set_an_owned_flag(flag: str, form: str) -> None:
    arg = flag if form == "bare" else f"{flag}=1"
    message = rejection(runtime={"extraArgs": ["--gpu-memory-utilization=0.9", arg]})
    assert message == f"spec.runtime.extraArgs may not set {flag}: the operator owns it"


def test_missing_placement_is_rejected() -> None:
    with pytest.raises(ValidationError) as caught:
        SpeculativeModelSpec.model_validate({"model": {"name": "m-8B"}})
    assert validation_message(caught.value) == "spec.placement: Field required"


def draft_tp(size: int) -> dict[str, Any]:
    return drafter_wire("eagle3", "x/eagle3-8B", draftTensorParallelSize=size)


VALID: list[tuple[str, dict[str, Any]]] = [
    ("speculation-off", {"speculation": {"initialK": 0, "minK": 0, "maxK": 0}}),
    ("k-16", {"speculation": {"initialK": 16, "minK": 16, "maxK": 16}}),
    ("tp-8", {"model": {"tensorParallelSize": 8}}),
    ("every-gfx-target", {"placement": {"gfxTargets": list(GFX_TARGETS)}}),
    ("ngram-with-lookup", {"drafters": [drafter_wire("ngram", promptLookupMin=2, promptLookupMax=5)]}),
    ("equal-lookup-bounds", {"drafters": [drafter_wire("ngram_gpu", promptLookupMin=4, promptLookupMax=4)]}),
    ("mtp-without-model", {"drafters": [drafter_wire("mtp", mtpLayers=1)]}),
    ("mla-target-with-mtp", {"model": {"attention": "MLA"}, "drafters": [drafter_wire("mtp", mtpLayers=1)]}),
    ("mla-target-with-eagle3", {"model": {"attention": "MLA"}, "drafters": [drafter_wire("eagle3", "x/eagle3")]}),
    ("mtp-with-model", {"drafters": [drafter_wire("mtp", "x/mtp-head", mtpLayers=1)]}),
    ("latency-with-target", {"speculation": {"autotune": {"objective": "Latency", "tpotTargetMs": 30}}}),
    ("single-canary-step", {"rollout": {"strategy": "Canary", "canary": {"steps": [{"weight": 100}]}}}),
    ("canary-with-route", {"rollout": {"strategy": "Canary", "canary": {"traffic": {"httpRouteRef": {"name": "r"}}}}}),
    ("unowned-extra-args", {"runtime": {"extraArgs": ["--gpu-memory-utilization=0.9", "--portable", "-O3"]}}),
    ("weights-source-pvc", {"model": {"source": {"pvcName": "models", "path": "llama"}}}),
    ("total-replicas", {"placement": {"totalReplicas": 5}}),
    ("total-replicas-bounded", {"placement": {"totalReplicas": 5, "minReplicasPerPool": 1, "maxReplicasPerPool": 4}}),
    ("zero-replicas", {"placement": {"replicasPerPool": 0}}),
    ("distinct-gfx-targets", {"placement": {"gfxTargets": ["gfx942", "gfx90a"]}}),
    ("weights-source-hub", {"model": {"source": {"hubSecretRef": {"name": "hf"}}}}),
    ("draft-tp-equals-target", {"model": {"tensorParallelSize": 4}, "drafters": [draft_tp(4)]}),
    ("draft-tp-1-under-tp-4", {"model": {"tensorParallelSize": 4}, "drafters": [draft_tp(1)]}),
    ("one-drafter-model-two-methods",
     {"drafters": [drafter_wire("eagle", "x/head-8B"), drafter_wire("eagle3", "x/head-8B")]}),
    ("one-method-two-models", {"drafters": [drafter_wire("eagle3", "x/a-8B"), drafter_wire("eagle3", "x/b-8B"),
                                            drafter_wire("ngram"), drafter_wire("ngram_gpu")]}),
]


@pytest.mark.parametrize("overrides", [o for _, o in VALID], ids=[i for i, _ in VALID])
def test_valid_spec_parses(overrides: dict[str, Any]) -> None:
    assert spec(**overrides).to_wire()["model"]["name"] == MINIMAL_WIRE["model"]["name"]


@pytest.mark.parametrize("method", [m for m in SPECULATIVE_METHODS if m not in REFUSED_METHODS])
def test_every_vllm_033_method_is_accepted_with_or_without_a_model_as_it_needs(method: str) -> None:
    needs_model = method in ("draft_model", "eagle", "eagle3", "dflash", "dspark", "custom_class")
    extra = {"mtpLayers": 1} if method == "mtp" else {}
    model = "org_drafters.Proposer" if method == "custom_class" else "org/drafter-1B"
    parsed = spec(drafters=[drafter_wire(method, model if needs_model else None, **extra)])
    assert parsed.drafters[0].method == method


# Rules the CRD enforces with CEL at admission, re-checked by the models so that an object that skipped
# admission (an older CRD, a direct etcd restore) gets the same message in status.
CEL_MIRRORED: list[tuple[str, dict[str, Any], str]] = [
    ("pvc-and-hub-secret", {"model": {"source": {"pvcName": "models", "hubSecretRef": {"name": "hf"}}}}, "set either"),
    ("replicas-both-ways", {"placement": {"replicasPerPool": 1, "totalReplicas": 3}}, "not both"),
    ("bounds-without-total", {"placement": {"replicasPerPool": 2, "maxReplicasPerPool": 3}}, "bound how totalReplicas"),
    ("bounds-inverted", {"placement": {"totalReplicas": 4, "minReplicasPerPool": 3, "maxReplicasPerPool": 2}},
     "must not be below"),
    ("repeated-gfx-target", {"placement": {"gfxTargets": ["gfx942", "gfx942"]}}, "must not repeat"),
    ("prompt-lookup-on-eagle", {"drafters": [drafter_wire("eagle", "x/eagle-8B", promptLookupMin=2)]}, "apply only"),
    ("draft-tp-not-1-or-target", {"drafters": [drafter_wire("ngram", draftTensorParallelSize=2)]}, "must be 1 or"),
    ("extract-hidden-states", {"drafters": [drafter_wire("extract_hidden_states")]}, "is not a drafter"),
    ("mtp-without-layers", {"drafters": [drafter_wire("mtp")]}, "mtpLayers is required"),
    ("mtp-layers-on-ngram", {"drafters": [drafter_wire("ngram", mtpLayers=2)]}, "applies only to method mtp"),
    ("mtp-initial-k", {"drafters": [drafter_wire("mtp", mtpLayers=2)], "speculation": {"initialK": 5}}, "multiple"),
    ("custom-class-not-a-path", {"drafters": [drafter_wire("custom_class", "org/proposer")]}, "dotted import path"),
    ("attention-config-backend", {"runtime": {"extraArgs": ["--attention-config.backend=X"]}}, "--attention-backend"),
    # A repeated drafter is never chosen (choose_drafter stops at the first that is supported and fits, and both
    # depend on method and model only); a source path without a claim is never mounted, so vLLM would load
    # spec.model.name instead, silently.
    ("drafter-repeated", {"drafters": [drafter_wire("eagle3", "x/eagle3-8B"), drafter_wire("eagle3", "x/eagle3-8B")]},
     "spec.drafters must not list the same method and model twice"),
    ("ngram-repeated-with-other-windows", {"drafters": [drafter_wire("ngram", promptLookupMax=4),
                                                        drafter_wire("ngram", promptLookupMax=8)]},
     "spec.drafters must not list the same method and model twice"),
    ("drafters-empty", {"drafters": []}, "spec.drafters must list at least one drafter"),
    ("source-path-without-pvc", {"model": {"source": {"path": "org/llama"}}},
     "spec.model.source.path requires spec.model.source.pvcName"),
    ("source-path-with-hub-secret", {"model": {"source": {"path": "org/llama", "hubSecretRef": {"name": "hf"}}}},
     "spec.model.source.path requires spec.model.source.pvcName"),
]


def cel_messages(node: Any) -> list[str]:
    """Every x-kubernetes-validations message in a schema tree."""
    if isinstance(node, list):
        return [message for item in node for message in cel_messages(item)]
    if not isinstance(node, dict):
        return []
    own = [rule["message"] for rule in node.get("x-kubernetes-validations", [])]
    return own + [message for value in node.values() for message in cel_messages(value)]


CEL_MESSAGES = cel_messages(build_crd())


@pytest.mark.parametrize(
    ("overrides", "fragment"), [(o, f) for _, o, f in CEL_MIRRORED], ids=[i for i, _, _ in CEL_MIRRORED]
)
def test_cel_only_rule_is_also_enforced_in_python(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError):
        SpeculativeModelSpec.model_validate(spec_wire(**overrides))
    message = rejection(**overrides)
    assert fragment in message
    assert message in CEL_MESSAGES  # word for word what the API server would have said


# vLLM 0.33's FlexibleArgumentParser rewrites `--a_b` to `--a-b`, sets nested keys from `--json-arg.key=v`
# and pulls any flag from a `--config` YAML file, and argparse expands unambiguous prefixes, so these
# reach owned flags past a literal denylist.
OWNED_FLAG_SPELLINGS = [
    "--speculative_config={}",
    "--speculative-config.num_speculative_tokens=5",
    "--max_model_len=4096",
    "--config=/etc/vllm.yaml",
    "--config",
    "--specul",
    "--speculative_conf.method=ngram",
    "--serv",
    "-t",
    "-sc.method=ngram",
    "--",
]


@pytest.mark.parametrize("arg", OWNED_FLAG_SPELLINGS)
def test_extra_args_may_not_reach_an_owned_flag_by_another_spelling(arg: str) -> None:
    with pytest.raises(ValidationError):
        SpeculativeModelSpec.model_validate(spec_wire(runtime={"extraArgs": [arg]}))
    assert rejection(runtime={"extraArgs": [arg]}).startswith(f"spec.runtime.extraArgs may not set {arg.split('=')[0]}")


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("--speculative_config={}", "vLLM reads it as --speculative-config, and the operator owns it"),
        ("-sc.method=ngram", "vLLM reads it as -sc, and the operator owns it"),
        ("--specul", "vLLM can expand it to --speculative-config, and the operator owns it"),
        ("--config=/etc/vllm.yaml", "its file can set any flag"),
        ("--conf", "vLLM can expand it to --config, and its file can set any flag"),
    ],
)
def test_another_spelling_names_the_owned_flag_it_reaches(arg: str, message: str) -> None:
    flag = arg.split("=")[0]
    assert rejection(runtime={"extraArgs": [arg]}) == f"spec.runtime.extraArgs may not set {flag}: {message}"


@pytest.mark.parametrize(
    "args",
    [
        ["--config-format=yaml", "--max-num-seqs", "256"],
        ["--enable-prefix-caching", "-O3", "--compilation-config.level=3"],
        ["--gpu-memory-utilization", "-1"],  # a negative value is not a flag
        ["--kv-cache-dtype=fp8", "--model-impl", "vllm"],
    ],
)
def test_unowned_flags_pass_through(args: list[str]) -> None:
    assert spec(runtime={"extraArgs": args}).runtime.extra_args == args


# vLLM 0.33 refuses --attention-backend (always rendered) together with attention_config.backend, in every
# spelling its FlexibleArgumentParser accepts; a whole JSON value may carry the key, so it is refused too.
ATTENTION_CONFIG_CLASHES = [
    '--attention-config={"backend":"TRITON_ATTN"}',
    "--attention-config",
    "-ac",
    '-ac={"backend":"TRITON_ATTN"}',
    "--attention-config.backend=TRITON_ATTN",
    "--attention-config.backend",
    "--attention_config.backend=TRITON_ATTN",
    "-ac.backend=TRITON_ATTN",
    "--attention-conf.backend=TRITON_ATTN",
    "--attention-c",
    "--attention_config.backend+=TRITON_ATTN",
    # the map the operator renders the MLA backend in (vLLM takes the user's entry over it)
    "--attention-config.backend_per_kind.mla_attention=TRITON_MLA",
    "--attention_config.backend_per_kind.mla_attention=TRITON_MLA",
    "-ac.backend_per_kind={}",
    "--attention-conf.backend_per_kind+=x",
]


@pytest.mark.parametrize("arg", ATTENTION_CONFIG_CLASHES)
def test_extra_args_may_not_set_the_attention_backend_through_attention_config(arg: str) -> None:
    message = rejection(runtime={"extraArgs": ["--enforce-eager", arg, "{}"]})
    assert message.startswith("spec.runtime.extraArgs may not set --attention-config as a whole nor its backend key")


@pytest.mark.parametrize(
    "args",
    [
        ["--attention-config.flash_attn_version=3"],
        ["-ac.use_prefill_decode_attention", "true"],
        ["--enforce-eager", '{"backend":"x"}'],  # a value, not a flag
    ],
)
def test_other_attention_config_keys_pass_through(args: list[str]) -> None:
    assert spec(runtime={"extraArgs": args}).runtime.extra_args == args


# vLLM 0.33 would want more GPUs than the pod's spec.model.tensorParallelSize (pp * tp * pcp, one engine per data
# parallel rank), or other nodes, or would pick physical GPUs itself: refused whatever the value, in any spelling.
@pytest.mark.parametrize("flag", GPU_SIZING_VLLM_FLAGS)
@pytest.mark.parametrize("form", ["bare", "with-value", "next-value"])
def test_extra_args_may_not_size_the_engines_gpus_or_nodes(flag: str, form: str) -> None:
    args = {"bare": [flag], "with-value": [f"{flag}=1"], "next-value": [flag, "1"]}[form]
    message = rejection(runtime={"extraArgs": ["--gpu-memory-utilization=0.9", *args]})
    assert message == f"spec.runtime.extraArgs may not set {flag}: {GPU_SIZING_REASON}"


GPU_SIZING_SPELLINGS = [
    "--pipeline_parallel_size=2",
    "--pipeline-parallel",  # an abbreviation argparse expands
    "-pp=2",
    "--prefill_context_parallel_size",
    "-pcp=2",
    "--data_parallel_size=2",
    "--data-parallel-size-l",
    "--data_parallel_size_local=1",
    "-dpl=1",
    "--data-parallel-start",
    "--data-parallel-address=10.0.0.1",
    "--data-parallel-rpc",
    "-dpb=ray",
    "--data-parallel-external-lb",
    "--data-parallel-hybrid",
    "--elastic",
    "--nn",
    "-n2",  # argparse reads a one-letter option's value glued on: --nnodes 2
    "-n=2",
    "-r0",
    "--node_rank=1",
    "--master-addr.x=1",
    "--master_port=29500",
    "--headl",
    "--device_ids=0,1",
    "--dev",  # ambiguous for vLLM (--device-memory-utilization too), refused before it starts
]


@pytest.mark.parametrize("arg", GPU_SIZING_SPELLINGS)
def test_extra_args_may_not_size_the_engine_by_another_spelling(arg: str) -> None:
    flag = arg.split("=")[0]
    assert rejection(runtime={"extraArgs": [arg]}) == f"spec.runtime.extraArgs may not set {flag}: {GPU_SIZING_REASON}"


@pytest.mark.parametrize(
    "args",
    [
        ["--decode-context-parallel-size", "2"],  # shares the tensor parallel GPUs: the world size stays tp
        ["-dcp=2", "--dcp-kv-cache-interleave-size", "1"],
        ["--enable-expert-parallel", "-ep"],
        ["--no-data-parallel-external-lb", "--no-data-parallel-hybrid-lb"],  # the defaults
        ["--data-parallel-supervisor-port=9000", "--dp-sync-interval", "4"],
        ["--distributed-executor-backend", "mp", "--enable-elastic-ep", "--numa-bind-nodes", "0"],
        ["--api-server-count", "2", "--max-num-seqs", "256", "-q", "fp8"],
    ],
)
def test_parallel_flags_that_keep_one_engine_on_the_pods_gpus_pass_through(args: list[str]) -> None:
    assert spec(runtime={"extraArgs": args}).runtime.extra_args == args


# The invalid manifests for what vLLM 0.33 refuses at start-up: the models say what admission says.
VLLM_REFUSALS = [
    "extra-arg-attention-config-backend",
    "extra-arg-attention-config-json",
    "extract-hidden-states",
    "mtp-without-layers",
    "mtp-initial-k-not-a-multiple",
    "custom-class-not-an-import-path",
]


def refused_by_the_models(name: str) -> tuple[str, str]:
    """(the `# expect:` line of tests/manifests/invalid/NAME.yaml, the message the models refuse its spec with)."""
    path = Path(__file__).resolve().parents[2] / "manifests" / "invalid" / f"{name}.yaml"
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    with pytest.raises(ValidationError) as caught:
        SpeculativeModelSpec.model_validate(yaml.safe_load(path.read_text())["spec"])
    return expected, validation_message(caught.value)


@pytest.mark.parametrize("name", VLLM_REFUSALS)
def test_invalid_manifest_for_a_vllm_refusal_is_refused_by_the_models_too(name: str) -> None:
    expected, message = refused_by_the_models(name)
    assert message.startswith(expected)
    assert message in CEL_MESSAGES


# Admission names the argument as given (the rule's messageExpression); the models say it in the same words.
GPU_SIZING_MANIFESTS = [
    "extra-arg-pipeline-parallel",
    "extra-arg-data-parallel",
    "extra-arg-device-ids",
    "extra-arg-nnodes-glued",
]


@pytest.mark.parametrize("name", GPU_SIZING_MANIFESTS)
def test_invalid_manifest_for_gpu_sizing_is_refused_by_the_models_in_the_admission_words(name: str) -> None:
    expected, message = refused_by_the_models(name)
    assert message == expected
    assert expected.startswith("spec.runtime.extraArgs may not set -") and expected.endswith(f": {GPU_SIZING_REASON}")


def test_gpu_sizing_message_expression_builds_the_models_words() -> None:
    runtime = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "runtime"
    ]
    [entry] = [e for e in runtime["x-kubernetes-validations"] if "messageExpression" in e]
    assert entry["message"].startswith("spec.runtime.extraArgs may not set a flag that sizes vLLM's GPUs or nodes")
    assert entry["message"].endswith(GPU_SIZING_REASON)
    expression = entry["messageExpression"]
    assert expression.startswith("'spec.runtime.extraArgs may not set ' + self.extraArgs.filter(a, ")
    assert expression.endswith(f")[0].split('=')[0] + ': {GPU_SIZING_REASON}'")
    # the filter is the rule's own predicate, so it names the first argument the rule refuses
    predicate = expression.split("self.extraArgs.filter(a, ", 1)[1].rsplit(")[0].split('=')[0]", 1)[0]
    assert entry["rule"] == f"!has(self.extraArgs) || !self.extraArgs.exists(a, {predicate})"
    assert all(f"'{flag}'" in predicate for flag in GPU_SIZING_VLLM_FLAGS)


def test_attention_defaults_to_standard() -> None:
    assert spec().model.attention == "Standard"
    assert spec(model={"attention": "MLA"}).model.attention == "MLA"
