"""Equal load by construction: at every analysed step a canary pod and a stable pod are offered the same share
of requests, behind an HTTPRoute as without one (issue 31, cause 1). Written first: on the old sizing the stable
kept every replica behind a route while the canary got round(n * w), so at 50% a canary pod carried twice a
stable pod's requests."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest

from specdec_operator.api.spec import Canary, CanaryStep, Rollout
from specdec_operator.api.status import CanaryStatus
from specdec_operator.reconcile.desired import DesiredPool
from specdec_operator.reconcile.rollout import RolloutInputs, plan_rollout
from specdec_runtime import contract

NOW = datetime(2026, 12, 3, 7, 0, 0, tzinfo=UTC)
POOL = "llama-gfx942"
# Per-pod load may differ by at most the rounding of the route weight to whole percents.
TOLERANCE = 0.06


def _deployment(name: str, revision: str, track: str, replicas: int, ready: int) -> dict[str, Any]:
    labels = {contract.LABEL_POOL: POOL, contract.LABEL_TRACK: track}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": {**labels, contract.LABEL_REVISION: revision}}, "spec": {}}},
        "status": {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas,
                   "availableReplicas": ready, "observedGeneration": 1},
    }


def _pool(total: int) -> DesiredPool:
    desired = _deployment(POOL, "rev-new", "stable", total, 0)
    plan = SimpleNamespace(replicas=total)
    return DesiredPool(plan=cast(Any, plan), name=POOL, k=4, runtime=cast(Any, None), config_map={},
                       deployment=desired, pdb={})


def _sizes(result: Any) -> dict[str, int]:
    return {body["metadata"]["labels"][contract.LABEL_TRACK]: body["spec"]["replicas"] for body in result.deployments}


def _step(total: int, weight: int, routed: bool) -> tuple[dict[str, int], int | None]:
    """Plan a pass in the middle of a step at `weight`, with the canary pods of that step ready and the stable
    Deployment as the previous pass left it; then a second pass on what the first one asked for."""
    weights = [weight, 100] if weight < 100 else [50, 100]
    rollout = Rollout(strategy="Canary", canary=Canary(steps=[CanaryStep(weight=w, pause_seconds=600)
                                                              for w in weights]))
    status = CanaryStatus(pool=POOL, stable_revision="rev-old", canary_revision="rev-new",
                          step=weights.index(weight), weight=weight, phase="Progressing",
                          step_started_at="2026-12-03T06:59:00Z")
    pool = _pool(total)
    stable_size, canary_size = total, max(1, round(total * weight / 100))
    for _ in range(3):  # converge: each pass sees the sizes (all ready) the previous one asked for
        live = {POOL: _deployment(POOL, "rev-old", "stable", stable_size, stable_size),
                f"{POOL}-canary": _deployment(f"{POOL}-canary", "rev-new", "canary", canary_size, canary_size)}
        result = plan_rollout(RolloutInputs([pool], live, status, rollout, NOW, routed, route_percent=None))
        sizes = _sizes(result)
        stable_size, canary_size = sizes.get("stable", 0), sizes.get("canary", 0)
    return sizes, result.route_weight


@pytest.mark.parametrize("routed", [True, False], ids=["httproute", "replica-ratio"])
@pytest.mark.parametrize("total", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("weight", [10, 25, 50, 75])
def test_every_step_offers_each_pod_the_same_load(total: int, weight: int, routed: bool) -> None:
    sizes, route_weight = _step(total, weight, routed)
    stable, canary = sizes["stable"], sizes["canary"]
    assert stable >= 1 and canary >= 1
    # Without a route each ready pod gets the same share (kube-proxy round robin): the split is the replicas'.
    share = route_weight if routed else 100 * canary / (stable + canary)
    assert share is not None and 0 < share < 100
    per_canary_pod, per_stable_pod = share / canary, (100 - share) / stable
    assert abs(per_canary_pod / per_stable_pod - 1) <= TOLERANCE, (sizes, route_weight)


@pytest.mark.parametrize("total", [1, 2, 4, 8, 16])
def test_the_full_step_sends_everything_to_the_canary_and_the_stable_serves_nothing(total: int) -> None:
    sizes, route_weight = _step(total, 100, True)
    assert route_weight == 100
    assert sizes.get("stable", 0) == 0 and sizes["canary"] == total
