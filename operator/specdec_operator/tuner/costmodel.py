"""Step-time model of one pool, learned online from what vLLM's metrics show.

One engine step with K draft tokens and B running sequences is modelled as

    step(B, K) = base + per_token * B * (K + 1) + K * (draft_base + draft_per_token * B)

(a fixed cost of reading the weights, verification compute per token, and K sequential draft passes).
The observations are per-interval means: step time from `inter_token_latency` (vLLM observes one
latency per running request per step), B from the same histogram over wall time, at the K the pods
ran. One K at one load cannot separate the four coefficients, so per-gfx and per-drafter priors on
their ratios fill the directions the data does not reach; with more K values and loads the data wins.
The model never sees a simulator profile: only scraped numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# (B*(K+1) tokens at which verification compute equals the fixed step cost). Roughly peak dense
# bf16 FLOP/s over HBM bytes/s of each part, derated for attention and kernel overheads.
RIDGE_TOKENS_BY_GFX: dict[str, float] = {
    "gfx90a": 100.0,
    "gfx942": 200.0,
    "gfx950": 260.0,
    "gfx1100": 120.0,
    "gfx1101": 120.0,
    "gfx1150": 80.0,
    "gfx1151": 80.0,
    "gfx1200": 150.0,
    "gfx1201": 150.0,
}
DEFAULT_RIDGE_TOKENS = 150.0

# Cost of one draft pass relative to one target pass: (fixed part, per-token part). A draft head
# (eagle, mtp) is about one target layer plus launch overheads; a separate draft model is larger;
# n-gram matching runs on the CPU and costs almost nothing on the GPU.
DRAFT_RATIOS_BY_METHOD: dict[str, tuple[float, float]] = {
    "ngram": (0.01, 0.0),
    "ngram_gpu": (0.02, 0.005),
    "suffix": (0.02, 0.0),
    "eagle": (0.08, 0.03),
    "eagle3": (0.08, 0.03),
    "mtp": (0.08, 0.03),
    "draft_model": (0.12, 0.06),
    "dflash": (0.10, 0.04),
    "dspark": (0.10, 0.04),
}
DEFAULT_DRAFT_RATIOS = (0.10, 0.05)

# The priors are trusted to within this factor either way, read as two standard deviations. The
# doubt of a prediction is how far it moves when each prior ratio is pushed by this factor: large
# where only the priors speak (K values and loads never measured), negligible where data does.
PRIOR_FACTOR = 2.0
# Draft methods whose draft-cost ratios are known only to a wider factor: a separate draft model may be a 1B model
# for a 405B target or the target's own architecture (a same-size drafter costs a whole target pass per draft), so
# its ratios are trusted to within this factor. Until two Ks are measured, a move far from the measured K is then
# unsure and the policy explores one K step instead of jumping on the prior.
DRAFT_PRIOR_FACTOR_BY_METHOD: dict[str, float] = {"draft_model": 8.0}
# A floor for step jitter and load drift between measurement and decision.
MIN_RELATIVE_SD = 0.01
# What a prior ratio weighs against one interval of data: (MIN_RELATIVE_SD / 1)^2. A row's residual is its relative
# error, about MIN_RELATIVE_SD for an interval's mean step; a prior's is its relative violation, which for a prior good
# to a factor of two (PRIOR_FACTOR) is of order one. So the data decides every direction it reaches, even nearly
# collinear ones, and the priors only split what it cannot (one K measured: how the batch's cost divides between
# verification and drafts).
PRIOR_WEIGHT = MIN_RELATIVE_SD**2
# A prior ratio of zero (n-gram drafts cost no GPU time per token) is measured against this share of the term it is a
# share of, so that breaking it has a finite price.
MIN_PRIOR_RATIO = 0.01
# Fits a prior's size is re-estimated over (see fit): the first from the priors alone, then from the data's answer.
FIT_PASSES = 3
# The least size a prior is divided by (seconds): one whose two sides both fit to zero keeps a finite weight.
_TINY_S = 1e-12


# The shortest engine step a row may report (seconds); see StepCostModel.observe.
MIN_STEP_S = 1e-6


@dataclass(frozen=True)
class StepCoefficients:
    base_s: float
    per_token_s: float
    draft_base_s: float
    draft_per_token_s: float

    def seconds(self, batch: float, k: int) -> float:
        return (
            self.base_s + self.per_token_s * batch * (k + 1) + k * (self.draft_base_s + self.draft_per_token_s * batch)
        )


@dataclass(frozen=True)
class StepPrediction:
    seconds: float
    relative_sd: float


_SIZE = 4


class StepCostModel:
    """Weighted least squares over every per-interval observation, old ones forgotten exponentially, regularised
    by ratio priors. The normal equations are kept as running sums, so a fit costs the same after hours."""

    def __init__(self, gfx_target: str, method: str, *, half_life_s: float = 7200.0) -> None:
        self.ridge_tokens = RIDGE_TOKENS_BY_GFX.get(gfx_target, DEFAULT_RIDGE_TOKENS)
        self.draft_ratios = DRAFT_RATIOS_BY_METHOD.get(method, DEFAULT_DRAFT_RATIOS)
        draft_factor = DRAFT_PRIOR_FACTOR_BY_METHOD.get(method, PRIOR_FACTOR)
        self.prior_factors = (PRIOR_FACTOR, draft_factor, draft_factor)  # ridge, draft fixed, draft per token
        self.half_life_s = half_life_s
        self._at: float | None = None
        self._gram = [[0.0] * _SIZE for _ in range(_SIZE)]
        self._moment = [0.0] * _SIZE
        self._step_sum = 0.0
        self._rows = 0.0
        # Weighted sums of each coefficient's multiplier, B*(K+1), K and K*B: with the step's sum they give the base
        # the priors imply (see _prior_base), the scale each prior's violation is measured against.
        self._term_sums = [0.0, 0.0, 0.0]

    def observe(self, at: float, k: int, batch: float, step_s: float, weight: float = 1.0) -> None:
        """One row: the mean batch and step time over an interval. `weight`: how many scrape intervals it sums, so
        that data weighs the same against the priors however finely it is cut."""
        if not (batch > 0 and step_s >= MIN_STEP_S and weight > 0 and math.isfinite(batch) and math.isfinite(step_s)):
            # No engine step takes under a microsecond: such a row is a corrupt counter, and its square (the fit
            # divides by the mean step squared) would underflow to zero.
            return
        self._forget_until(at)
        # Divided by the observed step, so that every row counts by its relative error.
        features = [1.0 / step_s, batch * (k + 1) / step_s, k / step_s, k * batch / step_s]
        for i in range(_SIZE):
            self._moment[i] += weight * features[i]
            for j in range(_SIZE):
                self._gram[i][j] += weight * features[i] * features[j]
        self._step_sum += weight * step_s
        self._rows += weight
        for index, term in enumerate((batch * (k + 1), float(k), k * batch)):
            self._term_sums[index] += weight * term

    def fit(self, ratio_factors: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> StepCoefficients:
        """Coefficients in seconds. With no data the scale is arbitrary (base 1 s), the ratios are the priors.

        `ratio_factors` scale the three prior ratios (ridge, draft fixed, draft per token), to measure
        how much a prediction depends on them."""
        ridge = self.ridge_tokens * ratio_factors[0]
        fixed_ratio, token_ratio = self.draft_ratios[0] * ratio_factors[1], self.draft_ratios[1] * ratio_factors[2]
        # Each prior counts by its relative violation, as a data row counts by its relative error: its residual is
        # divided by the mean of its two sides (2(x - y)/(x + y), symmetric and bounded like a log ratio, so a prior
        # the data contradicts gives way instead of bending the fit). The sizes come from the previous fit, starting
        # from the priors themselves. In plain seconds the per-token draft prior was a batch's worth cheaper to break
        # than the others, and with one K measured the fit moved the batch's cost into the drafts (and predicted K=0
        # twice as fast as it ran).
        base = self._prior_base(ridge, fixed_ratio, token_ratio)
        fit = StepCoefficients(base, base / ridge, fixed_ratio * base, token_ratio * base / ridge)
        for _ in range(FIT_PASSES):
            fit = self._fit_once(fit, ridge, fixed_ratio, token_ratio)
        return fit

    def _fit_once(
        self, previous: StepCoefficients, ridge: float, fixed_ratio: float, token_ratio: float
    ) -> StepCoefficients:
        gram = [list(row) for row in self._gram]
        moment = list(self._moment)
        base, per_token = previous.base_s, previous.per_token_s
        sizes = (
            max((base + ridge * per_token) / 2, _TINY_S),
            max((previous.draft_base_s + fixed_ratio * base) / 2, MIN_PRIOR_RATIO * base, _TINY_S),
            max((previous.draft_per_token_s + token_ratio * per_token) / 2, MIN_PRIOR_RATIO * per_token, _TINY_S),
        )
        priors = [
            [1.0 / sizes[0], -ridge / sizes[0], 0.0, 0.0],  # base = ridge * per_token
            [-fixed_ratio / sizes[1], 0.0, 1.0 / sizes[1], 0.0],  # draft_base = ratio * base
            [0.0, -token_ratio / sizes[2], 0.0, 1.0 / sizes[2]],  # draft_per_token = ratio * per_token
        ]
        if self._rows <= 0:
            priors.append([1.0, 0.0, 0.0, 0.0])  # pins the arbitrary scale: base = 1 s
            moment[0] += PRIOR_WEIGHT
        for prior in priors:
            for i in range(_SIZE):
                for j in range(_SIZE):
                    gram[i][j] += PRIOR_WEIGHT * prior[i] * prior[j]
        base, per_token, draft_base, draft_per_token = _nonnegative_least_squares(gram, moment)
        return StepCoefficients(base, per_token, draft_base, draft_per_token)

    def _prior_base(self, ridge: float, fixed_ratio: float, token_ratio: float) -> float:
        """The base step the data implies if the priors held exactly: the mean step is linear in the coefficients,
        base * (1 + mean B*(K+1) / ridge + fixed_ratio * mean K + token_ratio * mean K*B / ridge). 1 s with no data."""
        if self._rows <= 0:
            return 1.0
        mean_tokens, mean_k, mean_draft_tokens = (total / self._rows for total in self._term_sums)
        multiplier = 1 + mean_tokens / ridge + fixed_ratio * mean_k + token_ratio * mean_draft_tokens / ridge
        return self._step_sum / self._rows / multiplier

    def predict(self, batch: float, ks: range) -> dict[int, StepPrediction]:
        """Step time at `batch` for every K in `ks`, each with its doubt from the priors' sensitivity."""
        return self.predict_at([batch], ks)[0]

    def predict_at(self, batches: Sequence[float], ks: range) -> list[dict[int, StepPrediction]]:
        """`predict` at several batch sizes from one fit (the fits, not the evaluations, are what cost)."""
        central = self.fit()
        shifted: list[tuple[StepCoefficients, StepCoefficients]] = []
        for index in range(3):
            up, down = [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]
            up[index], down[index] = self.prior_factors[index], 1 / self.prior_factors[index]
            shifted.append((self.fit((up[0], up[1], up[2])), self.fit((down[0], down[1], down[2]))))
        every: list[dict[int, StepPrediction]] = []
        for batch in batches:
            predictions = {}
            for k in ks:
                seconds = central.seconds(batch, k)
                if seconds <= 0:
                    continue
                variance = 0.0
                for up_fit, down_fit in shifted:
                    swing = max(abs(up_fit.seconds(batch, k) / seconds - 1),
                                abs(down_fit.seconds(batch, k) / seconds - 1))
                    variance += (swing / 2) ** 2  # the trusted factor is two standard deviations
                predictions[k] = StepPrediction(seconds, math.hypot(MIN_RELATIVE_SD, math.sqrt(variance)))
            every.append(predictions)
        return every

    def _forget_until(self, at: float) -> None:
        if self._at is not None and at > self._at:
            factor = 0.5 ** ((at - self._at) / self.half_life_s)
            self._gram = [[value * factor for value in row] for row in self._gram]
            self._moment = [value * factor for value in self._moment]
            self._step_sum *= factor
            self._rows *= factor
            self._term_sums = [value * factor for value in self._term_sums]
        if self._at is None or at > self._at:
            self._at = at


def _nonnegative_least_squares(gram: list[list[float]], moment: list[float]) -> list[float]:
    """Solve the normal equations with every coefficient >= 0: fix negative ones at zero and refit the rest."""
    free = list(range(len(moment)))
    while True:
        values = _gauss_solve([[gram[i][j] for j in free] for i in free], [moment[i] for i in free])
        solution = [0.0] * len(moment)
        for position, index in enumerate(free):
            solution[index] = values[position]
        negative = [i for i in free if solution[i] < 0]
        if not negative:
            return solution
        free = [i for i in free if i not in negative]


def _gauss_solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; a tiny ridge keeps rank-deficient systems solvable."""
    n = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(n)]
    for i in range(n):
        rows[i][i] += 1e-12 * (1.0 + abs(rows[i][i]))
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        if rows[col][col] == 0:
            continue
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            for c in range(col, n + 1):
                rows[r][c] -= factor * rows[col][c]
    solution = [0.0] * n
    for i in reversed(range(n)):
        if rows[i][i] == 0:
            continue
        solution[i] = (rows[i][n] - sum(rows[i][c] * solution[c] for c in range(i + 1, n))) / rows[i][i]
    return solution
