"""Kopf registrations. Importing this module registers every handler of the operator.

One level-triggered loop per SpeculativeModel (a kopf daemon) runs the idempotent reconcile on start,
on every change of the model or its children, and on an interval; there are no create/update chains.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from prometheus_client import start_http_server

from specdec_operator import GROUP, PLURAL, VERSION
from specdec_operator.decisions import label_selector
from specdec_operator.gpu.inventory import NodeGpus, PodGpus, RuntimePodLabels, node_gpus, pod_gpus
from specdec_operator.handlers.context import Logger, OperatorContext
from specdec_operator.handlers.reconciler import reconcile
from specdec_operator.handlers.schedule import LoopSchedule
from specdec_operator.handlers.services.leadership import track_leadership
from specdec_operator.handlers.services.metrics_server import serve_authenticated_metrics
from specdec_operator.handlers.services.scrapes import ScrapeScheduler
from specdec_operator.handlers.services.supervisor import Supervisor
from specdec_operator.handlers.services.watches import filter_watches, owned_changed
from specdec_operator.handlers.tuning import next_wake, scrape_tick
from specdec_operator.handlers.writes import newest_body
from specdec_operator.kube.api import KubeApi, KubeApiError
from specdec_operator.metrics import REGISTRY
from specdec_operator.settings import OperatorEnvSettings
from specdec_operator.tuner.scraper import scrape_session
from specdec_runtime import contract

# Changes often arrive in bursts (a Deployment's status updates); batch them.
DEBOUNCE_S = 0.5
# How the GPU pod index tells our runtime pods (and their model and pool) from other workloads.
RUNTIME_POD_LABELS = RuntimePodLabels(
    (contract.LABEL_MANAGED_BY, contract.MANAGED_BY), contract.LABEL_MODEL, contract.LABEL_POOL
)
__all__ = ["owned_changed"]  # registered by importing handlers.watches


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, logger: Logger, **_: Any) -> None:
    operator_settings = OperatorEnvSettings()
    settings.persistence.finalizer = f"{GROUP}/reconcile-loop"
    settings.posting.level = logging.WARNING  # kopf's own log lines stay out of the model's events
    settings.watching.server_timeout = 300
    if operator_settings.namespaces and not any("*" in ns for ns in operator_settings.namespaces):
        # Fixed namespaces need no namespace scan; a namespaced Role could not list namespaces anyway.
        settings.scanning.disabled = True
    filter_watches(settings, operator_settings.model_selector)
    api = await KubeApi.connect(operator_settings.field_manager, operator_settings.api_timeout_seconds)
    # One pooled HTTP client for every scrape; vLLM answers /metrics on plain HTTP.
    http = scrape_session(operator_settings.scrape_concurrency)
    memo.context = OperatorContext(settings=operator_settings, api=api, http=http)
    memo.context.scrapes = ScrapeScheduler(
        http, interval_s=operator_settings.scrape_interval_seconds, timeout_s=operator_settings.scrape_timeout_seconds,
        concurrency=operator_settings.scrape_concurrency, allow_non_loopback=not operator_settings.scrape_loopback_only,
        max_body_bytes=operator_settings.scrape_max_body_bytes, clock=memo.context.clock,
    )
    start_background_tasks(memo.context)
    if not operator_settings.standalone:
        await ensure_peering(api, operator_settings)
    # Before kopf's peering starts (it waits for the startup handlers): kopf's first verdict is not missed.
    track_leadership(len(operator_settings.namespaces) or 1, operator_settings.standalone,
                     on_pause=memo.context.paused)
    if operator_settings.metrics_port and operator_settings.metrics_auth:
        memo.context.metrics_server = await serve_authenticated_metrics(
            api, REGISTRY, operator_settings.metrics_port, clock=memo.context.clock)
    elif operator_settings.metrics_port:
        start_http_server(operator_settings.metrics_port, addr="0.0.0.0", registry=REGISTRY)
    logger.info("specdec-operator configured: %s", operator_settings.model_dump(exclude={"runtime_images"}))


def start_background_tasks(context: OperatorContext) -> None:
    """The operator-wide loops, each restarted after an unexpected error (handlers/services/supervisor.py)."""
    scrapes, memory, cache = context.scrapes, context.memory, context.cache
    assert scrapes is not None
    context.supervisor.start("scrape_scheduler", scrapes.run)
    context.supervisor.start("memory_watcher", lambda: memory.watch(cache.count))


@kopf.on.probe(id="background_tasks")
async def background_tasks(memo: Any, **_: Any) -> dict[str, dict[str, object]]:
    """Part of kopf's liveness endpoint: fails it (HTTP 500) while a background task cannot recover."""
    supervisor: Supervisor = memo.context.supervisor
    unhealthy = supervisor.unhealthy()
    if unhealthy:
        raise kopf.PermanentError(f"background tasks failing: {unhealthy}")
    return supervisor.report()


