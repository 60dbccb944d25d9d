"""The two e2e tiers' periods (docs/testing.md).

The fast tier (hack/test, CI) runs the operator with short periods, so a test proves its bound over several
periods in seconds; the thorough tier (hack/test --thorough, SPECDEC_E2E_THOROUGH=1) runs the same tests with
production-length periods and windows. A test picks both values in one place: `period(fast=..., thorough=...)`.
"""

from __future__ import annotations

import os

THOROUGH = os.environ.get("SPECDEC_E2E_THOROUGH") == "1"


def period(fast: float, thorough: float) -> float:
    """This tier's length of one period or window, in seconds."""
    return thorough if THOROUGH else fast


def setting(seconds: float) -> str:
    """An operator setting's environment value (OperatorProcess takes strings)."""
    return f"{seconds:g}"
