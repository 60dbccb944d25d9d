"""Test tiers: unit tests always run; e2e tests need --e2e (or SPECDEC_E2E=1) and the local control plane."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--e2e", action="store_true", help="run e2e tests against the local control plane")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--e2e") or os.environ.get("SPECDEC_E2E") == "1":
        return
    skip = pytest.mark.skip(reason="e2e: needs --e2e and the local control plane (hack/cluster up)")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)
