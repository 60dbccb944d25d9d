"""Everything this process remembers about one model between reconcile passes, in one home.

Every part is a cache or a pacing aid, rebuilt from the API server after a restart: decisions live in the model's
status (the tuner's state is read back from it), never only here. The part types live here, beside the memory that
holds them, so the steps that fill them (handlers/tuning.py, writes.py, resync.py) and the context that holds the
memory (handlers/context.py) import this module and never each other.

Per-model state elsewhere is a service's working set keyed by the model (the scrape scheduler's targets and rounds,
the watch cache's last-seen spec, the model's metric series); `OperatorContext.forget` is the one path that drops
all of it when the model's loop ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from specdec_operator.canary.evidence import CanaryWindows
from specdec_operator.kube.retry import DownstreamBackoff
from specdec_operator.tuner.engine import TunerState

ModelKey: TypeAlias = tuple[str, str]  # (namespace, name)


@dataclass
class ModelTuner:
    """The tuner's and the canary's windows of one model, and when its loop next scrapes and evaluates."""

    state: TunerState
    next_scrape_at: float = 0.0  # monotonic
    next_evaluation_at: float = 0.0  # monotonic
    canary: CanaryWindows = field(default_factory=CanaryWindows)
    # Pools the last full reconcile saw rolling: a scrape between reconciles keeps their windows closed too.
    rolling: set[str] = field(default_factory=set)


@dataclass
class Refusals:
    """Owned objects of one model the API server refused, with its messages and the retry schedule."""

    backoff: DownstreamBackoff
    messages: dict[str, str] = field(default_factory=dict)  # "Kind/name" -> the server's message
    # "Kind/name" -> why an object under a name we compute is someone else's (left alone, never applied over).
    not_owned: dict[str, str] = field(default_factory=dict)

    def summary(self) -> list[str]:
        return [f"{name}: {message}" for name, message in sorted(self.messages.items())]

    def conflicts(self) -> list[str]:
        return [message for _, message in sorted(self.not_owned.items())]


@dataclass(frozen=True)
class Listing:
    """A model's owned objects and runtime pods as LISTed, with each kind's list resourceVersion."""

    items: Sequence[Mapping[str, Any]] = ()
    versions: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ModelMemory:
    """What this process remembers about one model between reconcile passes."""

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
