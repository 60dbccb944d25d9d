"""Issue 21's analysis defects, each reproduced through the production path (counter deltas -> canary
windows -> verdict): offered load must not decide a verdict, a handful of requests must not, and a K change
is judged on what K changes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from specdec_operator.api.spec import CanaryAnalysis
from specdec_operator.api.status import CanaryStatus, TuningDecision
from specdec_operator.canary.analysis import Verdict, WindowStats, composition_factors
from specdec_operator.canary.evidence import CanaryWindows, VerdictInputs, canary_verdicts
from specdec_operator.canary.histogram import Buckets
from specdec_operator.tuner.samples import RequestCounters
from specdec_operator.tuner.window import WindowDelta
from tests.unit.canary.canaryfactories import buckets, canary_status

SECONDS = 120.0
OUTPUT_TOKENS = 128


def spread(centre_s: float, requests: int) -> list[float]:
    """Per-request TPOTs log-evenly spread over x0.7..x1.4 around `centre_s`, as mixed prompts give."""
    if requests == 1:
        return [centre_s]
    return [centre_s * math.exp(math.log(0.7) + math.log(2.0) * i / (requests - 1)) for i in range(requests)]


def delta(
    *,
    pods: int,
    batch: float,
    k: int = 4,
    positions: Sequence[float] = (0.8, 0.6, 0.45, 0.3),
    step_s: float = 0.040,
    tpot: Buckets | None = None,
    requests: float | None = None,
) -> WindowDelta:
    """What `pods` vLLM pods at a mean running batch of `batch` add to their counters in 120 s."""
    drafts = SECONDS / step_s * batch * pods
    accepted = tuple(drafts * rate for rate in positions[:k])
    generated = drafts + sum(accepted)
    finished = generated / OUTPUT_TOKENS if requests is None else requests
    mean_tpot = step_s * drafts / generated
    return WindowDelta(
        drafts=drafts if k else 0.0,
        draft_tokens=drafts * k,
        accepted=sum(accepted),
        accepted_per_position=accepted,
        generation_tokens=generated,
        pod_seconds=SECONDS * pods,
        itl_sum=drafts * step_s,
        itl_count=drafts,
        tpot_buckets=tpot if tpot is not None else buckets(spread(mean_tpot, round(finished))),
        requests=RequestCounters(finished=finished),
    )


def verdict_of(
    canary: WindowDelta,
    stable: WindowDelta,
    status: CanaryStatus | None = None,
    *,
    canary_k: int = 4,
    stable_k: int = 4,
    decision: TuningDecision | None = None,
) -> Verdict:
    windows = CanaryWindows()
    status = status or canary_status()
    windows.follow(status, 0.0)
    windows.deltas = {status.canary_revision: canary, status.stable_revision: stable}
    windows.ks = {status.canary_revision: canary_k, status.stable_revision: stable_k}
    extra = {"last_decision": decision} if decision is not None else {}
    verdicts = canary_verdicts(VerdictInputs(windows, status, CanaryAnalysis(), 1, 4, **extra))
    verdict = verdicts[status.canary_revision]
    assert verdict is not None
    return verdict


def test_a_canary_given_a_fifth_of_a_stable_pods_load_records_both_loads_and_is_not_failed_for_it() -> None:
    # examples/canary-httproute.yaml's first step on 2 replicas before weights followed the replica split: the
    # canary pod got ~0.22 of a stable pod's load. Equal load now comes by construction (the route follows the
    # replica split); the analysis records both sides' load per pod and fails nothing on the load alone.
    stable = delta(pods=2, batch=8.0)
    canary = delta(pods=1, batch=8.0 * 0.22)
    verdict = verdict_of(canary, stable)
    assert verdict.outcome != "Fail", verdict.message
    assert verdict.canary_load == pytest.approx(1.08, abs=0.01)
    assert verdict.stable_load == pytest.approx(4.92, abs=0.01)
    # The same slowed down by half (fewer finished requests, as closed-loop clients give) is not held on load.
    slow = delta(pods=1, batch=8.0 * 0.22, step_s=0.080)
    assert verdict_of(slow, stable).reason != "TrafficMismatch"


def test_a_tpot_p90_on_three_requests_is_no_verdict() -> None:
    # One of three canary requests in the next bucket gave a p90 ratio of 1.35 and an immediate rollback.
    stable = delta(pods=1, batch=8.0, tpot=buckets(spread(0.020, 200)), requests=200.0)
    canary = delta(pods=1, batch=8.0, tpot=buckets([0.020, 0.020, 0.030]), requests=3.0)
    verdict = verdict_of(canary, stable)
    assert (verdict.outcome, verdict.reason) == ("Inconclusive", "InsufficientSamples"), verdict.message
    assert "3 canary and 200 stable requests" in verdict.message
    assert (verdict.canary_requests, verdict.stable_requests) == (3, 200)


def test_a_k_change_that_loses_acceptance_per_position_fails_on_it() -> None:
    # K 2 -> 4 with a drafter whose acceptance per token fell by 30% (0.7x at position 1, 0.49x at 2); the
    # step time is such that speed and TPOT alone look the same. Neither side's rates show requests that
    # differ (the second is below the first squared), so no re-weighting to K excuses it.
    stable = delta(pods=1, batch=8.0, k=2, positions=(0.8, 0.6))
    canary_positions = (0.56, 0.294, 0.15, 0.07)
    canary_length = 1 + sum(canary_positions)
    stable_length = 1 + 0.8 + 0.6
    canary = delta(pods=1, batch=8.0, k=4, positions=canary_positions, step_s=0.040 * canary_length / stable_length)
    verdict = verdict_of(canary, stable, canary_status(canary_k=4), canary_k=4, stable_k=2)
    assert (verdict.outcome, verdict.reason) == ("Fail", "AcceptanceDropped"), verdict.message
    assert verdict.message.startswith("acceptance at position 1 (stable 0.80 at K 2, re-weighted to K 4) 0.56 vs "
                                      "stable 0.80 (ratio 0.70 < 0.90, p="), verdict.message
    assert "acceptance at position 3" not in verdict.message  # the stable never drafts it
    assert verdict.canary_requests > 0 and verdict.stable_requests > 0


def mix_positions(mix: Sequence[tuple[float, float]], k: int) -> tuple[float, ...]:
    """Per-position acceptance at K of requests of several kinds, (acceptance per draft token, share of
    the tokens): a request takes one draft per accepted length, so its drafts weigh 1 / that length."""
    weights = [share / (1 + sum(a ** (i + 1) for i in range(k))) for a, share in mix]
    return tuple(sum(w * a ** (i + 1) for w, (a, _) in zip(weights, mix, strict=True)) / sum(weights)
                 for i in range(k))


CODE_AND_CHAT = ((0.95, 0.5), (0.3, 0.5))


@pytest.mark.parametrize(("stable_k", "canary_k"), [(3, 4), (4, 3), (3, 6), (2, 5), (1, 5)])
def test_a_k_change_on_requests_that_differ_passes_acceptance(stable_k: int, canary_k: int) -> None:
    # The same requests at another K: half code accepting 95% of draft tokens, half chat accepting 30%. At K 3
    # -> 4 their drafts' rate at position 3 falls from 0.257 to 0.226 (0.88x, 0.73x at K 3 -> 6): the code
    # requests take fewer steps per token at the higher K, so fewer of the drafts are theirs. No request
    # accepted less, yet K 3 -> 4 held on position 3 (0.88x) until its timeout rolled it back, and K 1 -> 5
    # failed on position 1 (0.78x, p=0.011).
    stable_positions, canary_positions = mix_positions(CODE_AND_CHAT, stable_k), mix_positions(CODE_AND_CHAT, canary_k)
    stable = delta(pods=4, batch=8.0, k=stable_k, positions=stable_positions)
    step_s = 0.040 * (1 + sum(canary_positions)) / (1 + sum(stable_positions))  # goodput unchanged
    canary = delta(pods=4, batch=8.0, k=canary_k, positions=canary_positions, step_s=step_s)
    verdict = verdict_of(canary, stable, canary_status(canary_k=canary_k), canary_k=canary_k, stable_k=stable_k)
    assert verdict.outcome == "Pass", verdict.message
    assert f"acceptance at position 1 (stable {stable_positions[0]:.2f} at K {stable_k}, re-weighted to K " \
           f"{canary_k}) {canary_positions[0]:.2f} vs stable" in verdict.message
    # The same K change with a drafter 30% worse on every request fails on acceptance.
    worse = tuple((a * 0.7, share) for a, share in CODE_AND_CHAT)
    worse_positions = mix_positions(worse, canary_k)
    canary = delta(pods=4, batch=8.0, k=canary_k, positions=worse_positions, step_s=step_s)
    verdict = verdict_of(canary, stable, canary_status(canary_k=canary_k), canary_k=canary_k, stable_k=stable_k)
    assert (verdict.outcome, verdict.reason) == ("Fail", "AcceptanceDropped"), verdict.message


THREE_KINDS = ((0.97, 0.3), (0.6, 0.4), (0.2, 0.3))


@pytest.mark.parametrize(("stable_k", "canary_k"), [(3, 6), (6, 3), (1, 5), (4, 8)])
def test_re_weighting_to_k_corrects_for_a_mix_it_cannot_represent_too_little_never_too_much(
        stable_k: int, canary_k: int) -> None:
    # Three kinds of request: the two-kind mix read from the rates cannot reproduce them, so the correction is
    # approximate: close at position 1, and short of the truth (never beyond it) further on.
    def window(k: int) -> WindowStats:
        rates = mix_positions(THREE_KINDS, k)
        return WindowStats(seconds=120.0, gpus=1, k=k, drafts=1e6, accepted_per_position=tuple(1e6 * r for r in rates))

    canary_rates, stable_rates = mix_positions(THREE_KINDS, canary_k), mix_positions(THREE_KINDS, stable_k)
    truth = [c / s for c, s in zip(canary_rates, stable_rates, strict=False)]
    factors = composition_factors(window(canary_k), window(stable_k))
    assert len(factors) == min(stable_k, canary_k)
    assert factors[0] == pytest.approx(truth[0], rel=0.025)
    for factor, true in zip(factors, truth, strict=False):
        assert 1.0 <= factor / true <= 1.2 if canary_k > stable_k else 0.8 <= factor / true <= 1.0
    assert min(truth) < 0.85 or max(truth) > 1.15  # the effect corrected is far from small


def k_change(predicted_gain: float) -> TuningDecision:
    return TuningDecision(id="d1", time="2026-11-30T11:00:00Z", pool="llama-gfx942", from_k=2, to_k=4,
                          action="Change", reason="r", predicted_gain=predicted_gain, confidence=0.95)


def canary_at(goodput_ratio: float) -> WindowDelta:
    """A K=4 canary whose goodput per sequence is `goodput_ratio` x the K=2 stable's: same acceptance where
    both draft, longer drafts accepted less, and the step time sets the rest."""
    positions = (0.8, 0.6, 0.2, 0.1)
    step_s = 0.040 * (1 + sum(positions)) / 2.4 / goodput_ratio
    return delta(pods=1, batch=8.0, k=4, positions=positions, step_s=step_s)


K2_STABLE = dict(pods=1, batch=8.0, k=2, positions=(0.8, 0.6))


def test_a_k_change_must_deliver_the_goodput_the_tuner_predicted() -> None:
    stable = delta(**K2_STABLE)  # type: ignore[arg-type]
    status = canary_status(canary_k=4)
    # Predicted +10%, delivered -8%: a loss the tuner did not predict, beyond the tolerance the prediction
    # leaves (0.9 x 1.10 = 0.99).
    verdict = verdict_of(canary_at(0.92), stable, status, canary_k=4, stable_k=2, decision=k_change(0.10))
    assert (verdict.outcome, verdict.reason) == ("Fail", "GoodputBelowExpected"), verdict.message
    assert "goodput per sequence (tuner predicted 1.10x)" in verdict.message
    # The same canary judged as a spec change (no decision) passes: -8% is within the 10% tolerance.
    assert verdict_of(canary_at(0.92), stable, status, canary_k=4, stable_k=2).outcome == "Pass"


def test_a_k_change_may_not_lose_goodput_however_large_its_prediction() -> None:
    stable = delta(**K2_STABLE)  # type: ignore[arg-type]
    status = canary_status(canary_k=4)
    for predicted in (0.25, 1.55):
        verdict = verdict_of(canary_at(0.92), stable, status, canary_k=4, stable_k=2,
                             decision=k_change(predicted))
        assert (verdict.outcome, verdict.reason) == ("Fail", "GoodputBelowExpected"), verdict.message
        assert "limit 1.00" in verdict.message or "< 1.00" in verdict.message, verdict.message


def test_a_k_change_that_gains_less_than_an_optimistic_prediction_still_promotes() -> None:
    # The real engine on two CPU cores: the tuner predicted +155% for K 4 -> 1 from priors no CPU engine
    # fits; the canary delivered +49%. Rolling it back would give up a real gain.
    stable = delta(**K2_STABLE)  # type: ignore[arg-type]
    verdict = verdict_of(canary_at(1.49), stable, canary_status(canary_k=4), canary_k=4, stable_k=2,
                         decision=k_change(1.55))
    assert verdict.outcome == "Pass", verdict.message


def test_a_one_replica_pool_canaried_in_place_reaches_a_verdict() -> None:
    # The canary took the pool's only replica: the stable revision serves nothing in the step.
    status = canary_status()
    windows = CanaryWindows()
    windows.follow(status, 0.0)
    windows.deltas = {status.canary_revision: delta(pods=1, batch=8.0)}
    windows.ks = {status.canary_revision: 4}
    no_stable = VerdictInputs(windows, status, CanaryAnalysis(), 1, 4, stable_serving=False)
    verdict = canary_verdicts(no_stable)[status.canary_revision]
    assert verdict is not None
    assert (verdict.outcome, verdict.reason) == ("Pass", "NoBaselineHealthy"), verdict.message
    assert "no stable replica serves in this step" in verdict.message
    # With errors it still fails: what needs no baseline is still judged.
    erroring = delta(pods=1, batch=8.0)
    erroring = WindowDelta(**{**erroring.__dict__, "requests": RequestCounters(finished=190.0, errored=10.0)})
    windows.deltas = {status.canary_revision: erroring}
    failed = canary_verdicts(no_stable)[status.canary_revision]
    assert failed is not None and (failed.outcome, failed.reason) == ("Fail", "ErrorRateExceeded")


def test_without_per_position_counters_a_k_change_is_judged_on_goodput_not_held_forever() -> None:
    # Both sides offered the same requests per pod (a K change finishes them faster, not more of them).
    stable = delta(pods=1, batch=8.0, k=2, positions=(0.8, 0.6), requests=450.0)
    canary = delta(pods=1, batch=8.0, k=4, requests=450.0)
    bare = [WindowDelta(**{**side.__dict__, "accepted_per_position": ()}) for side in (canary, stable)]
    verdict = verdict_of(bare[0], bare[1], canary_status(canary_k=4), canary_k=4, stable_k=2)
    assert verdict.outcome == "Pass", verdict.message
    assert "acceptance at position" not in verdict.message


def test_no_draft_accepted_at_a_position_the_stable_rarely_accepts_is_noise_not_proof() -> None:
    # The real engine's K change: position 2 accepted 1% of drafts on the stable and none of the canary's few
    # hundred. The gate said p=0 (a log ratio of -inf) and rolled back the K change. At the limit's rate, none
    # accepted in 1200 drafts happens 35% of the time.
    canary = delta(pods=1, batch=0.4, k=2, positions=(0.3, 0.0), requests=400.0)
    stable = delta(pods=1, batch=0.4, k=2, positions=(0.3, 0.001), requests=400.0)
    verdict = verdict_of(canary, stable, canary_k=2, stable_k=2)
    [position_2] = [item for item in verdict.comparisons if item.metric == "acceptance at position 2"]
    assert not position_2.failed and position_2.passed, verdict.message
    assert verdict.outcome != "Fail", verdict.message


def test_no_draft_accepted_where_the_stable_accepts_half_still_fails() -> None:
    canary = delta(pods=1, batch=0.4, k=2, positions=(0.3, 0.0), requests=400.0)
    stable = delta(pods=1, batch=0.4, k=2, positions=(0.3, 0.5), requests=400.0)
    verdict = verdict_of(canary, stable, canary_k=2, stable_k=2)
    assert (verdict.outcome, verdict.reason) == ("Fail", "AcceptanceDropped"), verdict.message
