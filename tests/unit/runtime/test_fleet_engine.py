"""The fleet driver's real-engine mode: each pod's own command (our launcher, then `vllm serve`) as a process on the
pod's loopback address, with a stand-in `vllm` executable so the unit test needs no engine: readiness from /health,
an exit as a terminated container with the log's tail, the model map as links the launcher serves from."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from specdec_runtime.config import RuntimeConfig, SpeculativeSettings, serve_args
from specdec_runtime.fleet_engine import EngineSettings, EngineSupervisor, ModelMap, termination_message
from specdec_runtime.fleet_kube import RuntimePod, Termination
from specdec_runtime.podstates import Terminated

NET = f"127.0.{random.randrange(150, 250)}"
PORT = random.randrange(20000, 30000)

# Serves /health on --host/--port like vLLM, after writing its argv and environment where the test can read them;
# refuses (exit 1, vLLM's last traceback line) a model path whose name says so.
FAKE_VLLM = f"""#!{sys.executable}
import http.server, json, os, signal, sys, time
def sigterm(*_):
    with open("sigterm.json", "w") as out:
        json.dump({{"at": time.monotonic()}}, out)
    os._exit(0)
signal.signal(signal.SIGTERM, sigterm)
args = sys.argv[1:]
with open("argv.json", "w") as out:
    json.dump({{"argv": args, "host_ip": os.environ.get("VLLM_HOST_IP"),
               "models": os.environ.get("SPECDEC_MODELS_DIR")}}, out)
