"""The fleet driver's process management, with the pod list faked through its PodSource seam."""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import IO

import pytest

from specdec_runtime.config import RuntimeConfig, SpeculativeSettings
from specdec_runtime.fleet_driver import FleetSupervisor, drive, spawn_in_own_group
from specdec_runtime.fleet_kube import RuntimePod, require_loopback_server
from specdec_runtime.simulator.profile import PACKAGED_PROFILES_DIR


def make_pod(name: str, uid: str, ip: str = "127.0.100.5", k: int = 3, port: int = 8000) -> RuntimePod:
    config = RuntimeConfig(
        model="org/target", served_model_name="target", port=port,
        speculative=SpeculativeSettings(method="eagle", model="org/drafter", num_speculative_tokens=k),
    )
    return RuntimePod(uid=uid, namespace="ns", name=name, pod_ip=ip, config=config, profile="quick")


class Recorder:
    """Spawns a harmless long sleep in its own group in place of each simulator, recording the command."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    async def __call__(self, command: list[str], log: IO[bytes]) -> asyncio.subprocess.Process:
        self.commands.append(command)
        return await spawn_in_own_group([sys.executable, "-c", "import time; time.sleep(60)"], log)


def log_names(log_dir: Path) -> list[str]:
    return sorted(p.name for p in log_dir.iterdir())


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_processes_follow_pods_and_restart_on_replacement(tmp_path: Path) -> None:
    recorder = Recorder()
    supervisor = FleetSupervisor(PACKAGED_PROFILES_DIR, tmp_path, spawn=recorder)
    await supervisor.reconcile([make_pod("a", "uid-a1"), make_pod("b", "uid-b1", ip="127.0.100.6", k=5)])
    first = supervisor.processes
    assert sorted(first) == ["uid-a1", "uid-b1"]
    command_b = recorder.commands[1]
    assert command_b[command_b.index("--host") + 1] == "127.0.100.6"
    assert '"num_speculative_tokens":5' in command_b[command_b.index("--speculative-config") + 1]
    assert command_b[-2:] == ["--profile", str(PACKAGED_PROFILES_DIR / "quick.yaml")]

    await supervisor.reconcile([make_pod("a", "uid-a1"), make_pod("b", "uid-b1", ip="127.0.100.6", k=5)])
    assert supervisor.processes == first, "a steady pod keeps its process"

    # b replaced (new UID), a deleted.
    await supervisor.reconcile([make_pod("b", "uid-b2", ip="127.0.100.7", k=2)])
    assert list(supervisor.processes) == ["uid-b2"]
    assert group_is_gone(first["uid-a1"].pid) and group_is_gone(first["uid-b1"].pid)
    assert first["uid-b1"].returncode is not None
    assert log_names(tmp_path) == ["ns_a_uid-a1.log", "ns_b_uid-b1.log", "ns_b_uid-b2.log"]

    await supervisor.stop_all()
    assert supervisor.processes == {}
    assert len(recorder.commands) == 3


async def test_profile_comes_from_annotation_then_config_then_driver_default(tmp_path: Path) -> None:
    recorder = Recorder()
    supervisor = FleetSupervisor(PACKAGED_PROFILES_DIR, tmp_path, spawn=recorder, default_profile="quick")
    annotated = make_pod("a", "uid-a")
    configured = make_pod("b", "uid-b", ip="127.0.100.6")
    configured = replace(configured, profile=None, config=configured.config.model_copy(
        update={"simulator_profile": "default"}))
    bare = replace(make_pod("c", "uid-c", ip="127.0.100.7"), profile=None)
    await supervisor.reconcile([annotated, configured, bare])
    await supervisor.stop_all()
    assert [Path(command[-1]).stem for command in recorder.commands] == ["quick", "default", "quick"]


async def test_exited_process_is_restarted(tmp_path: Path) -> None:
    recorder = Recorder()
    supervisor = FleetSupervisor(PACKAGED_PROFILES_DIR, tmp_path, spawn=recorder)
    pod = make_pod("a", "uid-a")
    await supervisor.reconcile([pod])
    crashed = supervisor.processes["uid-a"]
    crashed.kill()
    await crashed.wait()
    await supervisor.reconcile([pod])
    assert supervisor.processes["uid-a"] is not crashed
    await supervisor.stop_all()


async def test_non_loopback_pod_ip_is_refused_loudly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    supervisor = FleetSupervisor(PACKAGED_PROFILES_DIR, tmp_path, spawn=recorder)
    await supervisor.reconcile([make_pod("x", "uid-x", ip="10.244.0.5"), make_pod("y", "uid-y", ip="fe80::1")])
    await supervisor.reconcile([make_pod("x", "uid-x", ip="10.244.0.5")])
    assert recorder.commands == []
    refusals = [r for r in caplog.records if "REFUSING" in r.getMessage()]
    assert len(refusals) == 2
    assert "10.244.0.5 is not loopback" in refusals[0].getMessage()


@pytest.mark.parametrize("url", ["https://10.0.0.1:6443", "https://api.example.com", ""])
def test_remote_api_servers_are_refused(url: str) -> None:
    with pytest.raises(RuntimeError, match="loopback"):
        require_loopback_server(url)
    require_loopback_server("https://127.0.0.1:6443")


class ScriptedSource:
    """Returns one pod list per resync, then keeps the last; a string entry means the API failed."""

    def __init__(self, script: list[list[RuntimePod] | str]) -> None:
        self.script = script
        self.calls = 0
        self.script_done = asyncio.Event()

    async def runtime_pods(self) -> list[RuntimePod]:
        entry = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if self.calls > len(self.script):
            self.script_done.set()
        if isinstance(entry, str):
            raise ConnectionError(entry)
        return entry


async def test_drive_serves_real_simulators_and_leaves_no_process_on_stop(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    quick = (PACKAGED_PROFILES_DIR / "quick.yaml").read_text()
    (profiles / "quick.yaml").write_text(quick.replace("restart_s: 2", "restart_s: 0.2"))
    pod = make_pod("a", "uid-a", ip="127.0.100.9", k=4, port=18977)
    source = ScriptedSource([[pod], "apiserver hiccup", [pod]])
    supervisor = FleetSupervisor(profiles, tmp_path / "logs")
    stop = asyncio.Event()
    driver = asyncio.create_task(drive(source, supervisor, stop, interval_s=0.1))

    def scrape() -> str:
        with urllib.request.urlopen("http://127.0.100.9:18977/metrics", timeout=2) as response:
            return str(response.read().decode())

    body = ""
    for _ in range(150):
        try:
            body = await asyncio.to_thread(scrape)
            break
        except OSError:
            await asyncio.sleep(0.1)
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="3"}' in body
    process = supervisor.processes["uid-a"]
    await asyncio.wait_for(source.script_done.wait(), 10)
    assert supervisor.processes["uid-a"] is process, "an API failure must not stop or restart processes"
    assert process.returncode is None
    stop.set()
    await asyncio.wait_for(driver, 10)
    assert process.returncode is not None and group_is_gone(process.pid)
