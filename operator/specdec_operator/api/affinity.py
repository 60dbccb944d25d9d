"""`spec.runtime.pod.affinity`: extra scheduling preferences beside the operator's gfx node affinity.

Required node affinity is the operator's (it pins a pool to its gfx target), so only preferred node
terms are allowed here; pod affinity and anti-affinity (spreading replicas, co-locating with a cache)
are open. Keys, values and operators are checked as the API server checks them (ValidateAffinity).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from specdec_operator.api.base import ApiModel, cel
from specdec_operator.api.kubeformats import (
    LABEL_VALUE,
    NODE_SELECTOR_VALUE,
    QUALIFIED_NAME,
    check_keys,
    formatted,
    keys_rule,
)

_NODE = "spec.runtime.pod.affinity.nodeAffinity"
_POD = "spec.runtime.pod.affinity"

_SET_OPERATORS = ("In", "NotIn")
_NODE_VALUES = (
    f"{_NODE}: operators In and NotIn need values, Exists and DoesNotExist take none, Gt and Lt take one integer"
)
_SELECTOR_VALUES = f"{_POD}: labelSelector operators In and NotIn need values, Exists and DoesNotExist take none"


class NodeSelectorRequirement(ApiModel):
    """A node label requirement."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                    "self.operator in ['Gt', 'Lt'] ? has(self.values) && size(self.values) == 1 && "
                    "self.values[0].matches('^-?[0-9]+$') : !has(self.values) || size(self.values) == 0",
                    _NODE_VALUES,
                )
            ]
        }
    )

    key: Annotated[str, *formatted(QUALIFIED_NAME, f"{_NODE} keys")] = Field(description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(description="How to match.")
    values: list[Annotated[str, *formatted(NODE_SELECTOR_VALUE, f"{_NODE} values")]] = Field(
        default_factory=list, max_length=16, description="Values for In, NotIn (any number), Gt, Lt (one integer)."
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> NodeSelectorRequirement:
        if self.operator in _SET_OPERATORS:
            fits = len(self.values) > 0
        elif self.operator in ("Gt", "Lt"):
            fits = len(self.values) == 1 and self.values[0].lstrip("-").isdigit()
        else:
            fits = not self.values
        if not fits:
            raise ValueError(_NODE_VALUES)
        return self


class NodeSelectorTerm(ApiModel):
    """Node label requirements, ANDed."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        min_length=1, max_length=8, description="Requirements, ANDed."
    )


class PreferredNodeTerm(ApiModel):
    """A weighted preference for nodes matching every requirement."""

    weight: int = Field(ge=1, le=100, description="Preference weight, 1..100.")
    preference: NodeSelectorTerm = Field(description="The nodes preferred.")


class NodeAffinity(ApiModel):
    """Preferred node affinity only: the required terms are the operator's gfx rules."""

    preferred_during_scheduling_ignored_during_execution: list[PreferredNodeTerm] = Field(
        default_factory=list, max_length=8, description="Weighted node preferences."
    )


class LabelSelectorRequirement(ApiModel):
    """A pod label requirement."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                    "!has(self.values) || size(self.values) == 0",
                    _SELECTOR_VALUES,
                )
            ]
        }
    )

    key: Annotated[str, *formatted(QUALIFIED_NAME, f"{_POD} labelSelector keys")] = Field(
        description="Pod label key."
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How to match.")
    values: list[Annotated[str, *formatted(LABEL_VALUE, f"{_POD} labelSelector values")]] = Field(
        default_factory=list, max_length=16, description="Values for In and NotIn."
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if (self.operator in _SET_OPERATORS) != bool(self.values):
            raise ValueError(_SELECTOR_VALUES)
        return self


_SELECTOR_LABELS = f"{_POD} labelSelector matchLabels"


class LabelSelector(ApiModel):
    """Pods to be near (affinity) or away from (anti-affinity)."""

    match_labels: Annotated[
        dict[str, Annotated[str, *formatted(LABEL_VALUE, f"{_SELECTOR_LABELS} values")]],
        Field(json_schema_extra={"x-kubernetes-validations": [keys_rule(QUALIFIED_NAME, _SELECTOR_LABELS)]}),
    ] = Field(default_factory=dict, max_length=16, description="Labels every selected pod has.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=8, description="Requirements, ANDed."
    )

    @model_validator(mode="after")
    def _keys(self) -> LabelSelector:
        check_keys(QUALIFIED_NAME, _SELECTOR_LABELS, self.match_labels)
        return self


class PodAffinityTerm(ApiModel):
    """Pods matching the selector, in the same topology domain (node, zone, ...)."""

    topology_key: Annotated[str, *formatted(QUALIFIED_NAME, f"{_POD} topologyKey")] = Field(
        description="Node label that defines the domain, e.g. kubernetes.io/hostname."
    )
    label_selector: LabelSelector = Field(description="Which pods, in the model's namespace.")


class WeightedPodAffinityTerm(ApiModel):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100, description="Preference weight, 1..100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinityRules(ApiModel):
    """Required and preferred pod (anti-)affinity terms."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=8, description="Hard rules."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=8, description="Soft rules."
    )


class ExtraAffinity(ApiModel):
    """Scheduling preferences added to the operator's gfx node affinity."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Preferred node terms only.")
    pod_affinity: PodAffinityRules | None = Field(default=None, description="Be near these pods.")
    pod_anti_affinity: PodAffinityRules | None = Field(
        default=None, description="Stay away from these pods, e.g. spread replicas over nodes."
    )
