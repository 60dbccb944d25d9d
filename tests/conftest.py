"""Test tiers: unit tests always run; e2e tests need --e2e (or SPECDEC_E2E=1) and the local control plane;
vllm tests (tests/contract) need --vllm (or SPECDEC_VLLM=1) and install vLLM 0.33.0 with hack/vllm-env;
real_engine tests run vLLM's CPU build (hack/vllm-cpu-env) and need --real-engine, SPECDEC_REAL_ENGINE=1, or a
`-m` expression that selects them by name (`pytest -m real_engine`): a plain or `-m "not e2e"` run skips them."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# The unit tests run beside the e2e lanes on two cores (hack/test), so how long one example takes measures the
# machine, not the code: no per-example deadline (speed is for benchmarks, never a test's verdict).
settings.register_profile("specdec", deadline=None)
settings.load_profile("specdec")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--e2e", action="store_true", help="run e2e tests against the local control plane")
    parser.addoption("--vllm", action="store_true", help="run the vLLM 0.33.0 contract suite (hack/vllm-env)")
    parser.addoption("--real-engine", action="store_true",
                     help="run the tests that serve vLLM's CPU build itself (hack/vllm-cpu-env, hack/tiny-models)")
    parser.addoption("--fresh", action="store_true",
                     help="ask vLLM again instead of using cached contract verdicts (tests/contract/vllm_env.py)")


def selects_by_name(expression: str, marker: str) -> bool:
    """Whether the -m expression picks tests because they carry `marker`: true for them, false without it."""
    if not expression or marker not in expression:
        return False
    from _pytest.mark.expression import Expression

    compiled = Expression.compile(expression)
    return bool(compiled.evaluate(lambda name, **_: name == marker)) and not compiled.evaluate(lambda name, **_: False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = {
        "e2e": (config.getoption("--e2e") or os.environ.get("SPECDEC_E2E") == "1",
                "e2e: needs --e2e and the local control plane (hack/cluster up)"),
        "vllm": (config.getoption("--vllm") or os.environ.get("SPECDEC_VLLM") == "1",
                 "vllm: needs --vllm; installs vLLM 0.33.0 with hack/vllm-env (cached)"),
        "real_engine": (config.getoption("--real-engine") or os.environ.get("SPECDEC_REAL_ENGINE") == "1"
                        or selects_by_name(str(config.getoption("-m") or ""), "real_engine"),
                        "real_engine: needs -m real_engine or --real-engine; runs vLLM's CPU build (~4 GB an engine)"),
    }
    for item in items:
        for marker, (enabled, reason) in tiers.items():
            # A real_engine test lives under tests/e2e (its cluster fixtures), so it has the keyword e2e; its own
            # tier decides whether it runs.
            if marker == "e2e" and item.get_closest_marker("real_engine") is not None:
                continue
            if marker in item.keywords and not enabled:
                item.add_marker(pytest.mark.skip(reason=reason))
