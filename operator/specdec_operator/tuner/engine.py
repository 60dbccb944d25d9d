"""`TunerState`: the tuner of one SpeculativeModel, fed scrapes and asked for decisions by the reconciler.

It ties the counter windows, the acceptance estimator, each pool's step-cost model and the policy
together. Everything it remembers is either re-learnable from the counters (they simply re-window
after an operator restart) or kept in status: the effective K per pool (handed in on every call),
and the last decision (its time drives the cooldown, its fromK and action the hysteresis), see `from_status`.

Times handed to the tuner are monotonic seconds; only `from_status` translates a wall-clock stamp.
A decision is a proposal until `commit`: the reconciler commits it only after the decision is in status,
so a failed write leaves the tuner exactly where the cluster is.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from specdec_operator.api.spec import Speculation
from specdec_operator.api.status import PoolSpeculationStats, SpeculationStatus, TuningDecision
from specdec_operator.decisions.legal_k import legal_ks
from specdec_operator.timestamps import stamp_seconds
from specdec_operator.tuner.costmodel import StepCostModel
from specdec_operator.tuner.estimator import EVIDENCE_FLOOR, estimate_acceptance, position_rates
from specdec_operator.tuner.loadforecast import LOAD_LOOKBACK_S, LoadHistory
from specdec_operator.tuner.policy import LoadLevel, PoolEvidence, RestartCost, decide
from specdec_operator.tuner.samples import ScrapeResult
from specdec_operator.tuner.window import CounterWindows, Exclusion, WindowDelta, WindowReport

# Acceptance follows the traffic mix, which can shift within minutes; older evidence halves this fast.
ACCEPTANCE_HALF_LIFE_S = 180.0
# Step costs depend on hardware and batch size only, so they are remembered much longer.
COST_HALF_LIFE_S = 7200.0
# Why a pool's decision window started afresh (specdec_tuner_window_restarts_total): its size changed, its K
# changed, its drafter changed, or its pods began to roll (the window stays closed until they are all up).
RESTART_CAUSES = ("resize", "k_change", "drafter", "rollout")


@dataclass(frozen=True)
class PoolContext:
    """What the reconciler knows about a pool when it asks the tuner."""

    name: str
    gfx_target: str
    drafter_method: str
    effective_k: int
    drafter_model: str | None = None
    drafter_mtp_layers: int | None = None  # mtp: bounds the Ks vLLM accepts (decisions.legal_k)
    replicas: int = 1
    gpus_per_replica: int = 1
    rolling: bool = False  # the pool's pods are still being replaced (a K change in flight)
    # Ks whose canary failed against this pool's current revision -> the gain predicted for them then
    # (status.speculation.rejectedKs, tuner/policy.py).
    rejected: Mapping[int, float] = field(default_factory=dict)
    # Observed seconds from pod start to Ready (reconcile/tuning_inputs.py pool_ready_seconds); None: none seen.
    ready_s: float | None = None
    # Replicas a rollout of the pool takes out of service at once (0: it surges); what a K change's restart costs.
    out_at_once: int = 1


@dataclass(frozen=True)
class PoolWindow:
    """What a pool's next decision rests on: the samples at its current K since its window last started."""

    samples: float  # drafts (engine steps at K=0) counted in the window; the policy needs minSamples of them
    started_at: float  # monotonic: when the window last started (it moves on while the pool's pods roll)
    restarts: Mapping[str, int] = field(default_factory=dict)  # cause -> restarts since the previous report


@dataclass(frozen=True)
class TunerReport:
    stats: tuple[PoolSpeculationStats, ...]
    decisions: tuple[TuningDecision, ...]  # one per pool, holds included, each with its evidence
    decision: TuningDecision | None  # the single Change or Explore to carry out now, if any
    scrape_events: Mapping[str, int]  # outcomes and window events since the last evaluation
    effective_k: Mapping[str, int] = field(default_factory=dict)  # pool -> the K its stats were measured at
    windows: Mapping[str, PoolWindow] = field(default_factory=dict)  # pool -> its decision window
    min_samples: int | None = None  # samples a window needs before the policy weighs a change
    # pool -> the restart cost its K change was weighed against (tuner/policy.py), for pools that weighed one
    restart_costs: Mapping[str, RestartCost] = field(default_factory=dict)


