"""Issue 21's analysis defects, each reproduced through the production path (counter deltas -> canary
windows -> verdict): offered load must not decide a verdict, a handful of requests must not, and a K change
is judged on what K changes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from specdec_operator.api.spec import CanaryAnalysis
from specdec_operator.api.status import CanaryStatus, TuningDecision
from specdec_operator.canary.analysis import Verdict
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
    # K 2 -> 4 with a drafter whose acceptance fell by 30% on the positions both sides draft; the step time
    # is such that speed and TPOT alone look the same.
    stable = delta(pods=1, batch=8.0, k=2, positions=(0.8, 0.6))
    canary_positions = (0.56, 0.42, 0.6, 0.6)
    canary_length = 1 + sum(canary_positions)
    stable_length = 1 + 0.8 + 0.6
    canary = delta(pods=1, batch=8.0, k=4, positions=canary_positions, step_s=0.040 * canary_length / stable_length)
    verdict = verdict_of(canary, stable, canary_status(canary_k=4), canary_k=4, stable_k=2)
    assert (verdict.outcome, verdict.reason) == ("Fail", "AcceptanceDropped"), verdict.message
    assert verdict.message.startswith("acceptance at position 1 0.56 vs stable 0.80 (ratio 0.70 < 0.90, p=")
    assert "acceptance at position 3" not in verdict.message  # the stable never drafts it
    assert verdict.canary_requests > 0 and verdict.stable_requests > 0


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