async def ensure_peering(api: KubeApi, settings: OperatorEnvSettings) -> None:
    """Kopf only patches its peering object; without one every replica stays paused. Create it once."""
    if settings.namespaces:
        peerings = [{"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                     "metadata": {"name": settings.peering_name, "namespace": namespace}}
                    for namespace in settings.namespaces]
    else:
        peerings = [{"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                     "metadata": {"name": settings.peering_name}}]
    for peering in peerings:
        await api.create_if_absent(peering)


@kopf.on.cleanup()
async def close(memo: Any, **_: Any) -> None:
    context: OperatorContext = memo.context
    if context.metrics_server is not None:
        await context.metrics_server.cleanup()
    await context.supervisor.close()
    await context.memory.close()
    await context.http.close()
    await context.api.close()


# Async like the owned-object indices (handlers/services/watches.py): no thread hop per node or pod event.
@kopf.index("nodes")
async def gpu_nodes(
    name: str, uid: str | None, labels: Mapping[str, str], spec: kopf.Spec, status: kopf.Status, memo: Any,
    **_: Any
) -> dict[str, NodeGpus]:
    context: OperatorContext = memo.context
    return {
        name: dataclasses.replace(node_gpus(
            name,
            dict(labels),
            dict(status.get("allocatable", {})),
            list(spec.get("taints", [])),
            bool(spec.get("unschedulable", False)),
            # The table placement and the rendered affinity use too (OperatorContext.evaluation_settings).
            context.settings.device_table,
        ), uid=uid or "")
    }


@kopf.index("pods")
async def gpu_pods(
    namespace: str | None, name: str, uid: str | None, labels: Mapping[str, str], spec: kopf.Spec,
    status: kopf.Status, **_: Any
) -> dict[str, PodGpus]:
    """GPU claims of every watched pod (all models and other workloads) for free-GPU counts.

    A pod without a GPU, or finished, maps to nothing, which also drops an earlier entry of it.
    """
    claim = pod_gpus(namespace or "", name, dict(labels), dict(spec), dict(status), RUNTIME_POD_LABELS)
    return {} if claim is None else {f"{namespace}/{name}": dataclasses.replace(claim, uid=uid or "")}


# Async, so it runs on the event loop: asyncio.Event.set() is not safe from kopf's thread pool.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def model_changed(
    namespace: str | None, name: str, type: str | None, body: kopf.Body, memo: Any, **_: Any
) -> None:
    context: OperatorContext = memo.context
    if type == "DELETED":
        # Deleted, or relabelled out of this install's model selector (the watch says DELETED then too).
        context.depart(namespace or "", name)
    # Our own status writes come back as events too; only a change of spec or metadata wakes the loop.
    if context.cache.model_changed((namespace or "", name), type, body):
        context.nudge(namespace or "", name)


async def _sleep_until_nudged(wakeup: asyncio.Event, stopped: kopf.DaemonStopped, timeout_s: float) -> bool:
    """Sleep up to `timeout_s`; True if woken by a nudge (a change), False on timeout or stop."""
    waiters = [asyncio.ensure_future(wakeup.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    nudged = wakeup.is_set()
    wakeup.clear()
    return nudged


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10)
async def reconcile_loop(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: Any,
    logger: Logger,
    **kwargs: Any,
) -> None:
    assert namespace is not None  # SpeculativeModel is namespaced
    gpu_nodes: kopf.Index[str, NodeGpus] = kwargs["gpu_nodes"]  # the node index, by its handler's name
    gpu_pods: kopf.Index[str, PodGpus] = kwargs["gpu_pods"]
    context: OperatorContext = memo.context
    wakeup = context.wakeup(namespace, name)
    # Kopf filled every index before the first loop started; after a pause they may lag (handlers/resync.py).
    context.cache.bind(kwargs)
    schedule = LoopSchedule(context.settings.reconcile_interval_seconds)
    nudged = True
    departures = context.departures.get((namespace, name), 0)
    try:
        while not stopped:
            if context.departures.get((namespace, name), 0) != departures:
                # kopf stops a daemon only for a deletion; a model that left the model selector is another
                # install's now, and nothing of this loop may act on it.
                logger.info("the model left this install's watch (deleted, or relabelled out of its model "
                            "selector): its loop ends")
                return
            if _left_model_selector(context, namespace, name, body):
                # Relabelled into another shard, as our newest copy says (a conflict's re-read can know before
                # the watch does): nothing here is ours to scrape or write. The watch's DELETED ends the loop;
                # a relabel back wakes it.
                logger.info("model no longer matches this install's model selector %r: left to its shard",
                            context.settings.model_selector)
                nudged = await _sleep_until_nudged(wakeup, stopped, context.settings.reconcile_interval_seconds)
                continue
            now = context.clock()
            tuner_at = next_wake(context, namespace, name)
            retry_at = _retry_at(context, namespace, name)
            evaluation_at = tuner_at[1] if tuner_at else None
            if schedule.full_due(now, nudged, evaluation_at, retry_at):
                try:
                    # Ghosts of a watch gap out of the fleet before placement counts it (once in a while).
                    await context.fleet_audit.run_if_due(context.api, gpu_nodes, gpu_pods, context.fleet, now)
                    nodes, claims = context.fleet.read(gpu_nodes, gpu_pods, now)
                    plan = await reconcile(context, body, nodes, logger, claims, departures)
                    schedule.succeeded(context.clock(), plan.invalid_spec is not None, plan.held is not None)
                except KubeApiError as error:
                    # The API said no (a terminating namespace, a conflict, a missing CRD): back off and retry.
                    delay = schedule.failed(context.clock(), error.retry_after_s)
                    logger.warning("reconcile deferred, retrying in %.1fs: %s", delay, error)
                except Exception as error:
                    delay = schedule.failed(context.clock())
                    logger.exception("reconcile failed, retrying in %.1fs: %s", delay, error)
                after = context.clock()
                tuner_at = next_wake(context, namespace, name)
                schedule.ran_full(after, tuner_at[1] if tuner_at else None, _retry_at(context, namespace, name))
            else:
                try:
                    await scrape_tick(context, context.http, newest_body(context, (namespace, name), body))
                except KubeApiError as error:
                    logger.warning("scrape skipped this round: %s", error)
            tuner_at = next_wake(context, namespace, name)
            wake_at = schedule.wake_at(tuner_at[0] if tuner_at else None, tuner_at[1] if tuner_at else None,
                                       _retry_at(context, namespace, name))
            nudged = await _sleep_until_nudged(wakeup, stopped, wake_at - context.clock())
            if nudged:
                await asyncio.sleep(DEBOUNCE_S)
    finally:
        # The loop ends when the model is deleted or this replica pauses for a peer: every per-model memory
        # and its metric series go (OperatorContext.forget, the one path).
        context.forget(namespace, name)


def _left_model_selector(context: OperatorContext, namespace: str, name: str, body: kopf.Body) -> bool:
    labels = newest_body(context, (namespace, name), body)["metadata"].get("labels")
    return not label_selector.matches(context.settings.model_selector, labels)


def _retry_at(context: OperatorContext, namespace: str, name: str) -> float | None:
    known = context.known(namespace, name)
    refusals = known.refusals if known is not None else None
    return refusals.backoff.next_try_at() if refusals is not None else None
