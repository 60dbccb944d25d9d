"""Object factories for the runtime unit tests."""

from __future__ import annotations

from typing import Any

from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.profile import Profile

ACCEPTANCE = [0.8, 0.72, 0.65, 0.6, 0.55, 0.5]


def make_profile(*, concurrency: int = 8, restart_s: float = 10.0, **overrides: Any) -> Profile:
    data: dict[str, Any] = {
        "acceptance": ACCEPTANCE,
        "step_time": {"base_s": 0.02, "per_token_s": 0.00015, "draft_base_s": 0.002, "draft_per_token_s": 0.00002},
        "load": [{"duration_s": 3600, "concurrency": concurrency}],
        "restart_s": restart_s,
    }
    data.update(overrides)
    return Profile.model_validate(data)


def eagle(k: int, **extra: Any) -> SpeculativeSettings:
    return SpeculativeSettings(method="eagle", model="org/drafter", num_speculative_tokens=k, **extra)
