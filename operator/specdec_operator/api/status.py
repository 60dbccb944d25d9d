"""`SpeculativeModel.status`: what the operator observed and decided. Only the operator writes it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field

from specdec_operator.api.base import ApiModel
from specdec_operator.timestamps import parse_stamp


def _rfc3339(value: str) -> str:
    """Stamps the operator reads back (cooldown, canary step clock) must parse; a hand edit may break them."""
    parse_stamp(value)  # ValueError naming the value: unreadable, or without a time zone
    return value


# Kept a plain string in the CRD schema: the API server stores what it is given, and the operator reports
# an unreadable stamp as a Degraded condition naming the field instead of acting on it.
Timestamp = Annotated[str, AfterValidator(_rfc3339)]

ConditionType = Literal["Ready", "Progressing", "Degraded", "Reduced", "WeightsCached"]


class Condition(ApiModel):
    """A Kubernetes-style condition, keyed by type."""

    type: ConditionType = Field(description="Ready, Progressing, Degraded or Reduced (see docs/troubleshooting.md).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, e.g. NoCompatibleNodes.")
    message: str = Field(default="", description="Human-readable detail, with numbers.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int = Field(default=0, description="metadata.generation this condition reflects.")


class DrafterChoice(ApiModel):
    """The drafter a pool runs, and why."""

    method: str = Field(description="vLLM speculative method.")
    model: str | None = Field(default=None, description="Drafter checkpoint, if any.")
    mtp_layers: int | None = Field(
        default=None, description="mtp: the target's MTP layer count from the spec; bounds the Ks vLLM accepts."
    )
    fallback: bool = Field(default=False, description="True when no preferred drafter fitted and ngram was used.")
    reason: str = Field(default="", description="Why this drafter was chosen, with memory figures.")


class PoolRollout(ApiModel):
    """How the pool's latest revision is rolled out, decided from its free GPUs when the revision appeared."""

    mode: Literal["Surge", "InPlace"] = Field(
        description="Surge: new replicas start beside the serving ones (free GPUs). InPlace: the pool is full, so "
        "serving replicas are replaced (a canary takes its replicas out of the stable set)."
    )
    revision: str = Field(description="The revision this decision is for.")
    max_surge: int = Field(default=0, description="Replicas added at once beside the serving ones.")
    max_unavailable: int = Field(default=0, description="Serving replicas taken out at once.")
    reason: str = Field(default="", description="Why, with the pool's free GPUs.")


class NodesMissing(ApiModel):
    """Nodes a pool was placed on that no longer match, and since when: the pool is held until the grace ends."""

    since: Timestamp = Field(
        description="When the nodes were first seen missing (RFC 3339); the grace (operator setting "
        "nodeMissingGraceSeconds) counts from here, across operator restarts."
    )
    nodes: list[str] = Field(default_factory=list, description="The pool's nodes that are missing or no longer match.")


class PoolStatus(ApiModel):
    """One pool: the replicas of this model on one gfx target."""

    name: str = Field(description="Pool name (also the Deployment name).")
    gfx_target: str = Field(description="AMD gfx target of the pool's nodes.")
    requested_as: list[str] = Field(
        default_factory=list,
        description="The spec.placement.gfxTargets entries (gfx name or product alias) that selected this pool.",
    )
    products: list[str] = Field(
        default_factory=list, description="GPU products on the pool's nodes (from the device table), e.g. MI300X."
    )
    gpu_resource: str = Field(
        default="amd.com/gpu",
        description="Extended resource the pool's pods request: amd.com/gpu, or a partition resource of the AMD "
        "device plugin's mixed strategy such as amd.com/cpx_nps4.",
    )
    drafter: DrafterChoice = Field(description="Drafter in use.")
    effective_k: int = Field(
        description="The pool's K: the tuner's (or spec's) decision, written here first; Deployments are rendered "
        "from this field alone."
    )
    replicas: int = Field(default=0, description="Desired replicas.")
    ready_replicas: int = Field(default=0, description="Ready replicas.")
    revision: str = Field(default="", description="Hash of the pool's stable pod template.")
    image: str = Field(default="", description="Runtime image.")
    nodes: int = Field(default=0, description="Schedulable nodes with this gfx target.")
    node_names: list[str] = Field(
        default_factory=list,
        description="The nodes the pool is placed on; while nodes are missing, the set it waits for.",
    )
    missing: NodesMissing | None = Field(
        default=None,
        description="Set while some of the pool's nodes are missing: the pool keeps its objects, replicas and K "
        "until the grace period from `since` has passed.",
    )
    rollout: PoolRollout | None = Field(default=None, description="Rollout mode of the pool's latest revision.")


