"""The load a K must serve: a pool's recent load, and a forecast of the next hour's from it. Pure: no I/O, no clocks.

A gain predicted at the last interval's batch lasts only as long as the load does, and every K change restarts the
pool's pods. So a K is scored over the load forecast for LOAD_LOOKBACK_S (the shortest horizon a K change's restart
is spread over, tuner/policy.py): the current level for as long as it is expected to last, the last lookback's load
for the rest. A level is expected to last as long as the pool's levels have lasted (the median completed run of one
level over LOAD_MEMORY_S), or as long again as it has lasted if that is longer, and as long as the memory reaches
when no level was ever seen to end. A load that flips every few minutes is then served by the K best over its levels
rather than chased; one whose levels last hours, and one never seen to change, by the K best at its current level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

LOAD_LOOKBACK_S = 3600.0
LOAD_MEMORY_S = 6 * 3600.0
# An interval whose batch is within this ratio of a run's first continues that run (one load level).
SAME_LOAD_RATIO = 1.5
# Batches within this ratio are one level of the forecast (bounds the step predictions a decision needs).
LOAD_LEVEL_RATIO = 1.05


@dataclass
class LoadHistory:
    """One pool's load at its current size: the intervals of the last lookback, and how long its levels lasted.
    Bounded: an hour of intervals and six hours of run durations."""

    lookback_s: float = LOAD_LOOKBACK_S
    intervals: list[tuple[float, float, float]] = field(default_factory=list)  # (end, batch, pod-seconds)
    runs: list[tuple[float, float]] = field(default_factory=list)  # (ended at, lasted) of completed runs
    run: tuple[float, float] | None = None  # (started at, first batch) of the current run

    def record(self, at: float, batch: float, pod_seconds: float) -> None:
        """One evaluation interval's mean batch per pod, ending at `at`; an interval not after the last is ignored."""
        if batch <= 0 or not math.isfinite(batch) or (self.intervals and at <= self.intervals[-1][0]):
            return
        if self.run is None:
            self.run = (at, batch)
        elif max(batch, self.run[1]) > SAME_LOAD_RATIO * min(batch, self.run[1]):
            self.runs.append((at, at - self.run[0]))
            self.run = (at, batch)
        self.intervals.append((at, batch, max(pod_seconds, 0.0)))
        self.intervals = [interval for interval in self.intervals if at - interval[0] <= self.lookback_s]
        self.runs = [run for run in self.runs if at - run[0] <= LOAD_MEMORY_S]

    def expected_duration(self, now: float) -> float:
        """How long the current level is expected to last from now."""
        if not self.runs or self.run is None:
            return LOAD_MEMORY_S
        lasted = sorted(duration for _, duration in self.runs)
        return max(lasted[len(lasted) // 2], now - self.run[0])

    def forecast(self, now: float, batch: float) -> tuple[tuple[float, float], ...]:
        """(batch, weight in seconds) levels of the next lookback: `batch` for as long as it is expected to last, the
        last lookback's intervals (by their pod-seconds) for the rest; none for a batch that is no load."""
        if not (batch > 0 and math.isfinite(batch)):
            return ()
        current = min(self.expected_duration(now), self.lookback_s)
        binned: dict[int, tuple[float, float]] = {}

        def add(level: float, weight: float) -> None:
            key = round(math.log(level) / math.log(LOAD_LEVEL_RATIO))
            total, weighted = binned.get(key, (0.0, 0.0))
            binned[key] = (total + weight, weighted + weight * level)

        add(batch, max(current, 1.0))
        seconds = sum(pod_s for _, _, pod_s in self.intervals)
        if current < self.lookback_s and seconds > 0:
            for _, level, pod_s in self.intervals:
                add(level, (self.lookback_s - current) * pod_s / seconds)
        return tuple((weighted / total, total) for total, weighted in (binned[key] for key in sorted(binned)))
