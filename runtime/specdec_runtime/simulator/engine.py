"""The engine step model shared by the HTTP simulator and virtual time. Pure: no I/O, no clocks.

Each engine step, every one of the B running sequences drafts K tokens, accepts a prefix sampled from
the conditional acceptances and emits that prefix plus one token. A step takes
base_s + per_token_s*B*(K+1) + K*(draft_base_s + draft_per_token_s*B), times the profile's slowdown
fault (1 unless set), times a uniform ±5% jitter.

Steps are timed one by one (so the clock and the latency histograms are exact), but the acceptance
outcomes of a run of steps with the same B, K and acceptances are drawn together: the per-position
counts of M drafts are a chain of binomials, distributed exactly as M separate draws.

A profile may mix kinds of request with their own acceptance (`request_kinds`). Each finished request's slot
takes a new one of a kind drawn by the kinds' shares, so a kind holds batch slots in proportion to its share
times the steps its requests take (output_tokens / E_kind(K)): at a higher K the well-accepted kinds finish in
fewer steps and hold fewer slots. The drafts of a run are split among the kinds by that steady state.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec_runtime.simulator.profile import Profile, RequestKinds
from specdec_runtime.simulator.sampling import accepted_per_position, binomial, rate_at

JITTER = 0.05

# vLLM 0.33 vllm/v1/metrics/buckets.py INTER_TOKEN_LATENCY_BUCKETS, used by both
# vllm:inter_token_latency_seconds and vllm:request_time_per_output_token_seconds.
# tests/contract checks this tuple against the wheel's source.
INTER_TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)

# vllm/v1/metrics/buckets.py TIME_TO_FIRST_TOKEN_BUCKETS (vllm:time_to_first_token_seconds) and
# REQUEST_LATENCY_BUCKETS (vllm:e2e_request_latency_seconds); tests/contract compares the exposed buckets.
TIME_TO_FIRST_TOKEN_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)

BatchSchedule = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Speculation:
    """K and, when honoured, vLLM's num_speculative_tokens_per_batch_size table of (start, end, K)."""

    num_speculative_tokens: int
    per_batch_size: BatchSchedule | None = None

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if self.per_batch_size is not None:
            _check_batch_schedule(self.per_batch_size)

    def k_for_batch(self, batch: int) -> int:
        """vLLM's lookup: inclusive ranges; gaps and the tail carry the previous range's K; capped at K."""
        if self.per_batch_size is None:
            return self.num_speculative_tokens
        ranges = sorted(self.per_batch_size)
        index = bisect.bisect_right([start for start, _, _ in ranges], batch) - 1
        return min(self.num_speculative_tokens, ranges[max(index, 0)][2])


def _check_batch_schedule(schedule: BatchSchedule) -> None:
    # The same rules vLLM applies, so a table the simulator accepts is one vLLM accepts.
    ranges = sorted(schedule)
    if not ranges:
        raise ValueError("num_speculative_tokens_per_batch_size must not be empty")
    previous_end = 0
    for start, end, k in ranges:
        if start <= 0 or end < start or k < 0:
            raise ValueError(f"bad batch-size range ({start}, {end}, {k})")
        if start <= previous_end:
            raise ValueError("batch-size ranges must not overlap")
        previous_end = end
    if ranges[0][0] != 1:
        raise ValueError("the first batch-size range must start at 1")


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last is +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times


@dataclass
class Counters:
    """vLLM's cumulative counters for one engine. Spec-decode ones are meaningful only with speculation."""

    num_positions: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished_requests: int = 0
    errored_requests: int = 0  # finished with finished_reason="error"; not in finished_requests
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_LATENCY_BUCKETS))
    time_per_output_token: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_LATENCY_BUCKETS))
    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TIME_TO_FIRST_TOKEN_BUCKETS))
    e2e_request_latency: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))

    def __post_init__(self) -> None:
        self.accepted_per_position = [0] * self.num_positions


