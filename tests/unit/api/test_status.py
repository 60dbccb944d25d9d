"""SpeculativeModel status: defaults, wire names and a round trip of a filled-in status."""

from __future__ import annotations

from specdec_operator.api.status import (
    Condition,
    DrafterChoice,
    PoolStatus,
    SpeculativeModelStatus,
)


def pool(**overrides: object) -> PoolStatus:
    fields: dict[str, object] = {
        "name": "llama-gfx942",
        "gfx_target": "gfx942",
        "drafter": DrafterChoice(method="eagle3", model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", reason="fits"),
        "effective_k": 3,
        **overrides,
    }
    return PoolStatus.model_validate(fields)


def test_empty_status_defaults() -> None:
    assert SpeculativeModelStatus().to_wire() == {
        "observedGeneration": 0,
        "conditions": [],
        "pools": [],
        "speculation": {"pools": [], "rejectedKs": []},
        "summary": {"drafter": "", "effectiveK": "", "acceptance": "", "pools": 0, "canary": ""},
        "replicas": 0,
        "selector": "",
        "url": "",
    }


def test_pool_status_uses_camel_case_on_the_wire() -> None:
    wire = pool(replicas=2, ready_replicas=1).to_wire()
    assert wire["gfxTarget"] == "gfx942"
    assert (wire["effectiveK"], wire["replicas"], wire["readyReplicas"]) == (3, 2, 1)
    assert wire["drafter"] == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "fallback": False,
        "reason": "fits",
    }


def test_status_round_trips_through_the_wire() -> None:
    status = SpeculativeModelStatus(
        observed_generation=4,
        conditions=[Condition(type="Ready", status="True", reason="PoolsReady", last_transition_time="t0")],
        pools=[pool()],
    )
    assert SpeculativeModelStatus.model_validate(status.to_wire()) == status

