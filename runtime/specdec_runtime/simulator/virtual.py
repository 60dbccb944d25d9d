"""Virtual-time replicas: the simulator's engine stepped in-process, with no HTTP and no sleeping.

The tuner benchmark replays hours of a fleet in seconds with these. A replica behaves like one vLLM
process: it serves nothing while loading, its counters start at zero on every (re)start, and
`metrics_text()` is the same Prometheus text the HTTP simulator serves on /metrics.
"""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry

from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.engine import Engine, Speculation
from specdec_runtime.simulator.exposition import EngineExposition, build_registry, exposition_text
from specdec_runtime.simulator.profile import Profile


class ReplicaUnavailable(RuntimeError):
    """The replica is loading its model: a scrape would be refused, as vLLM answers HTTP only once loaded."""


def speculation_from_settings(
    spec: SpeculativeSettings | Speculation | None, *, dynamic_k: bool
) -> Speculation | None:
    """The engine's view of a speculative config; the batch-size table is honoured only when asked to.

    A Speculation passes through unchanged: the HTTP simulator builds one from any vLLM key set.
    """
    if spec is None or isinstance(spec, Speculation):
        return spec
    table = spec.num_speculative_tokens_per_batch_size
    return Speculation(
        num_speculative_tokens=spec.num_speculative_tokens,
        per_batch_size=tuple(table) if dynamic_k and table else None,
    )


class VirtualReplica:
    def __init__(
        self,
        profile: Profile,
        spec: SpeculativeSettings | Speculation | None,
        *,
        model_name: str,
        seed: int,
        start_time: float = 0.0,
        dynamic_k: bool = False,
    ) -> None:
        self.profile = profile
        self.model_name = model_name
        self.dynamic_k = dynamic_k
        self._rng = random.Random(seed)
        self._now = start_time
        self._tokens_of_previous_runs = 0
        self._start(speculation_from_settings(spec, dynamic_k=dynamic_k), start_time)

    def _start(self, speculation: Speculation | None, at: float) -> None:
        self.speculation = speculation
        self.ready_at = at + self.profile.restart_s
        # The engine's clock starts when loading ends; its counters are created then, as in vLLM.
        self._engine = Engine(self.profile, speculation, self._rng, self.ready_at)
        self._registry = build_registry(EngineExposition(self._engine, self.model_name, created=self.ready_at))

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def registry(self) -> CollectorRegistry:
        """The registry behind metrics_text(); the HTTP simulator adds its request counter to it."""
        return self._registry

    @property
    def now(self) -> float:
        return self._now

    @property
    def ready(self) -> bool:
        return self._now >= self.ready_at

    @property
    def k(self) -> int:
        return self.speculation.num_speculative_tokens if self.speculation else 0

    @property
    def generated_tokens(self) -> int:
        """Tokens generated over the replica's whole life, across restarts (unlike the reset counters)."""
        return self._tokens_of_previous_runs + self._engine.counters.generation_tokens

    def advance_to(self, t: float) -> None:
        """Step the engine through every step that finishes by t. Time never goes backwards."""
        if t < self._now:
            raise ValueError(f"virtual time goes forward only: at {self._now}, asked for {t}")
        self._now = t
        if t > self.ready_at:
            self._engine.run_until(t)

    def restart(self, spec: SpeculativeSettings | Speculation | None, at: float) -> None:
        """Restart with a new speculative config at time `at`: counters reset, no serving for restart_s."""
        self.advance_to(at)
        self._tokens_of_previous_runs += self._engine.counters.generation_tokens
        self._start(speculation_from_settings(spec, dynamic_k=self.dynamic_k), at)

    def metrics_text(self) -> str:
        """The /metrics text at the current virtual time. Raises ReplicaUnavailable while loading."""
        if not self.ready:
            raise ReplicaUnavailable(f"replica {self.model_name} loads until t={self.ready_at}")
        return exposition_text(self._registry)
