"""Kopf registrations. Importing this module registers every handler of the operator.

One level-triggered loop per SpeculativeModel (a kopf daemon) runs the idempotent reconcile on start,
on every change of the model or its children, and on an interval; there are no create/update chains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
from prometheus_client import start_http_server

from specdec_operator import GROUP, KIND, PLURAL, VERSION
from specdec_operator.gpu.inventory import NodeGpus, node_gpus
from specdec_operator.handlers.context import Logger, OperatorContext
from specdec_operator.handlers.reconciler import reconcile
from specdec_operator.handlers.schedule import LoopSchedule
from specdec_operator.handlers.tuning import next_wake, scrape_tick
from specdec_operator.handlers.writes import newest_body
from specdec_operator.kube.api import KubeApi, KubeApiError
from specdec_operator.metrics import REGISTRY
from specdec_operator.settings import OperatorSettings
from specdec_runtime import contract

# Changes often arrive in bursts (our own status write, a Deployment's status updates); batch them.
DEBOUNCE_S = 0.5
OWNED = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, logger: Logger, **_: Any) -> None:
    operator_settings = OperatorSettings()
    settings.persistence.finalizer = f"{GROUP}/reconcile-loop"
    settings.posting.level = logging.WARNING  # kopf's own log lines stay out of the model's events
    settings.watching.server_timeout = 300
    if operator_settings.namespaces and not any("*" in ns for ns in operator_settings.namespaces):
        # Fixed namespaces need no namespace scan; a namespaced Role could not list namespaces anyway.
        settings.scanning.disabled = True
    api = await KubeApi.connect(operator_settings.field_manager, operator_settings.api_timeout_seconds)
    # One pooled HTTP client for every scrape; vLLM answers /metrics on plain HTTP.
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=operator_settings.scrape_concurrency))
    memo.context = OperatorContext(settings=operator_settings, api=api, http=http)
    if not operator_settings.standalone:
        await ensure_peering(api, operator_settings)
    if operator_settings.metrics_port:
        start_http_server(operator_settings.metrics_port, addr="0.0.0.0", registry=REGISTRY)
    logger.info("specdec-operator configured: %s", operator_settings.model_dump(exclude={"runtime_images"}))


async def ensure_peering(api: KubeApi, settings: OperatorSettings) -> None:
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
    await context.http.close()
    await context.api.close()


@kopf.index("nodes")
def gpu_nodes(
    name: str, labels: Mapping[str, str], spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[str, NodeGpus]:
    return {
        name: node_gpus(
            name,
            dict(labels),
            dict(status.get("allocatable", {})),
            list(spec.get("taints", [])),
            bool(spec.get("unschedulable", False)),
        )
    }


# Async, so they run on the event loop: asyncio.Event.set() is not safe from kopf's thread pool.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def model_changed(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    memo.context.nudge(namespace or "", name)


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
async def deployment_changed(namespace: str | None, meta: kopf.Meta, memo: Any, **_: Any) -> None:
    # The owner reference carries the model's real name; the label may be a shortened form of it.
    for owner in meta.get("ownerReferences", []):
        if owner.get("kind") == KIND and namespace:
            memo.context.nudge(namespace, owner["name"])


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
    context: OperatorContext = memo.context
    wakeup = context.wakeup(namespace, name)
    schedule = LoopSchedule(context.settings.reconcile_interval_seconds)
    nudged = True
    try:
        while not stopped:
            now = time.monotonic()
            tuner_at = next_wake(context, namespace, name)
            retry_at = _retry_at(context, namespace, name)
            evaluation_at = tuner_at[1] if tuner_at else None
            if schedule.full_due(now, nudged, evaluation_at, retry_at):
                nodes = [facts for store in gpu_nodes.values() for facts in store]
                try:
                    plan = await reconcile(context, body, nodes, logger)
                    schedule.succeeded(time.monotonic(), plan.invalid_spec is not None)
                except KubeApiError as error:
                    # The API said no (a terminating namespace, a conflict, a missing CRD): back off and retry.
                    delay = schedule.failed(time.monotonic(), error.retry_after_s)
                    logger.warning("reconcile deferred, retrying in %.1fs: %s", delay, error)
                except Exception as error:
                    delay = schedule.failed(time.monotonic())
                    logger.exception("reconcile failed, retrying in %.1fs: %s", delay, error)
                after = time.monotonic()
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
            nudged = await _sleep_until_nudged(wakeup, stopped, wake_at - time.monotonic())
            if nudged:
                await asyncio.sleep(DEBOUNCE_S)
    finally:
        context.forget(namespace, name)


def _retry_at(context: OperatorContext, namespace: str, name: str) -> float | None:
    refusals = context.refusals.get((namespace, name))
    return refusals.backoff.next_try_at() if refusals is not None else None
