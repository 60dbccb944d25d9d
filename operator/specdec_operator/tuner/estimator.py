"""Acceptance estimates from vLLM's per-position counters, with their uncertainty.

For chain drafters (eagle, eagle3, mtp, draft_model, ngram) the counters give, for every K' <= K, the chain
1 + sum_{i<K'} A_i / N, with N drafts and A_i the drafts whose first i+1 tokens were accepted. Beyond the
observed K we extrapolate with the last conditional acceptance and say how unsure that is. The chain is the
mean accepted length at K' of the drafts taken at K; at K' the same requests draft in other proportions (one
that accepts little takes more steps per token, by how much depends on K), so the chain is re-weighted to K'
for the mix of requests the rates show (tuner/composition.py): on half code and half chat, read at K 5, the
chain puts E(1) 6% low. Block drafters (dflash, dspark) propose a block at once, so their position counters
say nothing about another K: only K values actually measured are known.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from specdec_operator.api.vocabulary import BLOCK_DRAFTERS
from specdec_operator.tuner.composition import FITTED_POSITIONS, Mix, acceptance_mix, length_factor
from specdec_operator.tuner.window import WindowDelta

Z_95 = 1.96
# Extra standard deviation of the conditional acceptance assumed at positions never observed. Real
# drafters' acceptance usually decays with depth, so carrying the last position forward is a guess.
EXTRAPOLATION_SD = 0.08
# Below this share of full-length drafts (draft_tokens / (drafts * K)) drafts are "short": n-gram
# misses or grammar cut them, so deeper positions were rarely even proposed.
FULL_DRAFT_SHARE = 0.98
# A position counts as observed only while the windows that reach it hold at least this share of all
# (decayed) drafts. After K is lowered, the deeper positions live on only in old windows; once those
# have faded they describe a traffic mix that may be gone. They are not dropped for a blind extrapolation
# from the fresh shallow positions, though: a drafter trained for a horizon accepts well up to it and
# poorly past it, and forgetting that the depth was measured poor sends the pool back to it as soon as
# the old window fades (a flap every few minutes). A faded position keeps its old rate, moved by as much
# as the traffic moved since (`_faded_positions`).
FRESH_COVERAGE = 0.2
# Conditional acceptance is moved on the log-odds scale, kept this far inside (0, 1) so it stays finite.
ODDS_CLAMP = 1e-3
# Decayed counts below this are no evidence at all (a millionth of a draft). Evidence halves every few minutes:
# a day after a pool left a K its counts reach 1e-160, where squaring them underflows to zero.
EVIDENCE_FLOOR = 1e-6


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float

    @property
    def sd(self) -> float:
        return (self.high - self.low) / (2 * Z_95)


def wilson_interval(successes: float, trials: float, z: float = Z_95) -> Interval:
    """Wilson score interval of a proportion; counts may be fractional (decayed evidence). Total: fewer than
    EVIDENCE_FLOOR trials (or a count that is not a number) say nothing, and the proportion is clamped to [0, 1]."""
    if not (trials >= EVIDENCE_FLOOR and math.isfinite(trials) and math.isfinite(successes)):
        return Interval(0.5, 0.0, 1.0)
    p = min(max(successes / trials, 0.0), 1.0)
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class AcceptanceEstimate:
    """Conditional acceptance per position, pooled over every K observed, and what it implies for E(K')."""

    conditional: tuple[Interval, ...]  # alpha_i = P(accept i | accepted 0..i-1)
    drafts: float
    draft_share: float  # draft_tokens / (drafts * K) at the observed K values; 1.0 means full-length drafts
    opaque: bool  # block drafter: positions are not a chain
    measured_lengths: Mapping[int, Interval]  # E(K) measured directly at each K observed
    mix: Mix = ()  # the requests the rates show (composition.py), read at mix_read_at; () or one kind: no mix
    mix_read_at: int = 0
    # Positions past the observed ones that older windows measured (FRESH_COVERAGE), carried to today's traffic
    faded: tuple[Interval, ...] = ()

    @property
    def observed_k(self) -> int:
        return len(self.conditional)

    @property
    def short_drafts(self) -> bool:
        return self.draft_share < FULL_DRAFT_SHARE

    def expected_length(self, k: int) -> Interval | None:
        """E(k) with a 95% interval, or None when the counters cannot tell (opaque, or refused extrapolation)."""
        if k == 0:
            return Interval(1.0, 1.0, 1.0)
        if self.opaque:
            return self.measured_lengths.get(k)
        if k > self.observed_k and (self.short_drafts or self.observed_k == 0):
            # Drafts already fall short of the K we run: proposing more tokens mostly adds empty slots,
            # and the positions we would need were barely sampled. Refuse rather than guess.
            return None
        chain = _chain_length(self.conditional + self.faded, k)
        factor = length_factor(self.mix, self.mix_read_at, k)
        if factor == 1.0:
            return chain
        return Interval(chain.mean * factor, max(1.0, chain.low * factor), min(1.0 + k, chain.high * factor))


def _chain_length(conditional: tuple[Interval, ...], k: int) -> Interval:
    """E(k) = 1 + sum_i prod_{j<=i} alpha_j, and its sd by the delta method (numerical gradient). Positions past
    the known ones carry the last known alpha forward, with EXTRAPOLATION_SD more doubt."""
    observed = len(conditional)
    means = [conditional[min(i, observed - 1)].mean for i in range(k)]

    def length(alphas: list[float]) -> float:
        total, survive = 1.0, 1.0
        for alpha in alphas:
            survive *= alpha
            total += survive
        return total

    centre = length(means)
    variance = 0.0
    step = 1e-4
    for j in range(min(k, observed)):
        bumped = list(means)
        bumped[j] += step
        if j == observed - 1:
            # The last observed alpha is also carried to every extrapolated position: move them together.
            bumped[observed:] = [means[j] + step] * (k - observed)
        variance += ((length(bumped) - centre) / step * conditional[j].sd) ** 2
    if k > observed:
        bumped = means[:observed] + [value + step for value in means[observed:]]
        variance += ((length(bumped) - centre) / step * EXTRAPOLATION_SD) ** 2
    sd = math.sqrt(variance)
    return Interval(centre, max(1.0, centre - Z_95 * sd), min(1.0 + k, centre + Z_95 * sd))


def estimate_acceptance(by_k: Mapping[int, WindowDelta], method: str) -> AcceptanceEstimate:
    """Pool the evidence of every K observed: position i's conditional acceptance uses all windows with K > i."""
    windows = {k: delta for k, delta in by_k.items() if k > 0 and delta.drafts >= EVIDENCE_FLOOR}
    all_drafts = sum(delta.drafts for delta in windows.values())
    deepest = max(windows, default=0)
    conditional: list[Interval] = []
    for position in range(deepest):
        reaching = sum(delta.drafts for k, delta in windows.items() if k > position)
        if reaching < FRESH_COVERAGE * all_drafts:
            break
        conditional.append(wilson_interval(*_position_counts(windows, position, position)))
    proposed = sum(delta.draft_tokens for delta in windows.values())
    capacity = sum(delta.drafts * k for k, delta in windows.items())
    measured = {k: _measured_length(delta, k) for k, delta in windows.items()}
    mix, read_at = _request_mix(windows)
    return AcceptanceEstimate(
        conditional=tuple(conditional),
        drafts=all_drafts,
        draft_share=min(1.0, proposed / capacity) if capacity > 0 else 1.0,
        opaque=method in BLOCK_DRAFTERS,
        measured_lengths=measured,
        mix=mix,
        mix_read_at=read_at,
        faded=_faded_positions(windows, tuple(conditional), deepest),
    )


def _position_counts(windows: Mapping[int, WindowDelta], position: int, reaching: int) -> tuple[float, float]:
    """Accepted and tried drafts at `position` (0-based) in the windows whose K is above `reaching`."""
    accepted = trials = 0.0
    for k, delta in windows.items():
        counts = delta.accepted_per_position
        if k <= reaching or len(counts) <= position:
            continue
        accepted += counts[position]
        trials += counts[position - 1] if position > 0 else delta.drafts
    return accepted, trials


def _faded_positions(
    windows: Mapping[int, WindowDelta], conditional: tuple[Interval, ...], deepest: int
) -> tuple[Interval, ...]:
    """The positions past the observed ones that faded windows still measure, each moved to today's traffic.

    The windows that reach a faded position also measured the last observed one; how far the fresh estimate
    there has moved from theirs (on the log-odds scale) is how far the traffic moved since, and the faded
    position moves by as much. The same traffic leaves the old rate as it was (a drafter poor past its
    horizon stays poor); a new mix that accepts more lifts it as the fresh positions rose. The doubt is the
    old counts' (which grows as they fade) plus EXTRAPOLATION_SD for the transfer."""
    last = len(conditional) - 1
    if last < 0:
        return ()
    faded: list[Interval] = []
    for position in range(last + 1, deepest):
        old_last_counts = _position_counts(windows, last, position)
        old_counts = _position_counts(windows, position, position)
        if min(old_last_counts[1], old_counts[1]) < EVIDENCE_FLOOR:
            break  # nothing measured there any more
        old_last, old = wilson_interval(*old_last_counts), wilson_interval(*old_counts)
        shift = _logit(conditional[last].mean) - _logit(old_last.mean)
        mean = _expit(_logit(old.mean) + shift)
        sd = math.hypot(old.sd, EXTRAPOLATION_SD)
        faded.append(Interval(mean, max(0.0, mean - Z_95 * sd), min(1.0, mean + Z_95 * sd)))
    return tuple(faded)


def _logit(p: float) -> float:
    p = min(max(p, ODDS_CLAMP), 1 - ODDS_CLAMP)
    return math.log(p / (1 - p))


def _expit(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _request_mix(windows: Mapping[int, WindowDelta]) -> tuple[Mix, int]:
    """The mix of requests the rates of the K with the most drafts show (at least two positions: one rate shows
    no spread between requests), and that K. One kind of request where no K tells."""
    readable = {k: delta for k, delta in windows.items() if k >= 2 and len(delta.accepted_per_position) >= 2}
    if not readable:
        return (), 0
    read_at = max(readable, key=lambda k: (readable[k].drafts, k))
    return acceptance_mix(position_rates(readable[read_at])[:FITTED_POSITIONS]), read_at


def _measured_length(delta: WindowDelta, k: int) -> Interval:
    """E(K) measured as 1 + accepted/drafts; sd from the per-draft variance bound (accepted <= K per draft).
    The mean is clamped to [1, K + 1], where vLLM's accounting keeps it, so the variance is never negative."""
    mean = min(max(1 + delta.accepted / delta.drafts, 1.0), k + 1.0)
    sd = math.sqrt((mean - 1) * (k + 1 - mean) / max(delta.drafts, EVIDENCE_FLOOR))
    return Interval(mean, max(1.0, mean - Z_95 * sd), mean + Z_95 * sd)


def position_rates(delta: WindowDelta) -> list[float]:
    """A_i / N: the share of drafts whose first i+1 tokens were accepted (what status shows)."""
    if delta.drafts < EVIDENCE_FLOOR:
        return []
    return [min(max(count / delta.drafts, 0.0), 1.0) for count in delta.accepted_per_position]
