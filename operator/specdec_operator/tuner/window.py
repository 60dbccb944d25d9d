"""Per-pod counter windows: turn successive scrapes into counter increases, aggregated per (pool, revision, K).

Counters restart from zero whenever vLLM restarts, and the tuner restarts vLLM on every K change, so
resets are the normal case here, not an accident. A reset is recognised by any counter going down,
by the `_created` start time changing, by the pod's UID or restart count changing, or by the K its counters
show changing (two known Ks that differ: a K not shown yet, before a pod's first draft, is no change); the scrape
after a reset only sets a new baseline, it never yields a (negative or inflated) delta.

A pod's /metrics is untrusted (spec.runtime.image is the tenant's). Counters are accepted only as vLLM can
produce them: finite, monotone within a process (a decrease is a restart, as above), accepted <= drafted
tokens <= K x drafts, each position accepted at most once per draft, K within the spec's bound, increases no
faster than MAX_EVENTS_PER_SECOND, and histogram bucket layouts that neither change within a process nor
differ between the pods of one revision (one image).

One scrape is not a snapshot: vLLM renders /metrics in a worker thread (a sync route) while its event loop
counts, so a counter late in the body can hold engine steps that one early in it does not. The relations between
counters therefore hold exactly only between a scrape and the next one (every read of the first precedes every
read of the second), and are checked there; within one interval's increases they hold up to what the pod counts
in READ_SKEW_S at that interval's own rate. A lie smaller than that is caught exactly one scrape later, before its
next interval counts.

A pod that breaks any of these is excluded: none of its increases count, for QUARANTINE_S after its last
violation, and `excluded` names it with the reason, for a condition and a metric. Nothing it sends can raise
here, and the other pods' deltas are exactly what they would be without it. Work and memory per scrape are
bounded by the body, not by the values in it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from specdec_operator.tuner.samples import (
    HistogramSnapshot,
    PodSample,
    RequestCounters,
    ScrapeResult,
    ScrapeTarget,
)

# (upper bound in seconds, cumulative count) per `le` bucket, ending at +Inf.
Buckets = tuple[tuple[float, float], ...]

# The fastest any counter we read can grow on one pod: tokens, drafts, requests, latency observations, and
# latency seconds summed (the running batch). An 8-GPU data-parallel pod generates well under 1e6 tokens/s; ten
# times that is still impossible, and with increases this small no sum the tuner keeps can approach float max.
MAX_EVENTS_PER_SECOND = 1e7
# How long a pod stays excluded after its last violation (scraper clock seconds): a pod that keeps lying stays
# out, a one-off heals. Its counters are re-baselined when it comes back, so nothing from the excluded time counts.
QUARANTINE_S = 600.0
# How long reading one /metrics body may take while vLLM goes on counting (a thread the engine's loop preempts on
# a busy node): counters late in the body may be this many seconds of the pod's rate ahead of those early in it.
READ_SKEW_S = 1.0


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
    """Bucket-wise sum of one layout. The windows admit one layout per pool and revision (CounterWindows), so
    layouts differ here only when evidence of another revision or vLLM version meets older evidence: the newer
    side (`right`) is kept alone, as a restart of the histogram. A union of layouts would grow with every
    layout seen, and the work of every later sum with it."""
    if not left or not right:
        return left or right
    if len(left) == len(right) and all(a == b for (a, _), (b, _) in zip(left, right, strict=True)):
        return tuple((bound, a + b) for (bound, a), (_, b) in zip(left, right, strict=True))
    return right


@dataclass(frozen=True)
class _Baseline:
    uid: str
    restart_count: int
    sample: PodSample
    at: float
    revision: tuple[str, str] = ("", "")  # (pool, revision)


@dataclass(frozen=True)
class Exclusion:
    """A pod whose counters vLLM cannot produce: left out of every window until `until` (scraper clock)."""

    pod: str  # namespace/name
    pool: str
    reason: str
    until: float


@dataclass
class WindowReport:
    """What one batch of scrapes contributed: deltas per key, and counts of everything that did not."""

    deltas: dict[WindowKey, WindowDelta] = field(default_factory=dict)
    events: Counter[str] = field(default_factory=Counter)
    violations: dict[str, str] = field(default_factory=dict)  # pod -> what it broke, in this batch


class CounterWindows:
    """Baselines of every scraped pod, by UID. Feed it each batch of scrape results in time order."""

    def __init__(self) -> None:
        self._baselines: dict[str, _Baseline] = {}
        self._excluded: dict[str, Exclusion] = {}  # by pod UID
        # The TPOT bucket bounds of each (pool, revision): one image, one vLLM, one layout.
        self._tpot_layouts: dict[tuple[str, str], tuple[float, ...]] = {}

    @property
    def excluded(self) -> dict[str, Exclusion]:
        """Pods left out now, by UID."""
        return dict(self._excluded)

    def observe(self, results: Iterable[ScrapeResult], *, k_limit: int | None = None) -> WindowReport:
        """`k_limit`: the highest K a pod may run (the spec's maxK, or the pool's K if higher); a pod's own
        annotation may raise it (a pod still rolling from a higher K), its /metrics never does."""
        report = WindowReport()
        for result in results:
            report.events[result.outcome] += 1
            sample = result.sample
            target = result.target
            if sample is not None and sample.violations:
                # Not even a baseline: the next plausible scrape starts afresh.
                self._baselines.pop(target.uid, None)
                self._exclude(target, result.at, "; ".join(sample.violations), report)
                continue
            if result.outcome != "ok" or sample is None or not sample.complete:
                # Keep the old baseline: the next good scrape then covers the gap in one delta.
                continue
            if k_limit is not None and sample.k > max(k_limit, target.k):
                self._baselines.pop(target.uid, None)
                self._exclude(target, result.at, f"runs K={sample.k}, above the spec's maxK {k_limit}", report)
                continue
            shown_k = known_k(sample)
            if shown_k is not None and shown_k != target.k:
                report.events["k_mismatch"] += 1
            # A pod that shows no K yet (it has not drafted) runs the K the operator set on it, not K=0.
            key = WindowKey(target.pool, target.revision, target.k if shown_k is None else shown_k)
            previous = self._baselines.get(target.uid)
            self._baselines[target.uid] = _Baseline(target.uid, target.restart_count, sample, result.at,
                                                    (target.pool, target.revision))
            if (layout := self._layout_mismatch(target, sample)) is not None:
                self._exclude(target, result.at, layout, report)
                continue
            if previous is None:
                report.events["baseline"] += 1
                continue
            reset_reason = _reset_reason(previous, target.restart_count, sample)
            if reset_reason:
                report.events[f"reset_{reset_reason}"] += 1
                continue
            if _layouts(previous.sample) != _layouts(sample):
                # vLLM fixes its buckets at start: a new layout without a restart is not vLLM. The pod's window
                # restarts (the new sample is its baseline) and the pod is named.
                self._exclude(target, result.at, "histogram bucket layout changed without a restart", report)
                continue
            if result.at <= previous.at:
                report.events["out_of_order"] += 1
                self._baselines[target.uid] = previous
                continue
            if (ahead := _ahead_of_the_next_scrape(previous.sample, sample)) is not None:
                self._exclude(target, result.at, ahead, report)
                continue
            delta = _delta(previous.sample, sample, result.at - previous.at)
            if (implausible := _implausible_increase(delta, sample.k, result.at - previous.at)) is not None:
                self._exclude(target, result.at, implausible, report)
                continue
            exclusion = self._excluded.get(target.uid)
            if exclusion is not None:
                if result.at < exclusion.until:
                    report.events["excluded"] += 1
                    continue
                del self._excluded[target.uid]  # served its time and behaved since: back in
            report.deltas[key] = report.deltas[key].plus(delta) if key in report.deltas else delta
        return report

    def _exclude(self, target: ScrapeTarget, at: float, reason: str, report: WindowReport) -> None:
        """Leave the pod out until QUARANTINE_S after now. A pod already out keeps the reason it was first
        excluded for (the condition that names it stays the same while it keeps lying, so status is not
        rewritten at every scrape); this batch's own reason is in the report."""
        reason = reason[:300]
        earlier = self._excluded.get(target.uid)
        kept = earlier.reason if earlier is not None else reason
        self._excluded[target.uid] = Exclusion(target.pod, target.pool, kept, at + QUARANTINE_S)
        report.violations[target.pod] = reason
        report.events["implausible"] += 1

    def _layout_mismatch(self, target: ScrapeTarget, sample: PodSample) -> str | None:
        """Why the pod's TPOT layout is not its revision's, or None. The first pod seen sets the layout; a new
        one is adopted only once no pod of the revision keeps the old (all of them restarted)."""
        histogram = sample.time_per_output_token
        if histogram is None:
            return None
        layout = tuple(bound for bound, _ in histogram.buckets)
        revision = (target.pool, target.revision)
        established = self._tpot_layouts.get(revision)
        if established is None or established == layout:
            self._tpot_layouts[revision] = layout
            return None
        kept = any(
            uid != target.uid and uid not in self._excluded and baseline.revision == revision
            and _tpot_layout(baseline.sample) == established
            for uid, baseline in self._baselines.items()
        )
        if kept:
            return "TPOT bucket layout differs from the other pods of its revision"
        self._tpot_layouts[revision] = layout
        return None

    def forget_except(self, live_uids: Iterable[str]) -> None:
        """Drop baselines and exclusions of pods that no longer exist, so memory follows the fleet."""
        live = set(live_uids)
        for uid in [uid for uid in self._baselines if uid not in live]:
            del self._baselines[uid]
        for uid in [uid for uid in self._excluded if uid not in live]:
            del self._excluded[uid]
        revisions = {baseline.revision for baseline in self._baselines.values()}
        for revision in [revision for revision in self._tpot_layouts if revision not in revisions]:
            del self._tpot_layouts[revision]