@dataclass(frozen=True)
class LiveStep:
    """What one engine step did for one HTTP request; vLLM counts these per iteration, as the step ends."""

    tokens: int  # emitted by this step: the accepted draft prefix plus one (the prefill's first token)
    drafted: int  # K if the request drafted in this step (the prefill drafts nothing), else 0
    accepted: int  # of those draft tokens, the accepted prefix
    prefill_prompt_tokens: int | None = None  # at the prefill step: its prompt, counted then
    first_token_seconds: float | None = None  # at the prefill step: from arrival (queueing included)
    gap_seconds: float | None = None  # at a decode step: since the step that emitted its previous token


@dataclass(frozen=True)
class LiveOutcome:
    """What one HTTP request did in the engine as a whole, counted when it finishes (vLLM's finished stats)."""

    decode_seconds: float  # from its first token to its last
    generated_tokens: int
    latency_seconds: float  # from its arrival to its last token
    errored: bool


@dataclass
class _Run:
    """The current (B, K, request kinds) and the steps taken with it since the last flush."""

    batch: int  # the profile's virtual sequences, whose tokens this run counts
    k: int
    kinds: RequestKinds
    live: int = 0  # live requests sharing the steps: they make them longer and count their own tokens
    steps: int = 0
    elapsed: float = 0.0


def expected_accepted_length(acceptance: Sequence[float], k: int) -> float:
    """E(K): 1 + expected accepted tokens per draft of length k (tokens emitted per sequence per step)."""
    expected, survive = 1.0, 1.0
    for position in range(k):
        survive *= rate_at(acceptance, position)
        expected += survive
    return expected


def batch_shares(kinds: RequestKinds, k: int) -> list[float]:
    """The share of batch slots (and so of drafts) each kind holds at K: its share of requests times the steps
    one of its requests takes, 1 / E_kind(K) per token (every request has the same output length)."""
    weights = [share / expected_accepted_length(acceptance, k) for share, acceptance in kinds]
    total = sum(weights)
    return [weight / total for weight in weights]


def analytic_tokens_per_second(profile: Profile, acceptance: list[float], batch: int, k: int) -> float:
    """Mean generated tokens/s at batch size B and proposal length K (jitter is symmetric, so it cancels)."""
    return batch * expected_accepted_length(acceptance, k) / profile.step_seconds(batch, k)


