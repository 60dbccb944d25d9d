"""Desired owned objects for a valid spec: one set per pool, plus the model's Service."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.decisions.legal_k import legal_ks, nearest_legal_k
from specdec_operator.decisions.placement import PlacementPlan, PoolPlan, effective_k
from specdec_operator.decisions.runtime_env import RuntimePlan, plan_runtime
from specdec_operator.reconcile.observed import EvaluationSettings, ObservedModel
from specdec_operator.render import pool as render
from specdec_operator.render.names import pool_name
from specdec_operator.render.service import service


@dataclass(frozen=True)
class DesiredPool:
    plan: PoolPlan
    name: str
    k: int
    runtime: RuntimePlan
    config_map: dict[str, Any]
    deployment: dict[str, Any]
    pdb: dict[str, Any]

    @property
    def revision(self) -> str:
        return render.revision_of(self.deployment["spec"]["template"])


def pool_objects(
    observed: ObservedModel,
    spec: SpeculativeModelSpec,
    plan: PoolPlan,
    k: int,
    settings: EvaluationSettings,
    track: str = "stable",
) -> DesiredPool:
    """Raises RuntimeEnvError when the spec's environment cannot be made consistent."""
    spec = spec.for_pool(plan.gfx)  # the pool's own tensor parallelism and image (spec.placement.pools)
    name = pool_name(observed.name, plan.gfx)
    ctx = render.PoolIdentity(observed.namespace, observed.name, observed.uid, name, plan.gfx)
    if spec.runtime.simulate:
        image = settings.simulator_image
    else:
        image = spec.runtime.image or settings.runtime_images.get(plan.gfx, "")
    targets = settings.image_targets.get(image)
    plain_env = {e.name: e.value for e in spec.runtime.env if e.value_from is None}
    runtime = plan_runtime(plan.gfx, image, targets, plain_env, spec.model.attention)
    assert plan.drafter.drafter is not None  # placement drops pools whose target does not fit
    config = render.with_attention_backend(
        render.runtime_config(spec, plan.drafter.drafter, k),
        runtime.attention_backend,
        runtime.mla_attention_backend,
    )
    config_map = render.config_map(ctx, config)
    template = render.pod_template(
        ctx, spec, runtime, render.PoolTrack(track, k, config_map["metadata"]["name"], render.engine_args(config)),
        targeting=render.NodeTargeting(plan.excluded_nodes, plan.gpu_resource, settings.devices),
        pod_settings=settings.pod,
    )
    return DesiredPool(
        plan=plan,
        name=name,
        k=k,
        runtime=runtime,
        config_map=config_map,
        deployment=render.deployment(ctx, template, plan.replicas, track),
        pdb=render.pod_disruption_budget(ctx),
    )


def desired_pools(
    observed: ObservedModel,
    spec: SpeculativeModelSpec,
    placement: PlacementPlan,
    previous_k: Mapping[str, int],
    settings: EvaluationSettings,
) -> list[DesiredPool]:
    return [
        pool_objects(observed, spec, plan, _pool_k(spec, plan, previous_k.get(pool_name(observed.name, plan.gfx))),
                     settings)
        for plan in placement.pools
    ]


def _pool_k(spec: SpeculativeModelSpec, plan: PoolPlan, previous: int | None) -> int:
    """The previous K clamped into the bounds, then moved to the nearest K vLLM accepts for the pool's drafter
    (a drafter change can leave the old K illegal, e.g. eagle K=5 -> mtp with 2 layers)."""
    bounds = spec.speculation
    k = effective_k(previous, bounds.initial_k, bounds.min_k, bounds.max_k)
    drafter = plan.drafter.drafter
    if drafter is None:
        return k
    legal = legal_ks(drafter.method, drafter.mtp_layers, bounds.min_k, bounds.max_k)
    snapped = nearest_legal_k(k, legal)
    return k if snapped is None else snapped


def model_service(observed: ObservedModel) -> dict[str, Any]:
    return service(observed.namespace, observed.name, observed.uid)