def known_k(sample: PodSample) -> int | None:
    """The K the pod's counters show, or None while they show none. vLLM creates one position series per draft
    position at start, so with them K shows from the first scrape (counters at zero included). Without them (a
    vLLM or an export that lacks vllm:spec_decode_num_accepted_tokens_per_pos) K is draft tokens per draft, and
    a pod that has not drafted yet shows no K: that is no evidence of K=0 (speculation off, which shows as no
    spec-decode counters at all), and its first drafts are no change of K."""
    spec = sample.spec
    if spec is not None and not spec.accepted_per_position and not spec.drafts > 0:
        return None
    return sample.k


def _reset_reason(previous: _Baseline, restart_count: int, sample: PodSample) -> str:
    before = previous.sample
    if restart_count != previous.restart_count:
        return "restart_count"
    if sample.created is not None and before.created is not None and sample.created != before.created:
        return "created"
    k_before, k_now = known_k(before), known_k(sample)
    if k_before is not None and k_now is not None and k_before != k_now:
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
            values += [histogram.total, histogram.count]
    requests = sample.requests
    return [*values, requests.finished, requests.errored, requests.http, requests.http_5xx]


def _any_decrease(before: PodSample, after: PodSample) -> bool:
    old, new = _counters(before), _counters(after)
    if len(old) != len(new) or any(b < a for a, b in zip(old, new, strict=True)):
        return True
    # Buckets compare only within one layout; a layout change is judged by the caller.
    return _buckets_decrease(before.inter_token_latency, after.inter_token_latency) or _buckets_decrease(
        before.time_per_output_token, after.time_per_output_token)


