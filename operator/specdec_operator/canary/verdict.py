"""The verdict on a canary step, as one pure pipeline the operator's pass and the replay share.

`analyse` (through `canary_verdicts`) judges the step's window; `judge_step` adds what the step machine needs
on top of it (a quiet model, the 100% step's TPOT against the stable's recorded figures); `route_hold` keeps a
step from passing on traffic a Gateway never sent to the canary. Each is a function of its inputs; this module
chains them in the one order both callers use.
"""

from __future__ import annotations

from specdec_operator.api.spec import CanaryAnalysis
from specdec_operator.api.status import CanaryStatus
from specdec_operator.canary.analysis import Verdict
from specdec_operator.canary.evidence import CanaryWindows, VerdictInputs, canary_verdicts
from specdec_operator.canary.progress import judge_step

__all__ = ["VerdictInputs", "judged", "route_hold", "step_verdicts"]


def step_verdicts(inputs: VerdictInputs) -> dict[str, Verdict | None]:
    """The verdict on the canary revision of the step in flight, judged and held: empty before traffic reaches
    it, or without a canary in flight."""
    verdicts = canary_verdicts(inputs)
    judged_ = judged(verdicts, inputs.windows, inputs.canary, inputs.thresholds, inputs.gpus, inputs.initial_k)
    return route_hold(judged_, inputs.route_rejection)


def judged(
    verdicts: dict[str, Verdict | None],
    windows: CanaryWindows,
    canary: CanaryStatus | None,
    thresholds: CanaryAnalysis | None,
    gpus: int,
    initial_k: int,
) -> dict[str, Verdict | None]:
    """`judge_step` on the canary's verdict with its window: quiet models (InsufficientTraffic) and the 100%
    step's TPOT against the stable's recorded figures (canary/progress.py)."""
    if canary is None or not verdicts:
        return verdicts
    k = windows.ks.get(canary.canary_revision, canary.canary_k if canary.canary_k is not None else initial_k)
    stats = windows.stats(canary.canary_revision, k, gpus)
    return {revision: judge_step(verdict, stats, canary, thresholds) for revision, verdict in verdicts.items()}


def route_hold(verdicts: dict[str, Verdict | None], rejection: tuple[str, str] | None) -> dict[str, Verdict | None]:
    """A Gateway that refuses the route turns a canary's Pass into Inconclusive: a step must not pass on
    traffic that never reached the canary. The step holds; if the route stays refused it times out with the
    Gateway's reason in the rollback event and in status.canary. A Fail stays a Fail (a dead canary rolls
    back whatever the route says)."""
    if rejection is None:
        return verdicts
    reason, message = rejection
    held = Verdict("Inconclusive", reason, f"HTTPRoute not usable for the canary: {message}")
    return {revision: verdict if verdict is not None and verdict.outcome == "Fail" else held
            for revision, verdict in verdicts.items()}
