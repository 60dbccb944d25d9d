"""The simulator refuses exactly what vLLM 0.33.0 refuses, with vLLM's message, on the same argument lists:
everything the operator renders (accepted by both) and every refusal the contract knows (refused by both)."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

from specdec_runtime.simulator.vllm_cli import PROG, parse_serve_args
from tests.contract import cases as rendered
from tests.contract.conftest import Verdicts

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]


def simulator_verdict(argv: list[str]) -> str | None:
    """None when the simulator starts from argv, else its one-line error without the program prefix."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse_serve_args([*argv, "--profile", "profile.yaml"])
    except SystemExit as exited:
        assert exited.code == 2
        return stderr.getvalue().strip().removeprefix(f"{PROG}: error: ")
    return None


def vllm_verdict(argv: list[str], vllm_serve: Verdicts, vllm_proposers: Verdicts) -> dict[str, Any]:
    verdict = vllm_serve[argv]
    speculative = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else {}
    if verdict["stage"] is None and speculative.get("method") == "extract_hidden_states":
        return vllm_proposers[argv]  # vLLM refuses it only when its speculator starts
    return verdict


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
        got = simulator_verdict(argv)
        if expected["stage"] is None:
            if got is not None:
                disagreements.append(f"{case_id}: vLLM starts, the simulator says {got!r}")
            continue
        refusals += 1
        if expected["stage"] == "parse":
            wanted = expected["message"].split("error: ", 1)[-1]
            if got is None or wanted not in got:
                disagreements.append(f"{case_id}: vLLM's parser says {wanted!r}, the simulator {got!r}")
        elif got != expected["message"]:
            disagreements.append(f"{case_id}: vLLM says {expected['message']!r}, the simulator {got!r}")
    assert not disagreements, "\n".join(disagreements)
    assert refusals >= len(rendered.ATTENTION_CONFIG_BACKEND_SPELLINGS) + 5