def _buckets_decrease(then: HistogramSnapshot | None, now: HistogramSnapshot | None) -> bool:
    if then is None or now is None or _bounds(then) != _bounds(now):
        return False
    return any(b < a for (_, a), (_, b) in zip(then.buckets, now.buckets, strict=True))


def _bounds(histogram: HistogramSnapshot) -> tuple[float, ...]:
    return tuple(bound for bound, _ in histogram.buckets)


def _tpot_layout(sample: PodSample) -> tuple[float, ...] | None:
    return None if sample.time_per_output_token is None else _bounds(sample.time_per_output_token)


def _layouts(sample: PodSample) -> tuple[tuple[float, ...] | None, ...]:
    itl = sample.inter_token_latency
    return (None if itl is None else _bounds(itl), _tpot_layout(sample))


def _implausible_increase(delta: WindowDelta, k: int, seconds: float) -> str | None:
    """Why these increases over `seconds` are not what vLLM can count, or None. Checked on the pod's own delta,
    before it is summed with any other pod's."""
    counts = {
        "drafts": delta.drafts, "draft tokens": delta.draft_tokens, "accepted tokens": delta.accepted,
        "generation tokens": delta.generation_tokens, "inter-token latency seconds": delta.itl_sum,
        "inter-token latencies": delta.itl_count, "finished requests": delta.requests.finished,
        "errored requests": delta.requests.errored, "API requests": delta.requests.http,
        "API 5xx answers": delta.requests.http_5xx,
        "TPOT observations": delta.tpot_buckets[-1][1] if delta.tpot_buckets else 0.0,
    }
    most = MAX_EVENTS_PER_SECOND * seconds
    for name, value in counts.items():
        if not math.isfinite(value) or value > most:
            return f"{name} grew by {value:g} in {seconds:g}s, more than any pod can ({MAX_EVENTS_PER_SECOND:g}/s)"
    if not all(math.isfinite(value) for value in (*delta.accepted_per_position, delta.running_seconds)):
        return "a non-finite increase"
    # The drafts the pod may count while one body is read (the module's docstring), plus one for counters a
    # recording rounded: the counters read after the drafts may be this far ahead of them.
    skew = 1.0 + READ_SKEW_S * max(delta.drafts, 0.0) / seconds
    if delta.accepted > delta.draft_tokens + max(k, 1) * skew:
        return f"{delta.accepted:g} tokens accepted of {delta.draft_tokens:g} drafted in {seconds:g}s"
    if k > 0 and delta.draft_tokens > k * (delta.drafts + skew):
        return f"{delta.draft_tokens:g} draft tokens in {delta.drafts:g} drafts at K={k} in {seconds:g}s"
    if any(count > delta.drafts + skew for count in delta.accepted_per_position):
        return f"a position accepted more often than the {delta.drafts:g} drafts in {seconds:g}s"
    return None


def _ahead_of_the_next_scrape(before: PodSample, after: PodSample) -> str | None:
    """Why `before`'s counters hold more than vLLM had counted when `after` was read, or None. Every read of
    one scrape precedes every read of the next, so vLLM's accounting per draft (K' <= K tokens proposed, a prefix
    of them accepted; vllm/v1/spec_decode/metrics.py) holds exactly between a counter of `before` and one of
    `after`, in whatever order either body was rendered. One draft of slack for counters a recording rounded."""
    if before.spec is None or after.spec is None:
        return None
    then, now = before.spec, after.spec
    k = len(now.accepted_per_position)
    if then.accepted > now.draft_tokens:
        return f"accepted tokens {then.accepted:g} > the next scrape's draft tokens {now.draft_tokens:g}"
    if k and then.draft_tokens > k * (now.drafts + 1):
        return f"draft tokens {then.draft_tokens:g} > K x the next scrape's drafts {now.drafts:g}"
    if any(count > now.drafts + 1 for count in then.accepted_per_position):
        return f"a position accepted more often than the next scrape's {now.drafts:g} drafts"
    return None


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
