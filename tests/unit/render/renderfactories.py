"""Render inputs: a pool context, the runtime plan of a gfx target, and the full object set of one pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec_operator.api.spec import Drafter, SpeculativeModelSpec
from specdec_operator.decisions.runtime_env import RuntimePlan, plan_runtime
from specdec_operator.render import pool as render
from specdec_operator.render.names import pool_name
from specdec_operator.render.podspec import DEFAULT_POD_SETTINGS, PodSettings
from specdec_operator.settings import DEFAULT_IMAGE_TARGETS, DEFAULT_IMAGES
from specdec_runtime.config import RuntimeConfig

NAMESPACE = "inference"
MODEL = "llama8b"
UID = "6f1c1d2e-0000-4000-8000-000000000001"


def context(gfx: str = "gfx942", model: str = MODEL) -> render.PoolIdentity:
    return render.PoolIdentity(NAMESPACE, model, UID, pool_name(model, gfx), gfx)


def runtime_plan(
    gfx: str = "gfx942", user_env: dict[str, str] | None = None, attention: str = "Standard"
) -> RuntimePlan:
    image = DEFAULT_IMAGES[gfx]
    return plan_runtime(gfx, image, DEFAULT_IMAGE_TARGETS[image], user_env or {}, attention)


@dataclass(frozen=True)
class RenderedPool:
    config: RuntimeConfig
    config_map: dict[str, Any]
    template: dict[str, Any]
    deployment: dict[str, Any]
    pdb: dict[str, Any]

    @property
    def pod(self) -> dict[str, Any]:
        return self.template["spec"]  # type: ignore[no-any-return]

    @property
    def container(self) -> dict[str, Any]:
        return self.pod["containers"][0]  # type: ignore[no-any-return]


def rendered_pool(
    spec: SpeculativeModelSpec,
    gfx: str = "gfx942",
    k: int | None = None,
    drafter: Drafter | None = None,
    replicas: int = 1,
    track: str = "stable",
    pod_settings: PodSettings = DEFAULT_POD_SETTINGS,
) -> RenderedPool:
    ctx = context(gfx)
    plain_env = {e.name: e.value for e in spec.runtime.env if e.value_from is None}
    runtime = runtime_plan(gfx, plain_env, spec.model.attention)
    config = render.with_attention_backend(
        render.runtime_config(spec, drafter or spec.drafters[0], spec.speculation.initial_k if k is None else k),
        runtime.attention_backend,
        runtime.mla_attention_backend,
    )
    config_map = render.config_map(ctx, config)
    template = render.pod_template(
        ctx, spec, runtime, render.PoolTrack(track, 3, config_map["metadata"]["name"], render.engine_args(config)),
        pod_settings=pod_settings,
    )
    return RenderedPool(
        config=config,
        config_map=config_map,
        template=template,
        deployment=render.deployment(ctx, template, replicas, track),
        pdb=render.pod_disruption_budget(ctx),
    )