@dataclass
class _PoolHistory:
    drafter: tuple[str, str | None]
    cost: StepCostModel
    by_k: dict[int, WindowDelta] = field(default_factory=dict)  # decayed acceptance evidence
    recent: dict[int, WindowDelta] = field(default_factory=dict)  # since the last evaluation (stats)
    fresh: dict[int, WindowDelta] = field(default_factory=dict)  # since the last evaluation, inside the window
    fresh_at: float = 0.0  # when the newest of them was scraped
    fresh_rounds: Counter[int] = field(default_factory=Counter)  # K -> scrape rounds summed in `fresh`
    k: int | None = None  # effective K the samples below belong to
    samples: float = 0.0  # drafts (engine steps at K=0) at `k` inside the window
    previous_k: int | None = None
    decayed_at: float | None = None
    replicas: int | None = None  # the pool's size the samples above were taken at
    window_started: float = 0.0  # monotonic; only scrape intervals that begin at or after it count
    round_began: float | None = None  # the first scrape of the pool's previous round: where the next round's
    # increases begin
    held: bool = False  # its pods were rolling at the last look: the window stays closed
    restarts: Counter[str] = field(default_factory=Counter)  # window restarts by cause, not yet reported
    load: LoadHistory = field(default_factory=LoadHistory)  # at the pool's current size (tuner/loadforecast.py)


