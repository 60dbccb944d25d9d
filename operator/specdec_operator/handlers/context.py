"""Process-wide state the handlers share: settings, the API seam, caches and what each model's loop remembers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import aiohttp
from aiohttp import web

from specdec_operator.handlers.cache import FleetSnapshot, WatchCache
from specdec_operator.handlers.memory import MemoryRelease
from specdec_operator.handlers.supervisor import Supervisor
from specdec_operator.kube.api import KubeApi
from specdec_operator.reconcile.observed import Settings
from specdec_operator.render.names import label_value
from specdec_operator.settings import OperatorSettings

if TYPE_CHECKING:
    from specdec_operator.handlers.resync import Listing
    from specdec_operator.handlers.scrapes import ScrapeScheduler
    from specdec_operator.handlers.tuning import ModelTuner
    from specdec_operator.handlers.writes import Refusals

Logger: TypeAlias = logging.Logger | logging.LoggerAdapter[Any]


ModelKey: TypeAlias = tuple[str, str]  # (namespace, name)


@dataclass
class ModelMemory:
    """What this process remembers about one model between reconcile passes, in one place.

    Every field is a cache or a pacing aid, rebuilt from the API server after a restart: decisions live in
    the model's status (the tuner's state is read back from it), never only here.
    """

    wakeup: asyncio.Event = field(default_factory=asyncio.Event)  # set to run the model's loop now
    tuner: ModelTuner | None = None  # scrape windows, canary evidence, the next scrape and evaluation times
    # The object our last status write returned: newer than kopf's body until the watch catches up.
    written: dict[str, Any] | None = None
    # resourceVersions `written` is known to be newer than (handlers/writes.py newest_body; never ordered).
    superseded: dict[str, None] = field(default_factory=dict)  # in the order learnt, oldest first
    stats_due_at: float | None = None  # next statistics refresh, monotonic
    refusals: Refusals | None = None  # owned objects the API server refused, and the retry schedule
    # (reason, message) of a Gateway that refuses the model's HTTPRoute as last read: the canary step holds.
    route_rejection: tuple[str, str] | None = None
    route_warning: tuple[str, str] | None = None  # the route problem last posted as an event, posted once
    # After a pause the watch cache is trusted for this model once it caught up with a LIST (handlers/resync.py).
    cache_trusted: bool = False
    listing: Listing | None = None  # the last LIST it was compared with


@dataclass
class OperatorContext:
    settings: OperatorSettings
    api: KubeApi
    http: aiohttp.ClientSession
    models: dict[ModelKey, ModelMemory] = field(default_factory=dict)  # per model, while its loop runs
    scrapes: ScrapeScheduler | None = None  # the operator-wide scrape rounds, once started
    metrics_server: web.AppRunner | None = None  # the authenticated /metrics server (settings.metrics_auth)
    cache: WatchCache = field(default_factory=WatchCache)  # owned objects and runtime pods, from watches
    memory: MemoryRelease = field(default_factory=MemoryRelease)  # gives pages back after models go
    fleet: FleetSnapshot = field(default_factory=FleetSnapshot)  # nodes and pod GPU claims, shared briefly
    supervisor: Supervisor = field(default_factory=Supervisor)  # runs the operator-wide background loops
    # Runtime pods failing now (uid -> cause), so a pod that starts or stops failing wakes its model at once.
    failing_pods: dict[str, str] = field(default_factory=dict)
    # How often the watch said a model left it (a DELETED event), per model. A model relabelled out of the
    # model selector gets one without a deletionTimestamp, and kopf then stops nothing: its loop compares this
    # count with the one it started at and ends itself. Kept across loops, so a model that comes back starts
    # a loop with the new count.
    departures: dict[ModelKey, int] = field(default_factory=dict)
    # The monotonic clock that paces writes (statistics refreshes, refused-write backoff): tests step it.
    clock: Callable[[], float] = time.monotonic
    # The wall clock (Unix seconds), for status stamps and the canary's windows that compare with them.
    wall_clock: Callable[[], float] = time.time

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
        """Drop every per-model memory when the model's loop ends."""
        key = (namespace, name)
        self.models.pop(key, None)
        if self.scrapes is not None:
            self.scrapes.forget(key)
        self.cache.forget(key)
        if not self.models:
            self.fleet.clear()
        self.memory.after_forget()

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.model(namespace, name).wakeup

    def nudge_by_label(self, namespace: str, model_label: str) -> None:
        """Nudge the model whose (possibly shortened) label value is `model_label`: pods carry only that."""
        for key in [key for key in self.models if key[0] == namespace and label_value(key[1]) == model_label]:
            self.nudge(*key)

    def nudge(self, namespace: str, name: str) -> None:
        """Ask the model's reconcile loop to run now instead of at its next interval."""
        known = self.known(namespace, name)
        if known is not None:
            known.wakeup.set()

    @property
    def evaluation_settings(self) -> Settings:
        return Settings(
            runtime_images=self.settings.runtime_images,
            image_targets=self.settings.image_targets,
            simulator_image=self.settings.simulator_image,
            kv_headroom_fraction=self.settings.kv_headroom_fraction,
            pod=self.settings.pod_settings,
            node_missing_grace_s=self.settings.node_missing_grace_seconds,
            devices=self.settings.device_table,
        )
