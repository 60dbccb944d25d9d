"""The simulator refuses exactly what vLLM 0.33.0 refuses, with vLLM's message, on the same argument lists:
everything the operator renders (accepted by both) and every refusal the contract knows (refused by both).

A command line vLLM's parser refuses exits 2 in both, with argparse's message. A config vLLM refuses while it
starts (validation, SpeculativeConfig, engine config, the speculator the ROCm runner builds) makes the
simulator exit 1 with `<vLLM's exception class>: <vLLM's message>` as its last stderr line."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

from specdec_runtime.simulator.vllm_cli import EXIT_PARSE_ERROR, EXIT_STARTUP_REFUSED, PROG, parse_serve_args
from tests.contract import cases as rendered
from tests.contract.conftest import Verdicts
from tests.contract.vllm_env import VllmDriver

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]


def simulator_verdict(argv: list[str]) -> tuple[str, str] | None:
    """None when the simulator starts from argv, else ("parse", argparse's message) for exit 2 or
    ("startup", its last stderr line) for exit 1."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse_serve_args([*argv, "--profile", "profile.yaml"])
    except SystemExit as exited:
        lines = stderr.getvalue().strip().splitlines()
        if exited.code == EXIT_PARSE_ERROR:
            return "parse", lines[-1].removeprefix(f"{PROG}: error: ")
        assert exited.code == EXIT_STARTUP_REFUSED, exited.code
        return "startup", lines[-1]
    return None


def vllm_verdict(argv: list[str], vllm_serve: Verdicts, vllm_proposers: Verdicts) -> dict[str, Any]:
    verdict = vllm_serve[argv]
    speculative = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else {}
    if verdict["stage"] is None and speculative.get("method") == "extract_hidden_states":
        return vllm_proposers[argv]  # vLLM refuses it only when its speculator starts
    return verdict


def disagreement(case_id: str, expected: dict[str, Any], got: tuple[str, str] | None) -> str | None:
    if expected["stage"] is None:
        return None if got is None else f"{case_id}: vLLM starts, the simulator says {got!r}"
    if expected["stage"] == "parse":
        wanted = expected["message"].split("error: ", 1)[-1]
        if got is None or got[0] != "parse" or wanted not in got[1]:
            return f"{case_id}: vLLM's parser says {wanted!r}, the simulator {got!r}"
        return None
    line = f"{expected['error']}: {expected['message']}"
    if got != ("startup", line):
        return f"{case_id}: vLLM says {line!r} at {expected['stage']}, the simulator {got!r}"
    return None


def compared(models: dict[str, str]) -> list[tuple[str, list[str]]]:
    started = [(case.id, case.argv(models)) for case in [*rendered.example_cases(), *rendered.method_cases()]]
    mtp = [(f"mtp{layers}/k{k}", argv) for layers, k, argv in rendered.mtp_k_argvs(models)]
    refused = [(f"refused/{index}", argv) for index, argv in enumerate(rendered.refusal_argvs(models))]
    return [*started, *mtp, *refused]


def test_the_simulator_refuses_what_vllm_refuses_with_vllms_message(
    models: dict[str, str], vllm_serve: Verdicts, vllm_proposers: Verdicts
) -> None:
    disagreements = []
    refusals = 0
    for case_id, argv in compared(models):
        expected = vllm_verdict(argv, vllm_serve, vllm_proposers)
        refusals += expected["stage"] is not None
        found = disagreement(case_id, expected, simulator_verdict(argv))
        if found:
            disagreements.append(found)
    assert not disagreements, "\n".join(disagreements)
    assert refusals >= len(rendered.ATTENTION_CONFIG_BACKEND_SPELLINGS) + 5


@pytest.fixture(scope="module")
def vllm_startup(driver: VllmDriver, models: dict[str, str]) -> Verdicts:
    """vLLM's start-up as far as it goes on CPU: engine config, then the speculator the ROCm runner builds."""
    return Verdicts(driver, "proposers", [argv for _, argv in rendered.startup_argvs(models)])


def startup_verdict(argv: list[str], verdict: dict[str, Any]) -> dict[str, Any]:
    """Only extract_hidden_states' speculator refuses for a reason of its config; the others that fail to
    start on CPU do so for want of a GPU or Triton (test_vllm_runtime pins which), which a ROCm node has."""
    method = json.loads(argv[argv.index("--speculative-config") + 1]).get("method")
    if verdict["stage"] == "proposer" and method != "extract_hidden_states":
        return {**verdict, "stage": None}
    return verdict


def test_each_speculative_config_rule_refuses_in_the_simulator_as_in_vllm(
    models: dict[str, str], vllm_startup: Verdicts
) -> None:
    disagreements: list[str] = []
    refused: list[str] = []
    started: list[str] = []
    for case_id, argv in rendered.startup_argvs(models):
        expected = startup_verdict(argv, vllm_startup[argv])
        (started if expected["stage"] is None else refused).append(case_id)
        found = disagreement(case_id, expected, simulator_verdict(argv))
        if found:
            disagreements.append(found)
    assert not disagreements, "\n".join(disagreements)
    # Both kinds are exercised: rules broken, and their neighbours that start.
    assert len(refused) >= 20 and len(started) >= 4, (refused, started)