class TunerState:
    def __init__(
        self,
        *,
        last_change_at: float | None = None,
        previous_k: Mapping[str, int] | None = None,
        explored: Mapping[str, tuple[int, int]] | None = None,
        acceptance_half_life_s: float = ACCEPTANCE_HALF_LIFE_S,
        cost_half_life_s: float = COST_HALF_LIFE_S,
        load_lookback_s: float = LOAD_LOOKBACK_S,
    ) -> None:
        self.last_change_at = last_change_at
        self._previous_k = dict(previous_k or {})
        # pool -> (from K, to K) of its last committed decision when that was an Explore: a return from the
        # explored K is the exploration's answer, not a flip back (policy.RETURN_GAIN_FACTOR).
        self._explored = dict(explored or {})
        self._acceptance_half_life_s = acceptance_half_life_s
        self._cost_half_life_s = cost_half_life_s
        self._load_lookback_s = load_lookback_s
        self._windows = CounterWindows()
        self._pools: dict[str, _PoolHistory] = {}
        self._events: Counter[str] = Counter()
        self._recent_since: float | None = None
        # The K change the last evaluation proposed, until one is committed: what a change freeze holds back
        # between evaluations (reconcile/freeze.py). Memory only: nothing decides from it.
        self.proposed: TuningDecision | None = None

    @classmethod
    def from_status(cls, status: SpeculationStatus, *, wall_now: float, monotonic_now: float) -> TunerState:
        """Rebuild after an operator restart: cooldown and hysteresis come back from status.

        The decision's wall-clock stamp becomes a point on the monotonic clock (its age is kept).
        """
        decision = status.last_decision
        stamp = _parse_time(decision.time) if decision is not None and decision.action != "Hold" else None
        last_change = None if stamp is None else monotonic_now - max(0.0, wall_now - stamp)
        previous = {decision.pool: decision.from_k} if decision and decision.action != "Hold" else {}
        explored = {decision.pool: (decision.from_k, decision.to_k)} if decision and decision.action == "Explore" \
            else {}
        return cls(last_change_at=last_change, previous_k=previous, explored=explored)

    def observe(
        self,
        pools: Sequence[PoolContext],
        results: Sequence[ScrapeResult],
        now: float | None = None,
        *,
        max_k: int | None = None,
    ) -> WindowReport:
        """Take one round of scrapes. Bad scrapes are counted and otherwise ignored; pods whose counters vLLM
        cannot produce are left out (`excluded_pods`).

        `now` is when the caller looks (default: the newest scrape). A change of a pool seen now restarts its
        window now: the round may have been scraped before the change and taken after it. `max_k`: the spec's
        maxK; no pod's /metrics makes a K above it (or above its pool's current K) count.
        """
        k_limit = None if max_k is None else max([max_k, *(pool.effective_k for pool in pools)])
        report = self._windows.observe(results, k_limit=k_limit)
        self._events.update(report.events)
        self._windows.forget_except(result.target.uid for result in results)
        if not results:
            return report
        at = max(result.at for result in results)
        if self._recent_since is None:
            self._recent_since = min(result.at for result in results)
        looked = at if now is None else max(now, at)
        contexts = {pool.name: pool for pool in pools}
        # A round's increases begin where the pool's previous round scraped: they count towards a decision only
        # when all of that round was inside the pool's current window, so no increase that straddles a restart does.
        fresh: dict[str, bool] = {}
        began: dict[str, float] = {}
        for result in results:
            if result.target.pool in contexts:
                began[result.target.pool] = min(result.at, began.get(result.target.pool, result.at))
        for name in sorted(began):
            history = self._history(contexts[name], looked)
            fresh[name] = history.round_began is not None and history.round_began >= history.window_started
        for key, delta in sorted(report.deltas.items()):
            context = contexts.get(key.pool)
            if context is None:
                self._events["unknown_pool"] += 1
                continue
            history = self._history(context, looked)
            self._forget(history, at)
            history.by_k[key.k] = history.by_k[key.k].plus(delta) if key.k in history.by_k else delta
            history.recent[key.k] = history.recent[key.k].plus(delta) if key.k in history.recent else delta
            if not fresh.get(key.pool, False):
                continue
            history.fresh[key.k] = history.fresh[key.k].plus(delta) if key.k in history.fresh else delta
            history.fresh_at = at
            history.fresh_rounds[key.k] += 1
            if key.k == history.k:
                history.samples += delta.drafts if key.k > 0 else delta.itl_count
        for name, first in began.items():
            self._pools[name].round_began = first
        return report

    def evaluate(self, now: float, pools: Sequence[PoolContext], speculation: Speculation) -> TunerReport:
        """Per-pool stats and at most one proposed decision; nothing about K is remembered until `commit`."""
        for history in self._pools.values():
            _learn_step_costs(history)
        evidence = [self._evidence(pool, speculation, now) for pool in pools]
        outcome = decide(evidence, speculation, now=now, last_change_at=self.last_change_at)
        recommended = {a.pool: a.recommended_k for a in outcome.assessments}
        span = now - self._recent_since if self._recent_since is not None else 0.0
        stats = tuple(self._stats(pool, recommended.get(pool.name), span, now) for pool in pools)
        windows = {pool.name: self._window(pool.name) for pool in pools}
        self.proposed = outcome.decision
        report = TunerReport(
            stats=stats,
            decisions=tuple(a.decision for a in outcome.assessments),
            decision=outcome.decision,
            scrape_events=dict(self._events),
            effective_k={pool.name: pool.effective_k for pool in pools},
            windows=windows,
            min_samples=speculation.autotune.min_samples,
            restart_costs={a.pool: a.restart_cost for a in outcome.assessments if a.restart_cost is not None},
        )
        for history in self._pools.values():
            history.recent, history.fresh = {}, {}
        self._events = Counter()
        self._recent_since = now
        # Pools the model no longer has take their histories with them.
        names = {pool.name for pool in pools}
        for gone in [name for name in self._pools if name not in names]:
            del self._pools[gone]
        for gone in [name for name in self._previous_k if name not in names]:
            del self._previous_k[gone]
        for gone in [name for name in self._explored if name not in names]:
            del self._explored[gone]
        return report

    @property
    def exclusions(self) -> dict[str, Exclusion]:
        """The pods left out now, by UID, with their pool and reason."""
        return self._windows.excluded

    def excluded_pods(self) -> dict[str, str]:
        """Pods whose counters vLLM cannot produce, left out of every window now: pod (namespace/name) -> why."""
        return {exclusion.pod: exclusion.reason for exclusion in self._windows.excluded.values()}

    def pools_held(self) -> set[str]:
        """The pools the tuner keeps a history for."""
        return set(self._pools)

    def ks_held(self) -> set[int]:
        """Every K some pool keeps evidence for (bounded by the spec's maxK, not by what pods show)."""
        return {k for history in self._pools.values()
                for by_k in (history.by_k, history.recent, history.fresh) for k in by_k}

    def histogram_buckets_held(self) -> int:
        """The most TPOT buckets any one kept histogram has: one layout per pool, so never more than vLLM's."""
        return max((len(delta.tpot_buckets) for history in self._pools.values()
                    for by_k in (history.by_k, history.recent, history.fresh) for delta in by_k.values()), default=0)

    def commit(self, decision: TuningDecision, now: float) -> None:
        """The decision is durable (in status): start its cooldown and remember the K it left.

        The window is not restarted here: the pool still runs the K it left until the decision rolls out (at
        once with strategy Rolling, at the canary's promotion with Canary, never after a rollback). `_history`
        restarts it, once, when the pool's effective K changes.
        """
        history = self._pools.get(decision.pool)
        self.last_change_at = now
        self.proposed = None
        self._previous_k[decision.pool] = decision.from_k
        if decision.action == "Explore":
            self._explored[decision.pool] = (decision.from_k, decision.to_k)
        else:
            self._explored.pop(decision.pool, None)
        if history is not None:
            history.previous_k = decision.from_k

    def _history(self, pool: PoolContext, at: float) -> _PoolHistory:
        """The pool's history, its window restarted first if the pool changed since the last look at `at`."""
        drafter = (pool.drafter_method, pool.drafter_model)
        history = self._pools.get(pool.name)
        if history is None or history.drafter != drafter:
            # A different drafter accepts differently and costs differently: start over.
            cost = StepCostModel(pool.gfx_target, pool.drafter_method, half_life_s=self._cost_half_life_s)
            fresh = _PoolHistory(drafter, cost, k=pool.effective_k, replicas=pool.replicas, window_started=at,
                                 load=LoadHistory(self._load_lookback_s))
            if history is not None:
                fresh.restarts = history.restarts
                fresh.load = history.load  # the load does not depend on the drafter
                fresh.restarts["drafter"] += 1
            history = self._pools[pool.name] = fresh
        if history.k != pool.effective_k:
            # The pool's K changed: a decision rolled out (or its canary promoted), the spec was edited, or a
            # canary rolled back.
            history.previous_k, history.k = history.k, pool.effective_k
            _restart(history, "k_change", at)
        if history.replicas != pool.replicas:
            # A resize moves the batch each pod runs, and with it the best K: the window starts afresh at the new
            # size, so no decision rests on samples that straddle the resize.
            history.replicas = pool.replicas
            history.load = LoadHistory(self._load_lookback_s)  # each pod's share of the load moved with the size
            _restart(history, "resize", at)
        if pool.rolling:
            # Pods still starting or being replaced: what is counted now is not the settled pool's load. The
            # window stays closed (restarting at every look) until they are all up; the episode counts once.
            _restart(history, "rollout", at, count=not history.held)
        history.held = pool.rolling
        return history

    def _window(self, pool: str) -> PoolWindow:
        history = self._pools[pool]
        window = PoolWindow(history.samples, history.window_started, dict(history.restarts))
        history.restarts = Counter()
        return window

    def _forget(self, history: _PoolHistory, at: float) -> None:
        if history.decayed_at is not None and at > history.decayed_at:
            factor = 0.5 ** ((at - history.decayed_at) / self._acceptance_half_life_s)
            # Evidence decayed to nothing is dropped: kept, it reaches magnitudes whose squares underflow to zero.
            history.by_k = {k: scaled for k, delta in history.by_k.items()
                            if _weighs(scaled := delta.scaled(factor))}
        if history.decayed_at is None or at > history.decayed_at:
            history.decayed_at = at

    def _evidence(self, pool: PoolContext, speculation: Speculation, now: float) -> PoolEvidence:
        history = self._history(pool, now)
        # The batch comes from the window. With nothing fresh since the last evaluation but something recent, the
        # window restarted since then, so it has no samples yet and the policy holds on that: the straddling batch
        # only fills in the hold's evidence.
        recent = _sum((history.fresh or history.recent).values())
        batch = recent.mean_batch if recent is not None else None
        k_range = range(speculation.min_k, speculation.max_k + 1)
        levels: tuple[tuple[float, float], ...] = ()
        if batch is not None and recent is not None and batch > 0 and math.isfinite(batch):
            history.load.record(now, batch, recent.pod_seconds)
            levels = history.load.forecast(now, batch)
        predicted = history.cost.predict_at([batch, *(level for level, _ in levels)], k_range) if batch is not None \
            else [{}]
        steps = predicted[0]
        loads = tuple(LoadLevel(level, weight, at_level)
                      for (level, weight), at_level in zip(levels, predicted[1:], strict=True))
        previous = history.previous_k if history.previous_k is not None else self._previous_k.get(pool.name)
        return PoolEvidence(
            pool=pool.name,
            current_k=pool.effective_k,
            samples_at_k=history.samples,
            window_s=max(now - history.window_started, 0.0),
            batch=batch,
            acceptance=estimate_acceptance(history.by_k, pool.drafter_method),
            steps=steps,
            previous_k=previous,
            explored=previous is not None and self._explored.get(pool.name) == (previous, pool.effective_k),
            weight=float(pool.replicas * pool.gpus_per_replica),
            rolling=pool.rolling,
            legal_ks=legal_ks(pool.drafter_method, pool.drafter_mtp_layers, speculation.min_k, speculation.max_k),
            rejected=dict(pool.rejected),
            replicas=pool.replicas,
            ready_s=pool.ready_s,
            out_at_once=pool.out_at_once,
            loads=loads,
        )

    def _stats(self, pool: PoolContext, recommended_k: int | None, span: float, now: float) -> PoolSpeculationStats:
        history = self._history(pool, now)
        k = pool.effective_k
        at_k = history.recent.get(k) or history.by_k.get(k)
        everything = _sum(history.recent.values())
        tokens_per_second = everything.generation_tokens / span if everything is not None and span > 0 else None
        if at_k is None or at_k.drafts <= 0:
            return PoolSpeculationStats(
                pool=pool.name,
                drafts=_count(history.samples) if k > 0 else 0,
                tokens_per_second=_round(tokens_per_second),
                recommended_k=recommended_k,
            )
        return PoolSpeculationStats(
            pool=pool.name,
            drafts=_count(history.samples),
            acceptance_rate=_round(at_k.accepted / at_k.draft_tokens if at_k.draft_tokens > 0 else None),
            mean_accepted_length=_round(1 + at_k.accepted / at_k.drafts),
            per_position_acceptance=[round(rate, 4) for rate in position_rates(at_k)],
            tokens_per_second=_round(tokens_per_second),
            recommended_k=recommended_k,
        )


