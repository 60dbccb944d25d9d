"""Per-pod counter windows: turn successive scrapes into counter increases, aggregated per (pool, revision, K).

Counters restart from zero whenever vLLM restarts, and the tuner restarts vLLM on every K change, so
resets are the normal case here, not an accident. A reset is recognised by any counter going down,
by the `_created` start time changing, or by the pod's UID or restart count changing; the scrape
after a reset only sets a new baseline, it never yields a (negative or inflated) delta.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from specdec_operator.tuner.samples import HistogramSnapshot, PodSample, RequestCounters, ScrapeResult

# (upper bound in seconds, cumulative count) per `le` bucket, ending at +Inf.
Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True, order=True)
class WindowKey:
    pool: str
    revision: str
    k: int


@dataclass(frozen=True)
class WindowDelta:
    """Counter increases summed over the pods of one key and one or more scrape intervals."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: tuple[float, ...] = ()
    generation_tokens: float = 0.0
    pod_seconds: float = 0.0  # sum over pods of the interval lengths the increases cover
    itl_sum: float = 0.0  # seconds; one inter-token latency per running request per engine step
    itl_count: float = 0.0
    running_seconds: float = 0.0  # num_requests_running gauge x interval, a fallback batch-size signal
    # Increases of vllm:request_time_per_output_token_seconds: one observation per finished request.
    tpot_buckets: Buckets = ()
    requests: RequestCounters = field(default_factory=RequestCounters)

    def plus(self, other: WindowDelta) -> WindowDelta:
        return WindowDelta(
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted=self.accepted + other.accepted,
            accepted_per_position=_add_positions(self.accepted_per_position, other.accepted_per_position),
            generation_tokens=self.generation_tokens + other.generation_tokens,
            pod_seconds=self.pod_seconds + other.pod_seconds,
            itl_sum=self.itl_sum + other.itl_sum,
            itl_count=self.itl_count + other.itl_count,
            running_seconds=self.running_seconds + other.running_seconds,
            tpot_buckets=_add_buckets(self.tpot_buckets, other.tpot_buckets),
            requests=RequestCounters(
                finished=self.requests.finished + other.requests.finished,
                errored=self.requests.errored + other.requests.errored,
                http=self.requests.http + other.requests.http,
                http_5xx=self.requests.http_5xx + other.requests.http_5xx,
            ),
        )

    def scaled(self, factor: float) -> WindowDelta:
        """Every count multiplied by `factor`: exponential forgetting of old evidence."""
        return WindowDelta(
            drafts=self.drafts * factor,
            draft_tokens=self.draft_tokens * factor,
            accepted=self.accepted * factor,
            accepted_per_position=tuple(value * factor for value in self.accepted_per_position),
            generation_tokens=self.generation_tokens * factor,
            pod_seconds=self.pod_seconds * factor,
            itl_sum=self.itl_sum * factor,
            itl_count=self.itl_count * factor,
            running_seconds=self.running_seconds * factor,
            tpot_buckets=tuple((bound, count * factor) for bound, count in self.tpot_buckets),
            requests=RequestCounters(
                finished=self.requests.finished * factor,
                errored=self.requests.errored * factor,
                http=self.requests.http * factor,
                http_5xx=self.requests.http_5xx * factor,
            ),
        )

    @property
    def mean_batch(self) -> float | None:
        """Mean running sequences per pod: summed per-step latencies over wall time (Little's law)."""
        if self.pod_seconds <= 0:
            return None
        if self.itl_count > 0:
            return self.itl_sum / self.pod_seconds
        return self.running_seconds / self.pod_seconds if self.running_seconds > 0 else None

    @property
    def mean_step_s(self) -> float | None:
        return self.itl_sum / self.itl_count if self.itl_count > 0 else None

    @property
    def tokens_per_pod_second(self) -> float | None:
        return self.generation_tokens / self.pod_seconds if self.pod_seconds > 0 else None


def _add_positions(left: tuple[float, ...], right: tuple[float, ...]) -> tuple[float, ...]:
    # Pools mix K values only within one key's K, so lengths agree; pad defensively anyway.
    size = max(len(left), len(right))
    padded_left = left + (0.0,) * (size - len(left))
    padded_right = right + (0.0,) * (size - len(right))
    return tuple(a + b for a, b in zip(padded_left, padded_right, strict=True))


def _add_buckets(left: Buckets, right: Buckets) -> Buckets:
    """Bucket-wise sum. Layouts differ only across vLLM versions; then the union of the bounds is
    used, each side counting at a bound what it counted at its next lower one (a lower bound
    on the true count, which keeps the sum cumulative)."""
    if not left or not right:
        return left or right
    if [bound for bound, _ in left] == [bound for bound, _ in right]:
        return tuple((bound, a + b) for (bound, a), (_, b) in zip(left, right, strict=True))
    bounds = sorted({bound for bound, _ in left} | {bound for bound, _ in right})
    return tuple((bound, _cumulative_at(left, bound) + _cumulative_at(right, bound)) for bound in bounds)


