"""Test tiers: unit tests always run; e2e tests need --e2e (or SPECDEC_E2E=1) and the local control plane;
vllm tests (tests/contract) need --vllm (or SPECDEC_VLLM=1) and install vLLM 0.33.0 with hack/vllm-env."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--e2e", action="store_true", help="run e2e tests against the local control plane")
    parser.addoption("--vllm", action="store_true", help="run the vLLM 0.33.0 contract suite (hack/vllm-env)")
    parser.addoption("--fresh", action="store_true",
                     help="ask vLLM again instead of using cached contract verdicts (tests/contract/vllm_env.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = {
        "e2e": (config.getoption("--e2e") or os.environ.get("SPECDEC_E2E") == "1",
                "e2e: needs --e2e and the local control plane (hack/cluster up)"),
        "vllm": (config.getoption("--vllm") or os.environ.get("SPECDEC_VLLM") == "1",
                 "vllm: needs --vllm; installs vLLM 0.33.0 with hack/vllm-env (cached)"),
    }
    for item in items:
        for marker, (enabled, reason) in tiers.items():
            if marker in item.keywords and not enabled:
                item.add_marker(pytest.mark.skip(reason=reason))