class TuningDecision(ApiModel):
    """The tuner's last decision for a pool, with its evidence."""

    id: str = Field(default="", description="Decision id, unique per model; set when the decision is recorded.")
    time: Timestamp = Field(description="When the decision was made (RFC 3339); its cooldown counts from here.")
    pool: str = Field(description="Pool the decision applies to.")
    from_k: int = Field(description="K before.")
    to_k: int = Field(description="K after (equal to fromK when the decision was to hold).")
    action: Literal["Hold", "Change", "Explore"] = Field(description="Hold, Change or Explore.")
    reason: str = Field(description="Why, with numbers.")
    predicted_gain: float = Field(default=0.0, description="Predicted relative gain of the objective.")
    confidence: float = Field(default=0.0, description="Confidence that the gain is positive (0..1).")


class PoolSpeculationStats(ApiModel):
    """Measured speculative-decoding statistics of one pool. The rates are of the drafts at the pool's K since the
    tuner's last evaluation (of every draft at that K the tuner keeps when that interval had none); `drafts` is
    the tuner's evidence, counted since K last changed, so it can stay high while the rates are empty."""

    pool: str = Field(description="Pool name (its K is status.pools[].effectiveK).")
    drafts: int = Field(
        default=0,
        description="Drafts measured at the pool's current K since K last changed (what autotune.minSamples counts).",
    )
    acceptance_rate: float | None = Field(
        default=None,
        description="Accepted / drafted tokens since the tuner's last evaluation (all drafts at this K if none since).",
    )
    mean_accepted_length: float | None = Field(
        default=None, description="1 + accepted tokens per draft (tokens emitted per verification step)."
    )
    per_position_acceptance: list[float] = Field(
        default_factory=list, description="Fraction of drafts whose first i+1 tokens were accepted, per position i."
    )
    tokens_per_second: float | None = Field(default=None, description="Generated tokens/s across the pool.")
    recommended_k: int | None = Field(default=None, description="K the tuner would pick now.")


class RejectedK(ApiModel):
    """A tuner K change whose canary was rolled back: the tuner does not propose it again for the same stable
    revision until its evidence says otherwise (docs/canary.md, "After a rollback")."""

    pool: str = Field(description="Pool the K change was for.")
    k: int = Field(description="The K that failed its canary.")
    stable_revision: str = Field(description="Revision the K change started from; the record applies to it only.")
    time: Timestamp = Field(description="When the canary was rolled back (RFC 3339).")
    predicted_gain: float = Field(default=0.0, description="Gain the tuner had predicted for the failed change.")
    reason: str = Field(default="", description="The verdict's reason, e.g. TPOTExceeded.")


class SpeculationStatus(ApiModel):
    """Speculative-decoding statistics and the tuner's last decision.

    The statistics are refreshed here at a bounded rate (see statusStatsPeriodSeconds in the operator
    settings); the operator's /metrics carries the fresh numbers."""

    acceptance_rate: float | None = Field(default=None, description="Model-wide accepted / drafted tokens.")
    mean_accepted_length: float | None = Field(default=None, description="Model-wide mean accepted length.")
    tokens_per_second: float | None = Field(default=None, description="Model-wide generated tokens/s.")
    pools: list[PoolSpeculationStats] = Field(default_factory=list, description="Per-pool statistics.")
    last_decision: TuningDecision | None = Field(
        default=None, description="Most recent K change (Change or Explore): the decision record."
    )
    rejected_ks: list[RejectedK] = Field(
        default_factory=list, description="K changes rolled back by their canary, newest last (at most 8)."
    )


