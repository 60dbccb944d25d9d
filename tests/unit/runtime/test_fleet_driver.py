"""The fleet driver hosts simulators in its own process, with the pod list faked through its PodSource seam."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from specdec_runtime.config import RuntimeConfig, SpeculativeSettings
from specdec_runtime.fleet_driver import FleetSupervisor, drive
from specdec_runtime.fleet_kube import RuntimePod, Termination, require_loopback_server
from specdec_runtime.simulator.profile import PACKAGED_PROFILES_DIR

# A loopback /24 of our own, with a random port, so parallel test runs do not collide.
NET = f"127.0.{random.randrange(150, 250)}"
PORT = random.randrange(20000, 30000)


def make_pod(name: str, uid: str, ip: str = f"{NET}.5", k: int = 3, port: int = PORT) -> RuntimePod:
    config = RuntimeConfig(
        model="org/target", served_model_name="target", port=port,
        speculative=SpeculativeSettings(method="eagle", model="org/drafter", num_speculative_tokens=k),
    )
    return RuntimePod(uid=uid, namespace="ns", name=name, pod_ip=ip, config=config, profile="quick")


@pytest.fixture
def fast_profiles(tmp_path: Path) -> Path:
    """The packaged quick profile with a 0.2 s load time, so simulators answer almost at once."""
    quick = (PACKAGED_PROFILES_DIR / "quick.yaml").read_text()
    (tmp_path / "quick.yaml").write_text(quick.replace("restart_s: 2", "restart_s: 0.2"))
    (tmp_path / "default.yaml").write_text((PACKAGED_PROFILES_DIR / "default.yaml").read_text())
    return tmp_path


async def metrics_of(ip: str, port: int = PORT) -> str:
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 60  # the driver starts its simulators in the background
        while time.monotonic() < deadline:
            try:
                async with session.get(f"http://{ip}:{port}/metrics") as response:
                    if response.status == 200:
                        return await response.text()
            except aiohttp.ClientConnectionError:
                pass  # the driver has not started it yet
            await asyncio.sleep(0.05)
    raise AssertionError(f"{ip}:{port} never served /metrics")


def generation_tokens(body: str) -> float:
    line = next(line for line in body.splitlines() if line.startswith("vllm:generation_tokens_total{"))
    return float(line.rsplit(" ", 1)[1])


def refuses_connections(ip: str, port: int = PORT) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((ip, port)) != 0


async def test_simulators_follow_pods_each_with_its_own_k_and_fresh_counters(fast_profiles: Path) -> None:
    supervisor = FleetSupervisor(fast_profiles)
    a, b = make_pod("a", "uid-a1", ip=f"{NET}.5"), make_pod("b", "uid-b1", ip=f"{NET}.6", k=5)
    await supervisor.reconcile([a, b])
    first = supervisor.simulators
    assert sorted(first) == ["uid-a1", "uid-b1"]
    body_a, body_b = await metrics_of(f"{NET}.5"), await metrics_of(f"{NET}.6")
    assert 'position="2"' in body_a and 'position="3"' not in body_a, "pod a serves its own K=3"
    assert 'position="4"' in body_b, "pod b serves its own K=5"

    await supervisor.reconcile([a, b])
    assert supervisor.simulators == first, "a steady pod keeps its simulator"

    await asyncio.sleep(1.0)
    before = generation_tokens(await metrics_of(f"{NET}.6"))
    # b replaced under the same IP (new UID, new K), a deleted.
    await supervisor.reconcile([make_pod("b", "uid-b2", ip=f"{NET}.6", k=2)])
    assert list(supervisor.simulators) == ["uid-b2"]
    assert supervisor.simulators["uid-b2"] is not first["uid-b1"]
    assert refuses_connections(f"{NET}.5"), "a deleted pod's listener is closed"
    after = generation_tokens(await metrics_of(f"{NET}.6"))
    assert after < before, f"a replaced pod's counters restart from zero ({before} -> {after})"
    assert 'position="2"' not in await metrics_of(f"{NET}.6"), "the replacement serves its new K=2"

    await supervisor.stop_all()
    assert supervisor.simulators == {}
    assert refuses_connections(f"{NET}.6")


async def test_profile_comes_from_annotation_then_config_then_driver_default(fast_profiles: Path) -> None:
    supervisor = FleetSupervisor(fast_profiles, default_profile="quick")
    annotated = make_pod("a", "uid-a", ip=f"{NET}.10")
    configured = make_pod("b", "uid-b", ip=f"{NET}.11")
    configured = replace(configured, profile=None, config=configured.config.model_copy(
        update={"simulator_profile": "default"}))
    bare = replace(make_pod("c", "uid-c", ip=f"{NET}.12"), profile=None)
    await supervisor.reconcile([annotated, configured, bare])
    try:
        chosen = {uid: hosted.simulator.options.profile.stem for uid, hosted in supervisor.simulators.items()}
        assert chosen == {"uid-a": "quick", "uid-b": "default", "uid-c": "quick"}
        # Pods share a parsed profile but not an engine or a random stream.
        engines = {id(hosted.simulator.replica.engine) for hosted in supervisor.simulators.values()}
        assert len(engines) == 3
    finally:
        await supervisor.stop_all()


async def test_non_loopback_pod_ip_is_refused_loudly(fast_profiles: Path, caplog: pytest.LogCaptureFixture) -> None:
    supervisor = FleetSupervisor(fast_profiles)
    await supervisor.reconcile([make_pod("x", "uid-x", ip="10.244.0.5"), make_pod("y", "uid-y", ip="fe80::1")])
    await supervisor.reconcile([make_pod("x", "uid-x", ip="10.244.0.5")])
    assert supervisor.simulators == {}
    refusals = [r for r in caplog.records if "REFUSING" in r.getMessage()]
    assert len(refusals) == 2, "each refused pod is logged once, not on every resync"
    assert "10.244.0.5 is not loopback" in refusals[0].getMessage()


async def test_a_taken_address_is_retried_on_the_next_resync(fast_profiles: Path) -> None:
    ip = f"{NET}.20"
    squatter = socket.socket()
    squatter.bind((ip, PORT))
    squatter.listen()
    supervisor = FleetSupervisor(fast_profiles)
    try:
        await supervisor.reconcile([make_pod("a", "uid-a", ip=ip)])
        assert supervisor.simulators == {}
        squatter.close()
        await supervisor.reconcile([make_pod("a", "uid-a", ip=ip)])
        assert list(supervisor.simulators) == ["uid-a"]
        assert "vllm:generation_tokens_total" in await metrics_of(ip)
    finally:
        squatter.close()
        await supervisor.stop_all()


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


async def test_drive_keeps_simulators_through_api_failures_and_closes_them_on_stop(fast_profiles: Path) -> None:
    pod = make_pod("a", "uid-a", ip=f"{NET}.9", k=4)
    source = ScriptedSource([[pod], "apiserver hiccup", [pod]])
    supervisor = FleetSupervisor(fast_profiles)
    stop = asyncio.Event()
    driver = asyncio.create_task(drive(source, supervisor, stop, interval_s=0.1))
    body = await metrics_of(f"{NET}.9")
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="3"}' in body
    hosted = supervisor.simulators["uid-a"]
    await asyncio.wait_for(source.script_done.wait(), 10)
    assert supervisor.simulators["uid-a"] is hosted, "an API failure must not stop or restart simulators"
    stop.set()
    await asyncio.wait_for(driver, 10)
    assert refuses_connections(f"{NET}.9")


class Deletions:
    """The reporter seam: records each pod deletion the driver finishes, and when."""

    def __init__(self, failures: int = 0) -> None:
        self.finished: list[tuple[str, float]] = []
        self.failures = failures
        self.done = asyncio.Event()

    async def report_crash(self, pod: RuntimePod, restarts: int, last: object) -> None:
        return None

    async def report_running(self, pod: RuntimePod, restarts: int, last: object) -> None:
        return None

    async def finish_deletion(self, pod: RuntimePod) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("apiserver hiccup")
        self.finished.append((pod.uid, time.monotonic()))
        self.done.set()


async def completion(ip: str, max_tokens: int, started: asyncio.Event | None = None,
                     port: int = PORT) -> tuple[int, float]:
    """A streamed completion: (HTTP status, or 0 for a cut stream or connection; when the answer ended). `started` is
    set at its first token."""
    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(f"http://{ip}:{port}/v1/completions", json={
                    "model": "target", "prompt": "tok tok tok", "max_tokens": max_tokens, "stream": True}) as response:
                text = ""
                async for chunk in response.content.iter_any():
                    text += chunk.decode()
                    if started is not None:
                        started.set()
                complete = response.status != 200 or "[DONE]" in text
                return (response.status if complete else 0), time.monotonic()
        except (aiohttp.ClientError, OSError):
            return 0, time.monotonic()


async def ready(ip: str, port: int = PORT) -> None:
    """Until /health answers 200: the simulator has loaded its model (503 before, as vLLM's)."""
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"http://{ip}:{port}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)


async def in_flight(ip: str, max_tokens: int) -> asyncio.Task[tuple[int, float]]:
    """A long request, returned once its first token arrived."""
    await asyncio.wait_for(ready(ip), 30)
    started = asyncio.Event()
    request = asyncio.create_task(completion(ip, max_tokens, started))
    await asyncio.wait_for(started.wait(), 30)
    return request


def terminating(pod: RuntimePod, pre_stop_s: float, grace_s: float = 60.0) -> RuntimePod:
    return replace(pod, terminating=Termination(pre_stop_s, time.monotonic() + grace_s))


async def test_a_deleted_pod_serves_through_its_pre_stop_wait_then_finishes_its_requests_before_it_is_deleted(
    fast_profiles: Path,
) -> None:
    """The kubelet's order, with vLLM's --shutdown-timeout: new requests still answered during the preStop wait;
    at SIGTERM new ones are answered 500 as vLLM's server answers them while it drains, the request in flight
    completes, and only then is the pod deleted, its listener closed."""
    deletions = Deletions()
    supervisor = FleetSupervisor(fast_profiles, reporter=deletions)
    pod = make_pod("a", "uid-a", ip=f"{NET}.20")
    pod = replace(pod, config=pod.config.model_copy(update={"shutdown_timeout": 30}))
    await supervisor.reconcile([pod])
    hosted = supervisor.simulators["uid-a"]
    long_request = await in_flight(f"{NET}.20", max_tokens=300)

    await supervisor.reconcile([terminating(pod, pre_stop_s=2.0)])
    assert supervisor.simulators == {}, "a terminating pod's simulator is no longer the driver's to restart"
    status, _ = await completion(f"{NET}.20", max_tokens=5)
    assert status == 200, "during the preStop wait the pod still answers what reaches it"

    await asyncio.wait_for(hosted.simulator.draining.wait(), 30)
    assert not long_request.done(), "the long request is in flight at SIGTERM"
    status, _ = await completion(f"{NET}.20", max_tokens=5)
    assert status == 500, "while it drains the pod still listens and refuses new work with a 500, as vLLM"
    await asyncio.wait_for(deletions.done.wait(), 30)
    status, answered_at = await long_request
    assert status == 200, "the request in flight at SIGTERM finished (vLLM's drain)"
    assert deletions.finished == [("uid-a", deletions.finished[0][1])]
    assert answered_at <= deletions.finished[0][1], "the pod is deleted only after its requests finished"
    assert refuses_connections(f"{NET}.20")

    await supervisor.reconcile([terminating(pod, pre_stop_s=2.0)])
    assert len(deletions.finished) == 1, "a termination runs once, however often the pod is seen"
    await supervisor.stop_all()


async def test_without_a_shutdown_timeout_sigterm_aborts_the_requests_in_flight(fast_profiles: Path) -> None:
    """vLLM's default, --shutdown-timeout 0: the simulator cuts what it serves at SIGTERM, as the engine aborts it."""
    deletions = Deletions()
    supervisor = FleetSupervisor(fast_profiles, reporter=deletions)
    pod = make_pod("a", "uid-a", ip=f"{NET}.21")
    await supervisor.reconcile([pod])
    long_request = await in_flight(f"{NET}.21", max_tokens=2000)
    await supervisor.reconcile([terminating(pod, pre_stop_s=0.0)])
    await asyncio.wait_for(deletions.done.wait(), 30)
    status, _ = await long_request
    assert status == 0, "the request in flight was cut"
    await supervisor.stop_all()


async def test_a_deleted_pod_nothing_runs_for_is_deleted_at_once_and_again_after_a_failed_delete(
    fast_profiles: Path,
) -> None:
    deletions = Deletions(failures=1)
    supervisor = FleetSupervisor(fast_profiles, reporter=deletions)
    pod = make_pod("a", "uid-a", ip=f"{NET}.22")
    await supervisor.reconcile([terminating(pod, pre_stop_s=30.0)])
    assert supervisor.simulators == {}, "a pod first seen terminating never starts"
    while not deletions.done.is_set():  # the first delete fails; each resync tries again
        await supervisor.reconcile([terminating(pod, pre_stop_s=30.0)])
        await asyncio.sleep(0)
    assert [uid for uid, _ in deletions.finished] == ["uid-a"]
    await supervisor.stop_all()