def _cumulative_at(buckets: Buckets, bound: float) -> float:
    return max((count for upper, count in buckets if upper <= bound), default=0.0)


@dataclass(frozen=True)
class _Baseline:
    uid: str
    restart_count: int
    sample: PodSample
    at: float


@dataclass
class WindowReport:
    """What one batch of scrapes contributed: deltas per key, and counts of everything that did not."""

    deltas: dict[WindowKey, WindowDelta] = field(default_factory=dict)
    events: Counter[str] = field(default_factory=Counter)


class CounterWindows:
    """Baselines of every scraped pod, by UID. Feed it each batch of scrape results in time order."""

    def __init__(self) -> None:
        self._baselines: dict[str, _Baseline] = {}

    def observe(self, results: Iterable[ScrapeResult]) -> WindowReport:
        report = WindowReport()
        for result in results:
            report.events[result.outcome] += 1
            sample = result.sample
            if result.outcome != "ok" or sample is None or not sample.complete:
                # Keep the old baseline: the next good scrape then covers the gap in one delta.
                continue
            target = result.target
            if sample.k != target.k:
                report.events["k_mismatch"] += 1
            key = WindowKey(target.pool, target.revision, sample.k)
            previous = self._baselines.get(target.uid)
            self._baselines[target.uid] = _Baseline(target.uid, target.restart_count, sample, result.at)
            if previous is None:
                report.events["baseline"] += 1
                continue
            reset_reason = _reset_reason(previous, target.restart_count, sample)
            if reset_reason:
                report.events[f"reset_{reset_reason}"] += 1
                continue
            if result.at <= previous.at:
                report.events["out_of_order"] += 1
                self._baselines[target.uid] = previous
                continue
            delta = _delta(previous.sample, sample, result.at - previous.at)
            report.deltas[key] = report.deltas[key].plus(delta) if key in report.deltas else delta
        return report

    def forget_except(self, live_uids: Iterable[str]) -> None:
        """Drop baselines of pods that no longer exist, so memory follows the fleet."""
        live = set(live_uids)
        for uid in [uid for uid in self._baselines if uid not in live]:
            del self._baselines[uid]


def _reset_reason(previous: _Baseline, restart_count: int, sample: PodSample) -> str:
    before = previous.sample
    if restart_count != previous.restart_count:
        return "restart_count"
    if sample.created is not None and before.created is not None and sample.created != before.created:
        return "created"
    if sample.k != before.k:
        return "k_changed"
    if _any_decrease(before, sample):
        return "counter_decrease"
    return ""


def _counters(sample: PodSample) -> list[float]:
    values = [sample.generation_tokens or 0.0]
    if sample.spec:
        spec = sample.spec
        values += [spec.drafts, spec.draft_tokens, spec.accepted, *spec.accepted_per_position]
    for histogram in (sample.inter_token_latency, sample.time_per_output_token):
        if histogram:
            values += [histogram.total, histogram.count, *(count for _, count in histogram.buckets)]
    requests = sample.requests
    return [*values, requests.finished, requests.errored, requests.http, requests.http_5xx]


def _any_decrease(before: PodSample, after: PodSample) -> bool:
    old, new = _counters(before), _counters(after)
    return len(old) != len(new) or any(b < a for a, b in zip(old, new, strict=True))


def _delta(before: PodSample, after: PodSample, seconds: float) -> WindowDelta:
    itl = _histogram_delta(before.inter_token_latency, after.inter_token_latency)
    tpot = _histogram_delta(before.time_per_output_token, after.time_per_output_token)
    running = after.requests_running or 0.0
    old_requests, new_requests = before.requests, after.requests
    delta = WindowDelta(
        generation_tokens=(after.generation_tokens or 0.0) - (before.generation_tokens or 0.0),
        pod_seconds=seconds,
        itl_sum=itl.total if itl else 0.0,
        itl_count=itl.count if itl else 0.0,
        running_seconds=running * seconds,
        tpot_buckets=tpot.buckets if tpot else (),
        requests=RequestCounters(
            finished=new_requests.finished - old_requests.finished,
            errored=new_requests.errored - old_requests.errored,
            http=new_requests.http - old_requests.http,
            http_5xx=new_requests.http_5xx - old_requests.http_5xx,
        ),
    )
    if before.spec is None or after.spec is None:
        return delta
    old, new = before.spec, after.spec
    per_position = tuple(b - a for a, b in zip(old.accepted_per_position, new.accepted_per_position, strict=True))
    return replace(
        delta,
        drafts=new.drafts - old.drafts,
        draft_tokens=new.draft_tokens - old.draft_tokens,
        accepted=new.accepted - old.accepted,
        accepted_per_position=per_position,
    )


def _histogram_delta(before: HistogramSnapshot | None, after: HistogramSnapshot | None) -> HistogramSnapshot | None:
    if before is None or after is None:
        return None
    return after.minus(before)
