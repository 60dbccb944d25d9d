"""`spec.placement`: allowed gfx targets, node constraints and tolerations of the runtime pods."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from specdec_operator.api.base import ApiModel, cel
from specdec_operator.api.kubeformats import (
    IMAGE_REFERENCE,
    LABEL_VALUE,
    QUALIFIED_NAME,
    check_keys,
    formatted,
    keys_rule,
)
from specdec_operator.api.vocabulary import GFX_PRODUCTS, GfxTargetOrProduct, PartitionMode, gfx_of
from specdec_operator.gpu.inventory import AMD_TRANSIENT_TAINTS

_EXISTS_WITHOUT_VALUE = "spec.placement.tolerations[].value must be empty when operator is Exists"
_SECONDS_NEED_NO_EXECUTE = "spec.placement.tolerations[].tolerationSeconds requires effect NoExecute"
# The API server refuses a keyless toleration whose operator is not Exists (core/v1 ValidateTolerations): the
# Deployment would be refused, so admission says so first.
_KEY_OR_EXISTS = "spec.placement.tolerations[].key is required unless operator is Exists"
# Runtime pods never tolerate AMD's transient GPU taints (a sick or upgrading GPU is no place for inference), and a
# keyless Exists matches those too while Kubernetes cannot say "every taint but these". Admitted, either would be
# dropped from the pods without a word, so admission refuses both and says what to write instead.
_TRANSIENT_TAINTS_TEXT = ", ".join(AMD_TRANSIENT_TAINTS)
_KEYLESS_EXISTS = ("spec.placement.tolerations[].key is required: a keyless Exists toleration matches every taint, "
                   f"AMD's transient GPU taints ({_TRANSIENT_TAINTS_TEXT}) included, and runtime pods never tolerate "
                   "those; name each taint key to tolerate")
_TRANSIENT_TAINT = ("spec.placement.tolerations[].key must not be one of AMD's transient GPU taints "
                    f"({_TRANSIENT_TAINTS_TEXT}): a node that carries one has a sick or upgrading GPU, and runtime "
                    "pods never go there")
_CEL_TRANSIENT_TAINTS = "[" + ", ".join(f"'{taint}'" for taint in AMD_TRANSIENT_TAINTS) + "]"


class Toleration(ApiModel):
    """A pod toleration (same fields as core/v1 Toleration)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                    _EXISTS_WITHOUT_VALUE),
                cel("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                    _SECONDS_NEED_NO_EXECUTE),
                cel("has(self.key) || (has(self.operator) && self.operator == 'Exists')", _KEY_OR_EXISTS, ".key"),
                cel("has(self.key) || !has(self.operator) || self.operator != 'Exists'", _KEYLESS_EXISTS, ".key"),
                cel(f"!has(self.key) || !(self.key in {_CEL_TRANSIENT_TAINTS})", _TRANSIENT_TAINT, ".key"),
            ]
        }
    )

    key: Annotated[str, *formatted(QUALIFIED_NAME, "spec.placement.tolerations[].key")] | None = Field(
        default=None, description="Taint key. Required: a keyless Exists toleration would match AMD's transient GPU "
        "taints, which runtime pods never tolerate."
    )
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: Annotated[str, *formatted(LABEL_VALUE, "spec.placement.tolerations[].value")] | None = Field(
        default=None, description="Taint value for operator Equal."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(default=None, description="How long a NoExecute taint is tolerated.")

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError(_EXISTS_WITHOUT_VALUE)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(_SECONDS_NEED_NO_EXECUTE)
        if self.key is None and self.operator != "Exists":
            raise ValueError(_KEY_OR_EXISTS)
        if self.key is None:
            raise ValueError(_KEYLESS_EXISTS)
        if self.key in AMD_TRANSIENT_TAINTS:
            raise ValueError(_TRANSIENT_TAINT)
        return self


_NODE_SELECTOR = "spec.placement.nodeSelector"
_ONE_REPLICA_FIELD = "spec.placement: set replicasPerPool or totalReplicas, not both"
_GFX_TARGETS_UNIQUE = ("spec.placement.gfxTargets must not repeat a target (a product names its gfx target: "
                       "mi300x and mi325x are both gfx942)")
# CEL: the gfx target of an entry, a product alias resolved through the same table as gfx_of().
_CEL_PRODUCTS = "{" + ", ".join(f"'{product}': '{gfx}'" for product, gfx in GFX_PRODUCTS.items()) + "}"


def _cel_gfx(variable: str) -> str:
    return f"({variable} in {_CEL_PRODUCTS} ? {_CEL_PRODUCTS}[{variable}] : {variable})"

_POOL_TARGET = "spec.placement.pools[].gfxTarget must be one of spec.placement.gfxTargets, spelled the same way"
_POOL_UNIQUE = "spec.placement.pools must not name a gfx target twice"
_POOL_REPLICAS_WITH_TOTAL = ("spec.placement.pools[].replicas cannot be set with totalReplicas: the total is split "
                             "by capacity and the per-pool bounds")
_BOUNDS_NEED_TOTAL = ("spec.placement.minReplicasPerPool and maxReplicasPerPool bound how totalReplicas is split: "
                      "set totalReplicas (or scale the model) to use them")
_BOUNDS_ORDER = "spec.placement.maxReplicasPerPool must not be below minReplicasPerPool"


class PoolSettings(ApiModel):
    """What one gfx target's pool runs differently from the model's other pools (spec.placement.pools[])."""

    gfx_target: GfxTargetOrProduct = Field(
        description="The pool's gfx target or product, as spelled in spec.placement.gfxTargets."
    )
    tensor_parallel_size: Literal[1, 2, 4, 8] | None = Field(
        default=None,
        description="GPUs per replica in this pool (default spec.model.tensorParallelSize): the same model may need "
        "TP4 on 64 GiB GPUs and TP2 on 192 GiB ones.",
    )
    image: Annotated[str, *formatted(IMAGE_REFERENCE, "spec.placement.pools[].image")] | None = Field(
        default=None,
        description="This pool's runtime image (default spec.runtime.image, else the operator's image for the target).",
    )
    replicas: int | None = Field(
        default=None, ge=0, le=1000,
        description="This pool's replicas (default replicasPerPool); not with totalReplicas.",
    )


class Placement(ApiModel):
    """Where runtime pods may run: one pool per allowed gfx target that has capacity."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("!(has(self.replicasPerPool) && has(self.totalReplicas))", _ONE_REPLICA_FIELD),
                cel(f"self.gfxTargets.all(g, self.gfxTargets.exists_one(h, {_cel_gfx('h')} == {_cel_gfx('g')}))",
                    _GFX_TARGETS_UNIQUE),
                cel("!(has(self.minReplicasPerPool) || has(self.maxReplicasPerPool)) || has(self.totalReplicas)",
                    _BOUNDS_NEED_TOTAL),
                cel("!has(self.minReplicasPerPool) || !has(self.maxReplicasPerPool) "
                    "|| self.maxReplicasPerPool >= self.minReplicasPerPool", _BOUNDS_ORDER),
                cel("!has(self.pools) || self.pools.all(p, p.gfxTarget in self.gfxTargets)", _POOL_TARGET),
                cel("!has(self.pools) || self.pools.all(p, self.pools.exists_one(q, q.gfxTarget == p.gfxTarget))",
                    _POOL_UNIQUE),
                cel("!has(self.totalReplicas) || !has(self.pools) || self.pools.all(p, !has(p.replicas))",
                    _POOL_REPLICAS_WITH_TOTAL),
            ]
        }
    )

    gfx_targets: list[GfxTargetOrProduct] = Field(
        min_length=1, max_length=9,
        description="Allowed AMD gfx targets, in preference order: gfx names (gfx942) or products (mi300x, mi250x, "
        "mi355x, w7900, ...). A product selects its gfx target's pool, which also takes that target's other "
        "products; status.pools[].products lists the GPUs found.",
    )
    partition: PartitionMode | None = Field(
        default=None, description="Required GPU compute/memory partition mode, e.g. cpx_nps4."
    )
    node_selector: Annotated[
        dict[str, Annotated[str, *formatted(LABEL_VALUE, "spec.placement.nodeSelector values")]],
        Field(json_schema_extra={"x-kubernetes-validations": [keys_rule(QUALIFIED_NAME, _NODE_SELECTOR)]}),
    ] = Field(default_factory=dict, max_length=16, description="Extra node labels runtime pods require.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="Extra tolerations for runtime pods."
    )
    replicas_per_pool: int | None = Field(default=None, ge=0, le=1000, description="Replicas in every pool.")
    total_replicas: int | None = Field(
        default=None, ge=0, le=1000,
        description="Replicas across all pools, split in gfxTargets order by capacity and the per-pool bounds. "
        "The scale subresource sets it (kubectl scale, HorizontalPodAutoscaler, KEDA).",
    )
    min_replicas_per_pool: int | None = Field(
        default=None, ge=0, le=1000,
        description="With totalReplicas: replicas every pool gets first (capacity and the total permitting).",
    )
    max_replicas_per_pool: int | None = Field(
        default=None, ge=1, le=1000,
        description="With totalReplicas: the most replicas one pool takes; the rest go to the next gfx target.",
    )

    pools: list[PoolSettings] = Field(
        default_factory=list, max_length=9,
        description="Per-pool settings, by gfx target: tensor parallelism, image and replicas where one pool "
        "differs from the others.",
    )

    def pool_settings(self, gfx: str) -> PoolSettings | None:
        """The spec.placement.pools entry of the gfx target's pool, if any."""
        return next((pool for pool in self.pools if gfx_of(pool.gfx_target) == gfx), None)

    @property
    def targets(self) -> list[str]:
        """gfxTargets as gfx targets, product aliases resolved, in preference order."""
        return [gfx_of(target) for target in self.gfx_targets]

    @model_validator(mode="after")
    def _consistent(self) -> Placement:
        if self.replicas_per_pool is not None and self.total_replicas is not None:
            raise ValueError(_ONE_REPLICA_FIELD)
        bounded = self.min_replicas_per_pool is not None or self.max_replicas_per_pool is not None
        if bounded and self.total_replicas is None:
            raise ValueError(_BOUNDS_NEED_TOTAL)
        if (self.min_replicas_per_pool is not None and self.max_replicas_per_pool is not None
                and self.max_replicas_per_pool < self.min_replicas_per_pool):
            raise ValueError(_BOUNDS_ORDER)
        if len(set(self.targets)) < len(self.targets):
            raise ValueError(_GFX_TARGETS_UNIQUE)
        if any(pool.gfx_target not in self.gfx_targets for pool in self.pools):
            raise ValueError(_POOL_TARGET)
        if len({pool.gfx_target for pool in self.pools}) < len(self.pools):
            raise ValueError(_POOL_UNIQUE)
        if self.total_replicas is not None and any(pool.replicas is not None for pool in self.pools):
            raise ValueError(_POOL_REPLICAS_WITH_TOTAL)
        check_keys(QUALIFIED_NAME, _NODE_SELECTOR, self.node_selector)
        return self