if "refuse" in args[1]:
    print("Traceback (most recent call last):", flush=True)
    print("ValueError: User-specified max_model_len (1048576) is greater than the derived max_model_len", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer((args[args.index("--host") + 1], int(args[args.index("--port") + 1])), Health).serve_forever()
"""


class Reports:
    def __init__(self) -> None:
        self.running: list[tuple[str, int]] = []
        self.crashes: list[tuple[str, int, Terminated]] = []
        self.deleted: list[tuple[str, float]] = []
        self.deletion = asyncio.Event()

    async def report_running(self, pod: RuntimePod, restarts: int, last: Terminated | None) -> None:
        self.running.append((pod.name, restarts))

    async def report_crash(self, pod: RuntimePod, restarts: int, last: Terminated) -> None:
        self.crashes.append((pod.name, restarts, last))

    async def finish_deletion(self, pod: RuntimePod) -> None:
        self.deleted.append((pod.name, time.monotonic()))
        self.deletion.set()


@pytest.fixture
def settings(tmp_path: Path) -> EngineSettings:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text(FAKE_VLLM)
    (bin_dir / "vllm").chmod(0o755)
    tiny = tmp_path / "tiny"
    for name in ("target", "drafter-good", "drafter-poor"):
        (tiny / name).mkdir(parents=True)
    model_map = ModelMap.from_tiny_models(tiny, {"org/poor-drafter": Path("poor")})
    return EngineSettings(work_dir=tmp_path / "work", model_map=model_map, vllm_bin=bin_dir, max_engines=1)


def pod(name: str, uid: str, model: str = "org/target", drafter: str = "org/poor-drafter") -> RuntimePod:
    config = RuntimeConfig(model=model, served_model_name=name, port=PORT, engine="vllm",
                           speculative=SpeculativeSettings(method="draft_model", model=drafter,
                                                           num_speculative_tokens=3))
    command = ("vllm", *serve_args(config))  # as the operator renders a vLLM pool's container (render/pool.py)
    return RuntimePod(uid=uid, namespace="ns", name=name, pod_ip=f"{NET}.{len(uid) + 1}", config=config,
                      profile=None, command=command)


def same_file(link: str, target: Path | None) -> bool:
    return os.path.realpath(link) == os.path.realpath(str(target))


async def test_each_pod_runs_its_own_command_on_its_address_and_is_ready_on_health(settings: EngineSettings) -> None:
    reports = Reports()
    supervisor = EngineSupervisor(settings, reporter=reports)
    first, second = pod("a", "uid-a"), pod("b", "uid-bb")
    try:
        async def ready() -> bool:
            await supervisor.reconcile([first, second])
            return bool(reports.running)

        deadline = time.monotonic() + 60
        while not await ready():
            assert time.monotonic() < deadline, "never Ready"
            await asyncio.sleep(0.2)
        assert reports.running == [("a", 0)]
        # --max-engines 1: the second pod waits for room, not started.
        assert list(supervisor.engines) == ["uid-a"]
        seen = json.loads((settings.work_dir / "ns_a_uid-a" / "argv.json").read_text())
        argv = seen["argv"]
        assert argv[:2] == ["serve", str(Path(seen["models"]) / "org/target")]
        assert argv[argv.index("--host") + 1] == first.pod_ip and seen["host_ip"] == "127.0.0.1"
        drafter = json.loads(argv[argv.index("--speculative-config") + 1])["model"]
        assert same_file(drafter, settings.model_map.entries["org/poor-drafter"])
        assert same_file(argv[1], settings.model_map.default_target)
        # The first pod goes: the second starts.
        await supervisor.reconcile([second])
        assert list(supervisor.engines) == ["uid-bb"]
    finally:
        await supervisor.stop_all()
    assert not supervisor.engines


async def test_an_engine_that_exits_is_a_terminated_container_with_its_last_log_lines(
    settings: EngineSettings,
) -> None:
    reports = Reports()
    supervisor = EngineSupervisor(settings, reporter=reports)
    refused = pod("r", "uid-r", model="org/refuse-me")
    settings.model_map.entries["org/refuse-me"] = settings.work_dir.parent / "tiny" / "refuse-target"
    (settings.work_dir.parent / "tiny" / "refuse-target").mkdir()
    try:
        deadline = time.monotonic() + 60
        while not reports.crashes:
            assert time.monotonic() < deadline, "never exited"
            await supervisor.reconcile([refused])
            await asyncio.sleep(0.2)
    finally:
        await supervisor.stop_all()
    name, restarts, last = reports.crashes[0]
    assert (name, restarts, last.reason, last.exit_code) == ("r", 1, "Error", 1)
    assert last.message.splitlines()[-1].startswith("ValueError: User-specified max_model_len")
    # Backing off: the next resync does not start it again at once.
    await supervisor.reconcile([refused])
    assert not supervisor.engines
    await supervisor.stop_all()


def test_the_termination_message_is_the_logs_tail_as_the_kubelet_cuts_it(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("".join(f"\x1b[32mline {i}\x1b[0m\n\n" for i in range(200)))
    message = termination_message(log)
    lines = message.splitlines()
    assert lines[-1] == "line 199" and len(lines) == 80 and "\x1b" not in message
    log.write_text("x" * 5000 + "\nValueError: the end\n")
    message = termination_message(log)
    assert len(message.encode()) <= 2048 and message.endswith("ValueError: the end")


def test_the_engine_mode_refuses_to_start_without_its_venv_or_tiny_models(
    settings: EngineSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specdec_runtime.cli import main

    assert main(["fleet-driver", "--engine", "vllm", "--vllm-venv", str(tmp_path / "absent")]) == 2
    assert "run hack/vllm-cpu-env" in capsys.readouterr().err
    venv = settings.vllm_bin.parent
    assert main(["fleet-driver", "--engine", "vllm", "--vllm-venv", str(venv),
                 "--tiny-models", str(tmp_path / "no-models")]) == 2
    assert "run hack/tiny-models" in capsys.readouterr().err
    assert main(["fleet-driver", "--engine", "vllm", "--vllm-venv", str(venv), "--tiny-models", str(tmp_path / "tiny"),
                 "--model-map", "no-equals-sign"]) == 2
    assert "expected NAME=PATH" in capsys.readouterr().err


async def test_a_deleted_pods_engine_gets_sigterm_after_its_pre_stop_wait_and_holds_its_room_until_it_exits(
    settings: EngineSettings,
) -> None:
    """The kubelet's order: the engine serves through the preStop wait, then gets SIGTERM; the pod object is deleted
    once it exited; and until then its memory is taken (--max-engines 1: the next pod waits)."""
    reports = Reports()
    supervisor = EngineSupervisor(settings, reporter=reports)
    first, second = pod("a", "uid-a"), pod("b", "uid-bb")
    try:
        deadline = time.monotonic() + 60
        while not reports.running:
            assert time.monotonic() < deadline, "never Ready"
            await supervisor.reconcile([first, second])
            await asyncio.sleep(0.2)
        deleted_at = time.monotonic()
        leaving = replace(first, terminating=Termination(pre_stop_s=1.0, deadline=deleted_at + 60))
        await supervisor.reconcile([leaving, second])
        assert not supervisor.engines, "the second pod waits while the first one's engine still runs"
        await asyncio.wait_for(reports.deletion.wait(), 30)
        sigterm = json.loads((settings.work_dir / "ns_a_uid-a" / "sigterm.json").read_text())["at"]
        assert sigterm >= deleted_at + 1.0, "SIGTERM only after the preStop wait"
        assert reports.deleted[0][0] == "a" and reports.deleted[0][1] >= sigterm, "deleted once the engine exited"
        await supervisor.reconcile([leaving, second])
        assert list(supervisor.engines) == ["uid-bb"], "its room is free: the next pod starts"
        assert [name for name, _ in reports.deleted] == ["a"]
    finally:
        await supervisor.stop_all()