class CanaryStatus(ApiModel):
    """State of the canary in flight, durable across operator restarts."""

    pool: str = Field(description="Pool being rolled.")
    stable_revision: str = Field(description="Revision serving before the canary.")
    canary_revision: str = Field(description="Revision under test.")
    step: int = Field(default=0, description="Index of the current step in spec.rollout.canary.steps.")
    weight: int = Field(default=0, description="Percent of traffic on the canary.")
    phase: Literal["Progressing", "Paused", "Promoted", "RolledBack", "Aborted"] = Field(
        description="Progressing, Paused, Promoted, RolledBack or Aborted."
    )
    step_started_at: Timestamp = Field(description="When the current step started (RFC 3339).")
    evidence_since: Timestamp | None = Field(
        default=None,
        description="When the current step's analysis window began, if later than stepStartedAt: an operator "
        "that takes a step over after a failover restarts the window, and the step's pause and timeout count "
        "from here (RFC 3339).",
    )
    canary_k: int | None = Field(default=None, description="K the canary runs, for tuner-driven canaries.")
    decision_id: str | None = Field(
        default=None, description="The tuner decision (status.speculation.lastDecision.id) this canary rolls out."
    )
    verdict: str = Field(default="", description="Last analysis verdict: Pass, Fail or Inconclusive.")
    message: str = Field(default="", description="Last analysis numbers or the rollback reason.")
    hold_reason: str = Field(
        default="",
        description="Why the step holds past its timeout: InsufficientTraffic (too few requests to judge; it "
        "carries on when traffic comes, see spec.rollout.canary.insufficientTraffic). Empty otherwise.",
    )
    stable_tpot_p90_ms: float | None = Field(
        default=None,
        description="The stable's TPOT p90 (ms) in the last step that passed against it: the reference the 100% "
        "step, where the stable serves nothing, is judged against.",
    )
    stable_reference_step: int | None = Field(
        default=None, description="The step (index) whose window stableTpotP90Ms comes from."
    )
    stable_reference_requests: int | None = Field(
        default=None, description="The stable's finished requests in that window: how precisely stableTpotP90Ms "
        "is known (its sampling noise is added to the 100% step's).",
    )
    stable_reference_tokens_per_pod_second: float | None = Field(
        default=None, description="The stable's decode work per pod in that window: generated tokens per "
        "pod-second. The 100% step compares its TPOT with stableTpotP90Ms only while each canary pod generates at "
        "most 1.25x this: an engine step grows with its batch, so a p90 read under more work is no like for like.",
    )


class Summary(ApiModel):
    """Short strings for `kubectl get` columns."""

    drafter: str = Field(default="", description="Drafter(s) in use, per pool.")
    effective_k: str = Field(default="", description="Effective K, per pool.")
    acceptance: str = Field(default="", description="Model-wide acceptance rate.")
    pools: int = Field(default=0, description="Number of pools.")
    canary: str = Field(default="", description="Canary phase and weight, if any.")


class SpeculativeModelStatus(ApiModel):
    """Observed state of a SpeculativeModel."""

    model_config = ConfigDict(frozen=False)

    observed_generation: int = Field(default=0, description="metadata.generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing, Degraded, Reduced.")
    pools: list[PoolStatus] = Field(default_factory=list, description="One entry per pool.")
    speculation: SpeculationStatus = Field(default_factory=SpeculationStatus, description="Measured statistics.")
    canary: CanaryStatus | None = Field(default=None, description="Canary in flight, if any.")
    summary: Summary = Field(default_factory=Summary, description="Strings for printer columns.")
    replicas: int = Field(default=0, description="Replicas placed across all pools (the scale subresource's count).")
    selector: str = Field(
        default="", description="Label selector of the model's runtime pods, for the scale subresource (HPA, KEDA)."
    )
    shard: str | None = Field(
        default=None, description="The operator install (shard) that reconciles this model, when sharded."
    )
    url: str = Field(
        default="",
        description="In-cluster URL of the model's Service (http://<service>.<namespace>.svc:8000, OpenAI API under "
        "/v1), set while the model has pools; clients name the model by its served name.",
    )
