"""Process-wide state the handlers share: settings, the API seam and per-model wake-up signals."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import aiohttp

from specdec_operator.handlers.cache import FleetSnapshot, WatchCache
from specdec_operator.handlers.memory import MemoryRelease
from specdec_operator.handlers.supervisor import Supervisor
from specdec_operator.kube.api import KubeApi
from specdec_operator.reconcile.observed import Settings
from specdec_operator.render.names import label_value
from specdec_operator.settings import OperatorSettings

if TYPE_CHECKING:
    from specdec_operator.handlers.scrapes import ScrapeScheduler
    from specdec_operator.handlers.tuning import ModelTuner
    from specdec_operator.handlers.writes import Refusals

Logger: TypeAlias = logging.Logger | logging.LoggerAdapter[Any]


@dataclass
class OperatorContext:
    settings: OperatorSettings
    api: KubeApi
    http: aiohttp.ClientSession
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    tuners: dict[tuple[str, str], ModelTuner] = field(default_factory=dict)
    route_warnings: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # last posted per model
    scrapes: ScrapeScheduler | None = None  # the operator-wide scrape rounds, once started
    cache: WatchCache = field(default_factory=WatchCache)  # owned objects and runtime pods, from watches
    # (reason, message) of a Gateway that refuses a model's HTTPRoute as last read: the canary step holds.
    route_rejections: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # The object our last status write returned, per model: newer than kopf's body until the watch catches up.
    written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    stats_due_at: dict[tuple[str, str], float] = field(default_factory=dict)  # next statistics refresh, monotonic
    refusals: dict[tuple[str, str], Refusals] = field(default_factory=dict)
    memory: MemoryRelease = field(default_factory=MemoryRelease)  # gives pages back after models go
    fleet: FleetSnapshot = field(default_factory=FleetSnapshot)  # nodes and pod GPU claims, shared briefly
    supervisor: Supervisor = field(default_factory=Supervisor)  # runs the operator-wide background loops
    # Runtime pods failing now (uid -> cause), so a pod that starts or stops failing wakes its model at once.
    failing_pods: dict[str, str] = field(default_factory=dict)

    def forget(self, namespace: str, name: str) -> None:
        """Drop every per-model memory when the model's loop ends."""
        key = (namespace, name)
        for per_model in (self.wakeups, self.tuners, self.route_warnings, self.route_rejections, self.written,
                          self.stats_due_at, self.refusals):
            per_model.pop(key, None)
        if self.scrapes is not None:
            self.scrapes.forget(key)
        self.cache.forget(key)
        if not self.wakeups:
            self.fleet.clear()
        self.memory.after_forget()

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakeups.setdefault((namespace, name), asyncio.Event())

    def nudge_by_label(self, namespace: str, model_label: str) -> None:
        """Nudge the model whose (possibly shortened) label value is `model_label`: pods carry only that."""
        for key in [key for key in self.wakeups if key[0] == namespace and label_value(key[1]) == model_label]:
            self.nudge(*key)

    def nudge(self, namespace: str, name: str) -> None:
        """Ask the model's reconcile loop to run now instead of at its next interval."""
        event = self.wakeups.get((namespace, name))
        if event is not None:
            event.set()

    @property
    def evaluation_settings(self) -> Settings:
        return Settings(
            runtime_images=self.settings.runtime_images,
            image_targets=self.settings.image_targets,
            simulator_image=self.settings.simulator_image,
            kv_headroom_fraction=self.settings.kv_headroom_fraction,
            pod=self.settings.pod_settings,
            node_missing_grace_s=self.settings.node_missing_grace_seconds,
        )
