"""Session fixtures of the vLLM contract suite: one vLLM venv, one set of tiny model directories, and each
driver command run once for all cases (vLLM's imports cost seconds per process, a case costs milliseconds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from specdec_operator.api.vocabulary import GFX_TARGETS
from tests.contract import cases as rendered
from tests.contract.vllm_env import VllmDriver, vllm_python

AITER_OFF = "gfx942/aiter-off"
# The session's driver, for the summary line (a fixture's own output is captured at teardown).
_SESSION_DRIVERS: list[VllmDriver] = []


@pytest.fixture(scope="session")
def driver(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[VllmDriver]:
    models_dir = tmp_path_factory.mktemp("vllm-models")
    session_driver = VllmDriver(vllm_python(), models_dir, fresh=pytestconfig.getoption("--fresh"))
    _SESSION_DRIVERS.append(session_driver)
    yield session_driver


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for used in _SESSION_DRIVERS:
        terminalreporter.write_line(f"vLLM contract verdicts: {used.hits} from the cache, {used.misses} asked of "
                                    f"vLLM ({used.cache_dir}; --fresh asks vLLM for all)")


@pytest.fixture(scope="session")
def models(driver: VllmDriver) -> dict[str, str]:
    answer: dict[str, str] = driver.run(
        "models", {"dir": str(driver.models_dir), "mtp_layers": list(rendered.MTP_LAYER_COUNTS)}
    )
    return answer


class Verdicts:
    """vLLM's answer per argument list, asked lazily in one driver run per command."""

    def __init__(self, driver: VllmDriver, command: str, argvs: list[list[str]]) -> None:
        keyed = {json.dumps(argv): argv for argv in argvs}
        request = {"cases": [{"id": key, "argv": argv} for key, argv in keyed.items()]}
        self._results = {result["id"]: result for result in driver.run(command, request)}

    def __getitem__(self, argv: list[str]) -> dict[str, Any]:
        return self._results[json.dumps(argv)]


@pytest.fixture(scope="session")
def serve_argvs(models: dict[str, str]) -> list[list[str]]:
    """Every argument list any contract test asks `vllm serve` about."""
    return rendered.all_serve_argvs(models)


@pytest.fixture(scope="session")
def vllm_serve(driver: VllmDriver, serve_argvs: list[list[str]]) -> Verdicts:
    return Verdicts(driver, "serve", serve_argvs)


@pytest.fixture(scope="session")
def vllm_proposers(driver: VllmDriver, models: dict[str, str]) -> Verdicts:
    return Verdicts(driver, "proposers", rendered.proposer_argvs(models))


@pytest.fixture(scope="session")
def vllm_attention(driver: VllmDriver) -> dict[str, list[dict[str, Any]]]:
    """RocmPlatform's answer per gfx target: one process each (the arch is read once at import), two at a time."""
    requests = {gfx: rendered.attention_request(gfx) for gfx in GFX_TARGETS}
    # A spec that turns AITER off on a target that has it (decisions/runtime_env.py aiter_on).
    requests[AITER_OFF] = rendered.attention_request("gfx942", {"VLLM_ROCM_USE_AITER": "0"})
    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = pool.map(lambda request: driver.run("attention", request), requests.values())
        return dict(zip(requests, answers, strict=True))


@pytest.fixture(scope="session")
def vllm_options(driver: VllmDriver) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = driver.run("options", {})
    return answer