class Engine:
    """One vLLM engine driven by the profile's load schedule, stepping on a clock it is handed."""

    def __init__(self, profile: Profile, speculation: Speculation | None, rng: random.Random, start: float):
        self.profile = profile
        self.speculation = speculation
        self.now = start
        self.counters = Counters(num_positions=speculation.num_speculative_tokens if speculation else 0)
        self._rng = rng
        self._run: _Run | None = None
        self._concurrency = 0
        self._running = 0
        self._tokens_in_flight = 0  # generated tokens of running requests not yet summed into a finish
        self._next_step_s: float | None = None  # a step drawn but not yet finished, kept to avoid bias
        self.steps = 0
        # Requests served over HTTP that are in the running batch now (see simulator/live.py): they share every
        # step with the profile's virtual sequences, so each makes the other's steps longer, as in vLLM.
        self.live_running = 0
        self.live_waiting = 0
        self._live_tokens = 0  # prompt + half the output of each live request, for the KV-cache gauge

    @property
    def running(self) -> int:
        return self._running + self.live_running

    @property
    def waiting(self) -> int:
        return self._concurrency - self._running + self.live_waiting

    @property
    def batch(self) -> int:
        """Sequences in the next step: the profile's virtual ones plus live requests."""
        return self.running

    @property
    def kv_cache_usage(self) -> float:
        shape = self.profile.requests
        # A running request holds its prompt and, on average, half of its output.
        used = self._running * (shape.prompt_tokens + shape.output_tokens / 2) + self._live_tokens
        return min(1.0, used / shape.kv_cache_tokens)

    def live_slots(self) -> int:
        """Batch slots left for live requests (max_num_seqs caps virtual and live sequences together)."""
        return max(0, self.profile.requests.max_num_seqs - self.running)

    def live_admitted(self, held_tokens: int) -> None:
        self.live_running += 1
        self._live_tokens += held_tokens

    def live_left(self, held_tokens: int) -> None:
        self.live_running -= 1
        self._live_tokens -= held_tokens

    def record_live_step(self, step: LiveStep) -> None:
        """Count one engine step of one live request as vLLM's output processor and scheduler do, per iteration:
        its tokens, its draft and accepted prefix, and its inter-token latency (at the prefill: its prompt and
        time to first token). A request aborted later keeps what its steps counted, as in vLLM."""
        counters = self.counters
        counters.generation_tokens += step.tokens
        if step.prefill_prompt_tokens is not None:
            counters.prompt_tokens += step.prefill_prompt_tokens
        if step.first_token_seconds is not None:
            counters.time_to_first_token.observe(step.first_token_seconds)
        if step.gap_seconds is not None:
            counters.inter_token_latency.observe(step.gap_seconds)
        if step.drafted and self.speculation is not None:
            counters.drafts += 1
            counters.draft_tokens += step.drafted
            counters.accepted_tokens += step.accepted
            for position in range(min(step.accepted, counters.num_positions)):
                counters.accepted_per_position[position] += 1

    def record_live_finish(self, request: LiveOutcome) -> None:
        """Count one finished live request as vLLM does when it leaves the batch: its outcome and its latencies."""
        counters = self.counters
        if request.errored:
            counters.errored_requests += 1
        else:
            counters.finished_requests += 1
        if request.generated_tokens > 1:
            counters.time_per_output_token.observe(request.decode_seconds / (request.generated_tokens - 1))
        counters.e2e_request_latency.observe(request.latency_seconds)

    def run_until(self, t: float) -> None:
        """Take every step that finishes by t; the counters are complete when this returns."""
        while self.now < t:
            segment, segment_end = self.profile.segment_at(self.now)
            self._admit(segment.concurrency)
            if self._running == 0:
                self.now = min(t, segment_end)
                continue
            k = self.speculation.k_for_batch(self.batch) if self.speculation else 0
            kinds = self.profile.kinds_for(segment)
            run = self._run
            if run is None or (run.batch, run.k, run.kinds, run.live) != (
                    self._running, k, kinds, self.live_running):
                self._flush()
                # A drawn step belongs to its (B, K): a new run draws afresh.
                self._next_step_s = None
                run = self._run = _Run(self._running, k, kinds, live=self.live_running)
            if not self._step_within(run, min(t, segment_end), t):
                break
        self._flush()

    def _step_within(self, run: _Run, last_start: float, t: float) -> bool:
        """Steps starting before last_start and ending by t. False once a step would end after t."""
        mean = self.profile.step_seconds(run.batch + run.live, run.k)
        low, width = mean * (1 - JITTER), mean * 2 * JITTER
        itl = self.counters.inter_token_latency
        # When no bucket bound falls inside the jitter range, every step lands in the same bucket and
        # the per-step bisect can be skipped.
        single_bucket = bisect.bisect_left(itl.bounds, low) == bisect.bisect_left(itl.bounds, low + width)
        random_ = self._rng.random
        now, steps, elapsed = self.now, 0, 0.0
        duration = self._next_step_s if self._next_step_s is not None else low + width * random_()
        while now < last_start:
            if now + duration > t:
                self._next_step_s = duration
                self._commit(run, now, steps, elapsed, single_bucket, low)
                return False
            now += duration
            elapsed += duration
            steps += 1
            if not single_bucket:
                itl.observe(duration, run.batch)
            duration = low + width * random_()
        self._next_step_s = duration
        self._commit(run, now, steps, elapsed, single_bucket, low)
        return True

    def _commit(self, run: _Run, now: float, steps: int, elapsed: float, single_bucket: bool, low: float) -> None:
        self.now = now
        self.steps += steps
        run.steps += steps
        run.elapsed += elapsed
        if single_bucket and steps:
            # inter_token_latency is observed once per running request per step, as in vLLM.
            itl = self.counters.inter_token_latency
            itl.counts[bisect.bisect_left(itl.bounds, low)] += steps * run.batch
            itl.total += elapsed * run.batch

    def _admit(self, concurrency: int) -> None:
        """Closed-loop clients: the running set follows the segment's concurrency, up to max_num_seqs."""
        running = min(concurrency, self.profile.requests.max_num_seqs)
        if running > self._running:
            self.counters.prompt_tokens += (running - self._running) * self.profile.requests.prompt_tokens
        elif running < self._running:
            self._tokens_in_flight = self._tokens_in_flight * running // self._running
        self._concurrency, self._running = concurrency, running

    def _flush(self) -> None:
        """Draw the acceptance outcomes of the pending steps and move every counter."""
        run = self._run
        if run is None or run.steps == 0:
            return
        sequence_steps = run.batch * run.steps
        counters = self.counters
        generated = sequence_steps
        if run.k > 0:
            per_position = [0] * run.k
            for drafts, acceptance in self._drafts_by_kind(run, sequence_steps):
                for position, count in enumerate(accepted_per_position(self._rng, drafts, acceptance, run.k)):
                    per_position[position] += count
            accepted = sum(per_position)
            counters.drafts += sequence_steps
            counters.draft_tokens += sequence_steps * run.k
            counters.accepted_tokens += accepted
            for position, count in enumerate(per_position):
                counters.accepted_per_position[position] += count
            generated += accepted
        counters.generation_tokens += generated
        self._finish_requests(run, generated)
        run.steps, run.elapsed = 0, 0.0

    def _drafts_by_kind(self, run: _Run, drafts: int) -> list[tuple[int, tuple[float, ...]]]:
        """The run's drafts split among its kinds of request by the slots each holds (a multinomial draw)."""
        if len(run.kinds) == 1:
            return [(drafts, run.kinds[0][1])]
        split: list[tuple[int, tuple[float, ...]]] = []
        remaining, remaining_share = drafts, 1.0
        for (_, acceptance), share in zip(run.kinds, batch_shares(run.kinds, run.k), strict=True):
            count = binomial(self._rng, remaining, min(1.0, share / remaining_share)) if remaining_share > 0 else 0
            split.append((count, acceptance))
            remaining, remaining_share = remaining - count, remaining_share - share
        return split

    def _finish_requests(self, run: _Run, generated: int) -> None:
        # Requests are symmetric, so finishes are counted from the pooled output: every output_tokens
        # generated tokens complete one request, whose slot a new request (new prompt) takes at once.
        shape = self.profile.requests
        self._tokens_in_flight += generated
        finished, self._tokens_in_flight = divmod(self._tokens_in_flight, shape.output_tokens)
        if finished == 0:
            return
        counters = self.counters
        # A failed request is one vLLM finishes with FinishReason.ERROR: it ran like the others (its
        # time per output token is observed alike) but ends in an error the client sees as a 500.
        rate = self.profile.faults.error_rate
        errored = sum(1 for _ in range(finished) if self._rng.random() < rate) if rate > 0 else 0
        counters.errored_requests += errored
        counters.finished_requests += finished - errored
        counters.prompt_tokens += finished * shape.prompt_tokens
        tpot = run.elapsed * run.batch / generated
        counters.time_per_output_token.observe(tpot, finished)
        # Symmetric requests: the first token comes from one (prefill) step, the whole request from
        # output_tokens tokens at the run's time per token.
        counters.time_to_first_token.observe(run.elapsed / run.steps, finished)
        counters.e2e_request_latency.observe(tpot * shape.output_tokens, finished)
