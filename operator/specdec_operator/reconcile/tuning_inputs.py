"""What the tuner is fed, built from observed pods and the last status (pure)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specdec_operator.api.status import PoolSpeculationStats, PoolStatus, RejectedK, SpeculationStatus, TuningDecision
from specdec_operator.timestamps import stamp_seconds
from specdec_operator.tuner.engine import PoolContext
from specdec_operator.tuner.samples import ScrapeTarget
from specdec_runtime import contract


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status", {})
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )


def scrape_targets(pods: Iterable[Mapping[str, Any]]) -> list[ScrapeTarget]:
    """Ready runtime pods with an IP and our labels; anything else has no counters worth reading."""
    targets = []
    for pod in pods:
        meta = pod.get("metadata", {})
        labels, annotations = meta.get("labels", {}), meta.get("annotations", {})
        ip = pod.get("status", {}).get("podIP")
        if not ip or meta.get("deletionTimestamp") or not _ready(pod):
            continue
        try:
            k = int(annotations.get(contract.ANNOTATION_K, ""))
        except ValueError:
            continue
        restarts = sum(int(c.get("restartCount", 0)) for c in pod.get("status", {}).get("containerStatuses", []))
        targets.append(ScrapeTarget(
            pod=f"{meta.get('namespace')}/{meta.get('name')}",
            uid=str(meta.get("uid", "")),
            ip=str(ip),
            port=8000,
            pool=str(labels.get(contract.LABEL_POOL, "")),
            revision=str(labels.get(contract.LABEL_REVISION, "")),
            k=k,
            restart_count=restarts,
        ))
    return targets


def _start_to_ready(pod: Mapping[str, Any]) -> float | None:
    """Seconds from the pod's start (status.startTime, set when the kubelet takes the pod: image pull, weights
    download and engine load all come after it) to its Ready condition turning True; None for a pod that is not
    Ready or does not show both times."""
    status = pod.get("status", {})
    started = status.get("startTime")
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if not started or ready is None or ready.get("status") != "True" or not ready.get("lastTransitionTime"):
        return None
    try:
        seconds = stamp_seconds(str(ready["lastTransitionTime"])) - stamp_seconds(str(started))
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def pool_ready_seconds(pods: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Pool -> the median start-to-Ready seconds of its Ready pods: what the pool's next restart is expected to
    take (the tuner charges it to a K change, tuner/policy.py). A pod whose container restarted, or that was
    NotReady for a while, shows a later Ready time; the median keeps one such pod from moving the figure."""
    by_pool: dict[str, list[float]] = {}
    for pod in pods:
        meta = pod.get("metadata", {})
        seconds = None if meta.get("deletionTimestamp") else _start_to_ready(pod)
        pool = (meta.get("labels") or {}).get(contract.LABEL_POOL)
        if seconds is not None and pool:
            by_pool.setdefault(str(pool), []).append(seconds)
    return {pool: statistics.median(values) for pool, values in by_pool.items()}


def _out_at_once(pool: PoolStatus, max_unavailable: int) -> int:
    """Replicas the pool's next rollout takes out of service at once: as its latest rollout did (none for a
    surge), or spec.rollout.maxUnavailable before it had one."""
    if pool.rollout is None:
        return max_unavailable
    return 0 if pool.rollout.mode == "Surge" else pool.rollout.max_unavailable


def pool_contexts(
    pools: Sequence[PoolStatus],
    tensor_parallel: Mapping[str, int],
    rolling: set[str],
    rejected: Sequence[RejectedK] = (),
    *,
    ready_s: Mapping[str, float] | None = None,
    max_unavailable: int = 1,
) -> list[PoolContext]:
    """`tensor_parallel`: GPUs per replica of each gfx target's pool (SpeculativeModelSpec.tensor_parallel).
    `rejected`: status.speculation.rejectedKs; each pool gets those recorded against its current revision.
    `ready_s`: pool -> observed start-to-Ready seconds (`pool_ready_seconds`); `max_unavailable`:
    spec.rollout.maxUnavailable, for a pool with no rollout on record."""
    ready_s = ready_s or {}
    return [
        PoolContext(
            name=pool.name,
            gfx_target=pool.gfx_target,
            drafter_method=pool.drafter.method,
            drafter_model=pool.drafter.model,
            drafter_mtp_layers=pool.drafter.mtp_layers,
            effective_k=pool.effective_k,
            replicas=max(pool.replicas, 1),
            gpus_per_replica=tensor_parallel.get(pool.gfx_target, 1),
            rolling=pool.name in rolling,
            rejected={item.k: item.predicted_gain for item in rejected
                      if item.pool == pool.name and item.stable_revision == pool.revision},
            ready_s=ready_s.get(pool.name),
            out_at_once=_out_at_once(pool, max_unavailable),
        )
        for pool in pools
    ]


def speculation_status(
    previous: SpeculationStatus,
    stats: Sequence[PoolSpeculationStats],
    decision: TuningDecision | None,
) -> SpeculationStatus:
    """Model-wide figures weight each pool by its drafts; tokens/s add up across pools."""
    weighted = [(s.drafts, s) for s in stats if s.drafts > 0]
    total = sum(drafts for drafts, _ in weighted)

    def mean(field: str) -> float | None:
        values = [(drafts, getattr(s, field)) for drafts, s in weighted if getattr(s, field) is not None]
        weight = sum(drafts for drafts, _ in values)
        return round(sum(d * v for d, v in values) / weight, 4) if weight else None

    rates = [s.tokens_per_second for s in stats if s.tokens_per_second is not None]
    return SpeculationStatus(
        acceptance_rate=mean("acceptance_rate") if total else None,
        mean_accepted_length=mean("mean_accepted_length") if total else None,
        tokens_per_second=round(sum(rates), 2) if rates else None,
        pools=list(stats),
        last_decision=decision or previous.last_decision,
        rejected_ks=previous.rejected_ks,
    )


def rolling_pools(deployments: Iterable[Mapping[str, Any]], tracks: tuple[str, ...] = ("stable", "canary")) -> set[str]:
    """Pools with a Deployment of the given tracks that has not finished rolling.

    The tuner waits on both tracks (counters mix two K values); the rollout asks about the stable one only.
    """
    rolling = set()
    for deployment in deployments:
        meta, spec, status = deployment["metadata"], deployment.get("spec", {}), deployment.get("status", {})
        if meta.get("labels", {}).get(contract.LABEL_TRACK, "stable") not in tracks:
            continue
        replicas = int(spec.get("replicas", 0))
        done = (
            status.get("observedGeneration", 0) >= meta.get("generation", 0)
            and int(status.get("updatedReplicas", 0) or 0) >= replicas
            and int(status.get("readyReplicas", 0) or 0) >= replicas
            and int(status.get("replicas", 0) or 0) == replicas
        )
        if not done:
            rolling.add(str(meta.get("labels", {}).get(contract.LABEL_POOL, meta["name"])))
    return rolling
