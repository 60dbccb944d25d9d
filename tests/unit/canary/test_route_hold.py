"""A Gateway that refuses the canary backend holds the step: no pass on traffic that never arrived."""

from __future__ import annotations

from specdec_operator.canary.progress import advance
from specdec_operator.canary.verdict import route_hold
from tests.unit.canary.canaryfactories import FAIL, PASS, at, canary_status, rollout, target

REJECTION = ("HTTPRouteBackendUnresolved",
             "Gateway gw/public reports ResolvedRefs=False (RefNotPermitted): no ReferenceGrant in team-a")


def test_a_refused_route_turns_pass_into_a_held_step_and_times_out_naming_the_gateway() -> None:
    (verdict,) = route_hold({"rev-new": PASS}, REJECTION).values()
    assert (verdict.outcome, verdict.reason) == ("Inconclusive", "HTTPRouteBackendUnresolved")
    spec = rollout(timeout_seconds=300)
    held = advance(canary_status(), target=target(), rollout=spec, verdict=verdict, now=at(200), action=None,
                   canary_ready=True)
    assert held.status is not None and (held.status.step, held.status.weight) == (0, 10)  # window over, no pass
    assert held.event is None
    timed_out = advance(canary_status(), target=target(), rollout=spec, verdict=verdict, now=at(301), action=None,
                        canary_ready=True)
    assert timed_out.event is not None and timed_out.event.reason == "CanaryTimedOut"
    assert "RefNotPermitted" in timed_out.event.message


def test_without_a_rejection_the_step_passes_as_before() -> None:
    verdicts = route_hold({"rev-new": PASS}, None)
    passed = advance(canary_status(), target=target(), rollout=rollout(), verdict=verdicts["rev-new"], now=at(200),
                     action=None, canary_ready=True)
    assert passed.event is not None and passed.event.reason == "CanaryStepPassed"


def test_a_failing_canary_still_rolls_back_behind_a_refused_route() -> None:
    assert route_hold({"rev-new": FAIL}, REJECTION) == {"rev-new": FAIL}