def _learn_step_costs(history: _PoolHistory) -> None:
    """One step-cost row per K from everything fresh since the last evaluation.

    B is latencies over wall time, and the wall time comes from scrape stamps that lag the counters by however
    long the answer took: on a busy node a few hundred ms in a 2 s interval. Per-scrape rows carry that error
    whole, and rows whose B scatters while the step time does not bend the fit enough to promise a K a gain its
    canary then fails to show. Summed over an evaluation interval the same lag is a few percent. Only settled
    rows count (the window's rule), since the model remembers them for hours.
    """
    for k, delta in sorted(history.fresh.items()):
        if delta.mean_batch is not None and delta.mean_step_s is not None:
            history.cost.observe(history.fresh_at, k, delta.mean_batch, delta.mean_step_s, history.fresh_rounds[k])
    history.fresh_rounds = Counter()


def _restart(history: _PoolHistory, cause: str, at: float, *, count: bool = True) -> None:
    """Start the pool's decision window afresh at `at`: nothing counted before it feeds a decision."""
    history.samples, history.fresh, history.window_started = 0.0, {}, at
    history.fresh_rounds = Counter()
    if count:
        history.restarts[cause] += 1


def _sum(deltas: Iterable[WindowDelta]) -> WindowDelta | None:
    total: WindowDelta | None = None
    for delta in deltas:
        total = delta if total is None else total.plus(delta)
    return total


def _round(value: float | None) -> float | None:
    """For status: a figure that is not finite is no figure (the API server refuses NaN and Infinity)."""
    return None if value is None or not math.isfinite(value) else round(value, 4)


def _count(value: float) -> int:
    return int(value) if math.isfinite(value) and value > 0 else 0


def _weighs(delta: WindowDelta) -> bool:
    return max(delta.drafts, delta.generation_tokens, delta.itl_count, delta.pod_seconds) >= EVIDENCE_FLOOR


def _parse_time(text: str) -> float | None:
    try:
        return stamp_seconds(text)
    except ValueError:
        return None
