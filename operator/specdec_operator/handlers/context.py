"""Process-wide state the handlers share: settings, the API seam, caches and what each model's loop remembers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import aiohttp
from aiohttp import web

from specdec_operator.handlers.model_memory import ModelKey, ModelMemory
from specdec_operator.handlers.services.cache import FleetSnapshot, WatchCache
from specdec_operator.handlers.services.fleet_audit import FleetAudit
from specdec_operator.handlers.services.memory_release import MemoryRelease
from specdec_operator.handlers.services.rollout_slots import RolloutSlots
from specdec_operator.handlers.services.scrapes import ScrapeScheduler
from specdec_operator.handlers.services.supervisor import Supervisor
from specdec_operator.kube.api import KubeApi
from specdec_operator.metrics import forget_model
from specdec_operator.reconcile.observed import EvaluationSettings
from specdec_operator.render.names import label_value
from specdec_operator.settings import OperatorEnvSettings
from specdec_operator.timestamps import format_stamp

Logger: TypeAlias = logging.Logger | logging.LoggerAdapter[Any]


@dataclass
class OperatorContext:
    settings: OperatorEnvSettings
    api: KubeApi
    http: aiohttp.ClientSession
    models: dict[ModelKey, ModelMemory] = field(default_factory=dict)  # per model, while its loop runs
    scrapes: ScrapeScheduler | None = None  # the operator-wide scrape rounds, once started
    metrics_server: web.AppRunner | None = None  # the authenticated /metrics server (settings.metrics_auth)
    cache: WatchCache = field(default_factory=WatchCache)  # owned objects and runtime pods, from watches
    memory: MemoryRelease = field(default_factory=MemoryRelease)  # gives pages back after models go
    fleet: FleetSnapshot = field(default_factory=FleetSnapshot)  # nodes and pod GPU claims, shared briefly
    fleet_audit: FleetAudit = field(init=False)  # checks the node and pod indices for ghosts of watch gaps
    supervisor: Supervisor = field(default_factory=Supervisor)  # runs the operator-wide background loops
    rollout_slots: RolloutSlots = field(init=False)  # the models with a rollout in flight, for the fleet's limit
    # Runtime pods failing now (uid -> cause), so a pod that starts or stops failing wakes its model at once.
    failing_pods: dict[str, str] = field(default_factory=dict)
    # How often the watch said a model left it (a DELETED event), per model. A model relabelled out of the
    # model selector gets one without a deletionTimestamp, and kopf then stops nothing: its loop compares this
    # count with the one it started at and ends itself. Kept across loops, so a model that comes back starts
    # a loop with the new count.
    departures: dict[ModelKey, int] = field(default_factory=dict)
    # The two clocks handlers/ reads, and only through here, so tests step them. Monotonic for every interval
    # (loop pacing, statistics refreshes, refused-write backoff, the tuner's windows); the wall clock only for
    # what is compared with stamps in status (timestamps.py), in seconds since the epoch.
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self.fleet_audit = FleetAudit(self.settings.fleet_audit_interval_seconds)
        self.rollout_slots = RolloutSlots(self.settings.max_concurrent_rollouts)

    def paused(self) -> None:
        """Kopf paused this replica for a peer and closed its watches: once it resumes, every index may hold
        objects deleted meanwhile (handlers/services/cache.py, handlers/services/fleet_audit.py)."""
        self.cache.paused()
        self.fleet_audit.paused()
        # Another replica rolls models out meanwhile: the slots are rebuilt from the cache once this one resumes.
        self.rollout_slots = RolloutSlots(self.settings.max_concurrent_rollouts)

    def stamp_now(self) -> str:
        """The wall clock's now as a status stamp (RFC 3339, UTC)."""
        return format_stamp(self.wall_clock())

    def depart(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self.departures[key] = self.departures.get(key, 0) + 1
        self.nudge(namespace, name)

    def model(self, namespace: str, name: str) -> ModelMemory:
        """The model's memory, made empty on first use."""
        return self.models.setdefault((namespace, name), ModelMemory())

    def known(self, namespace: str, name: str) -> ModelMemory | None:
        """The model's memory if this process has any; looking does not create it."""
        return self.models.get((namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        """The one path that drops what this process holds of a model when its loop ends (deleted, left the
        model selector, or this replica paused for a peer): its memory, the services' working sets keyed by it,
        and its metric series. Only `departures` stays (see above)."""
        key = (namespace, name)
        self.models.pop(key, None)
        if self.scrapes is not None:
            self.scrapes.forget(key)
        self.cache.forget(key)
        # A deleted model's rollout is over; a paused replica's next leader rebuilds the slots from its cache.
        self.nudge_all(self.rollout_slots.release(key))
        forget_model(namespace, name)
        if not self.models:
            self.fleet.clear()
        self.memory.after_forget()

    def forget_tuner(self, namespace: str, name: str) -> None:
        """Drop the model's tuner and canary windows and stop scraping it (tuning and canary off, or no pools
        yet); the rest of its memory stays."""
        self.model(namespace, name).tuner = None
        if self.scrapes is not None:
            self.scrapes.forget((namespace, name))

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.model(namespace, name).wakeup

    def nudge_by_label(self, namespace: str, model_label: str) -> None:
        """Nudge the model whose (possibly shortened) label value is `model_label`: pods carry only that."""
        for key in [key for key in self.models if key[0] == namespace and label_value(key[1]) == model_label]:
            self.nudge(*key)

    def nudge_all(self, keys: list[ModelKey]) -> None:
        for key in keys:
            self.nudge(*key)

    def nudge(self, namespace: str, name: str) -> None:
        """Ask the model's reconcile loop to run now instead of at its next interval."""
        known = self.known(namespace, name)
        if known is not None:
            known.wakeup.set()

    @property
    def evaluation_settings(self) -> EvaluationSettings:
        return EvaluationSettings(
            runtime_images=self.settings.runtime_images,
            image_targets=self.settings.image_targets,
            simulator_image=self.settings.simulator_image,
            kv_headroom_fraction=self.settings.kv_headroom_fraction,
            pod=self.settings.pod_settings,
            node_missing_grace_s=self.settings.node_missing_grace_seconds,
            devices=self.settings.device_table,
            shard=self.settings.shard or "",
            freeze_rollouts=self.settings.freeze_rollouts,
        )
