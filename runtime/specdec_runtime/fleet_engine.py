"""The fleet driver with the real engine (`specdec-runtime fleet-driver --engine vllm`): a kubelet for runtime pods that
runs each pod's own container command (`vllm serve` with the arguments the operator rendered, or our launcher
reading the rendered config) as a process of its own, bound to the pod's loopback IP and port.

What a kubelet does, and this does too:
- the pod's ConfigMap volume: the rendered runtime.json is written to a directory of the pod's and the container's
  `--config /etc/specdec/runtime.json` points there; the pod's network namespace, where vLLM's `--host 0.0.0.0`
  means the pod's address: the config's host is the pod IP;
- the image's baked checkpoints: a model map (spec model name -> local checkpoint) laid out as a directory of links,
  handed to the launcher as `SPECDEC_MODELS_DIR`; names the map lacks fall back to the default target or drafter, if
  one is given, else stay hub ids (which an offline engine refuses, as a pod without network would);
- readiness from vLLM's own `GET /health`; an engine that exits is a terminated container (exit code, reason
  `Error`, or `OOMKilled` for SIGKILL, and the tail of its log as the message, as `FallbackToLogsOnError` gives) and
  restarts with the kubelet's back-off, so the operator's pod-failure conditions read vLLM's own errors.

Memory is the limit here (about 4 GB per CPU engine): at most `max_engines` run at once; a pod beyond that waits,
not ready, as a pod would for a node with room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from specdec_runtime import contract
from specdec_runtime.config import serve_args
from specdec_runtime.fleet_kube import RuntimePod
from specdec_runtime.launcher import MODELS_DIR_ENV, VLLM_EXECUTABLE, with_local_models
from specdec_runtime.podstates import Terminated, backoff_s
from specdec_runtime.supervision import PodSupervisor, has_loopback_ip

logger = logging.getLogger(__name__)

# vLLM's CPU engine: loopback only (without VLLM_HOST_IP the engine core announces the machine's non-loopback address
# for its message queue), a 1 GiB KV cache, no core pinning on a shared machine, and never a hub. The model runs in
# the engine core's process: by default the CPU build starts a third process for its one worker, and each process
# imports torch and vLLM again (about 15 s of a core and 1.3 GB per engine here: 50 s -> 35 s to a healthy engine,
# 4.2 -> 3 GB). vLLM accepts its single-process executor on CPU only with V1 multiprocessing off, which still
# keeps the engine core apart from the API server.
# One OpenMP thread per engine: a CPU engine's two threads wait for each other at every barrier by spinning, and on
# two cores shared with another engine and the other test lanes one of them is often descheduled. Measured here with
# four busy processes beside two engines (4 requests of 100 tokens at a time): two threads served 20-360 tokens/s
# (TPOT 11-201 ms), one thread 420-740 (5-9 ms). The slow reading is the one that made a leaving engine's queue
# outlast its drain in CI (TPOT p90 883 ms).
ENGINE_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
STOP_GRACE_S = 20.0
HEALTH_TIMEOUT_S = 2.0
# The kubelet's termination message from logs: at most 80 lines and 2,048 bytes of the tail.
MESSAGE_LINES = 80
MESSAGE_BYTES = 2048
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class ModelMap:
    """Spec model names -> local checkpoint directories, with fallbacks for unmapped targets and drafters."""

    entries: dict[str, Path] = field(default_factory=dict)
    default_target: Path | None = None
    default_drafter: Path | None = None

    def target(self, name: str) -> Path | None:
        return self.entries.get(name, self.default_target)

    def drafter(self, name: str) -> Path | None:
        return self.entries.get(name, self.default_drafter)

    @classmethod
    def from_tiny_models(cls, tiny_dir: Path, entries: dict[str, Path], drafter: str = "good") -> ModelMap:
        """`specdec-runtime tiny-model`'s output as the fallbacks: its target and `drafter-<drafter>`; an entry's
        value that is a bare name (`poor`, `target`) means that checkpoint of tiny_dir."""
        resolved = {}
        for name, path in entries.items():
            local = tiny_dir / (str(path) if str(path) == "target" else f"drafter-{path}")
            resolved[name] = local if not path.is_absolute() and local.is_dir() else path
        return cls(resolved, tiny_dir / "target", tiny_dir / f"drafter-{drafter}")


@dataclass(frozen=True)
class EngineSettings:
    work_dir: Path  # models/ (the map's links), and per pod its runtime.json and log
    model_map: ModelMap
    vllm_bin: Path  # the engine venv's bin: its `vllm` is what the launcher execs
    max_engines: int = 2
    launcher: Path = Path(sys.executable).parent / "specdec-runtime"


@dataclass
class Engine:
    pod: RuntimePod
    process: asyncio.subprocess.Process
    log_path: Path
    url: str
    started: float  # monotonic
    ready: bool = False
    waiter: asyncio.Task[int] | None = None


def termination_message(log_path: Path) -> str:
    """The tail of the container's log, as the kubelet writes it with terminationMessagePolicy FallbackToLogsOnError."""
    try:
        with log_path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - 64 * 1024))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [_ANSI.sub("", line).rstrip() for line in tail.splitlines()]
    lines = [line for line in lines if line.strip()][-MESSAGE_LINES:]
    text = "\n".join(lines)
    encoded = text.encode()
    return encoded[-MESSAGE_BYTES:].decode("utf-8", errors="ignore") if len(encoded) > MESSAGE_BYTES else text


def _link(models: Path, name: str, target: Path | None) -> None:
    if target is None or not name or Path(name).is_absolute():
        return
    link = models / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target.resolve(), target_is_directory=True)


def _die_with_parent() -> None:
    """Engines die with the driver (PR_SET_PDEATHSIG survives the launcher's exec): never an orphaned 4 GB engine."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class EngineSupervisor(PodSupervisor):
    """Owns one engine process per pod UID, with the same contract as the simulator's FleetSupervisor."""

    def __init__(self, settings: EngineSettings, reporter: object | None = None) -> None:
        super().__init__(getattr(reporter, "finish_deletion", None))
        self.settings = settings
        self.reporter = reporter
        self._engines: dict[str, Engine] = {}
        self._waiting_logged: set[str] = set()
        self._http: aiohttp.ClientSession | None = None

    @property
    def engines(self) -> dict[str, Engine]:
        return dict(self._engines)

    def _serving(self) -> Collection[str]:
        return self._engines.keys()

    def _may_start(self, pod: RuntimePod) -> bool:
        # A terminating engine holds its memory until it exits, as a pod's containers hold their node's.
        if len(self._engines) + self._terminations.holding < self.settings.max_engines:
            return True
        if pod.uid not in self._waiting_logged:
            self._waiting_logged.add(pod.uid)
            logger.warning("pod %s/%s waits: %d engines already run (--max-engines)", pod.namespace, pod.name,
                           len(self._engines))
        return False

    async def stop_all(self) -> None:
        await self._terminations.close()
        for uid in list(self._engines):
            await self._stop(uid, "fleet driver shutting down")
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _pod_dir(self, pod: RuntimePod) -> Path:
        return self.settings.work_dir / f"{pod.namespace}_{pod.name}_{pod.uid[:8]}"

    def _command(self, pod: RuntimePod, config_path: Path, models: Path) -> list[str]:
        """The container's command as the operator rendered it, the config mount mapped to the pod's copy.

        A vLLM pool's container runs `vllm serve ...` itself (render/pool.py engine_args): its arguments are the
        rendered config's, which this driver checks, with what a pod's own world gives a process here: the pod's
        address for `--host 0.0.0.0` (its network namespace) and the local checkpoints for model names (an
        image's baked ones)."""
        mount = f"{contract.CONFIG_MOUNT_PATH}/{contract.CONFIG_KEY}"
        command = list(pod.command) or ["specdec-runtime", "launch", "--config", mount]
        if command[0] == VLLM_EXECUTABLE:
            if command[1:] != serve_args(pod.config):
                logger.error("pod %s/%s: vllm's arguments are not its config's: %s", pod.namespace, pod.name,
                             shlex.join(command[1:]))
                return [str(self.settings.vllm_bin / VLLM_EXECUTABLE), *command[1:]]
            local = with_local_models(pod.config.model_copy(update={"host": pod.pod_ip}), models)
            return [str(self.settings.vllm_bin / VLLM_EXECUTABLE), *serve_args(local)]
        if command[0] == "specdec-runtime":  # the image's PATH: the launcher this driver runs from
            command[0] = str(self.settings.launcher)
        return [str(config_path) if arg == mount else arg for arg in command]

    async def _start(self, pod: RuntimePod) -> None:
        where = f"{pod.namespace}/{pod.name}"
        if not has_loopback_ip(pod):
            logger.error("REFUSING pod %s: podIP %s is not loopback (127.0.0.0/8)", where, pod.pod_ip)
            self._refused.add(pod.uid)
            return
        self._waiting_logged.discard(pod.uid)
        directory = self._pod_dir(pod)
        directory.mkdir(parents=True, exist_ok=True)
        # One models dir for every pod (the map is the driver's, like an image's baked checkpoints): the same paths
        # in every engine's config let vLLM's torch.compile cache (~/.cache/vllm) serve later starts.
        models = self.settings.work_dir / "models"
        models.mkdir(parents=True, exist_ok=True)
        config = pod.config.model_copy(update={"host": pod.pod_ip})
        config_path = directory / contract.CONFIG_KEY
        config_path.write_text(config.to_json())
        _link(models, config.model, self.settings.model_map.target(config.model))
        if config.speculative is not None and config.speculative.model:
            _link(models, config.speculative.model, self.settings.model_map.drafter(config.speculative.model))
        env = {
            **os.environ,
            **ENGINE_ENV,
            MODELS_DIR_ENV: str(models),
            "PATH": f"{self.settings.vllm_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        log_path = directory / "engine.log"
        command = self._command(pod, config_path, models)
        with log_path.open("ab") as log:
            log.write(f"--- start {time.strftime('%H:%M:%S')}: {' '.join(command)}\n".encode())
            log.flush()
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env,
                cwd=str(directory), start_new_session=True, preexec_fn=_die_with_parent,
            )
        engine = Engine(pod, process, log_path, f"http://{pod.pod_ip}:{config.port}", time.monotonic())
        engine.waiter = asyncio.create_task(process.wait())
        self._engines[pod.uid] = engine
        logger.info("started engine for %s on %s:%d (K=%d, pid %d, log %s)", where, pod.pod_ip, config.port,
                    config.k, process.pid, log_path)

    async def _collect_exits(self) -> None:
        for uid, engine in list(self._engines.items()):
            if engine.waiter is None or not engine.waiter.done():
                continue
            del self._engines[uid]
            code = engine.waiter.result()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(engine.process.pid, signal.SIGKILL)  # what the exited process left in its group
            exit_code = 128 - code if code < 0 else code
            reason = "OOMKilled" if code == -signal.SIGKILL else ("Completed" if code == 0 else "Error")
            await self._exited(engine.pod, Terminated(reason, exit_code, termination_message(engine.log_path)))

    async def _exited(self, pod: RuntimePod, last: Terminated) -> None:
        restarts = self._crashed(pod, last).restarts
        final = last.message.splitlines()[-1] if last.message else ""
        logger.warning("engine of %s/%s exited (%s, exit code %d: %s); restart %d in %.0fs", pod.namespace, pod.name,
                       last.reason, last.exit_code, final, restarts, backoff_s(restarts))
        report = getattr(self.reporter, "report_crash", None)
        if report is not None:
            await report(pod, restarts, last)

    async def _report_ready(self) -> None:
        """vLLM's readiness probe: GET /health answers 200 once the engine serves (the rendered probe's path)."""
        loading = [engine for engine in self._engines.values() if not engine.ready]
        if not loading:
            return
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S))
        for engine in loading:
            try:
                async with self._http.get(f"{engine.url}/health") as response:
                    healthy = response.status == 200
            except (aiohttp.ClientError, TimeoutError, OSError):
                healthy = False
            if not healthy:
                continue
            engine.ready = True
            pod = engine.pod
            logger.info("engine for %s/%s is healthy after %.0fs", pod.namespace, pod.name,
                        time.monotonic() - engine.started)
            report = getattr(self.reporter, "report_running", None)
            if report is not None:
                await report(pod, *self._crash_history(pod.uid))

    def _begin_termination(self, pod: RuntimePod) -> None:
        """The pod is being deleted: its engine serves through the preStop wait, then gets SIGTERM and drains for its
        --shutdown-timeout (termination.py); it is killed at the end of the pod's grace period."""
        engine = self._engines.pop(pod.uid, None)
        if engine is None:
            self._terminations.begin(pod, None)
            return

        async def stop(seconds: float) -> None:
            await self._terminate(engine, "pod deleted", seconds)

        self._terminations.begin(pod, stop)

    async def _stop(self, uid: str, reason: str) -> None:
        await self._terminate(self._engines.pop(uid), reason, STOP_GRACE_S)

    async def _terminate(self, engine: Engine, reason: str, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after grace_s seconds if the engine still runs."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(engine.waiter) if engine.waiter else engine.process.wait(),
                                   grace_s)
        except TimeoutError:
            logger.warning("engine of %s/%s did not stop in %.0fs; killing it", engine.pod.namespace,
                           engine.pod.name, grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.process.pid, signal.SIGKILL)  # the engine core and workers, whatever the API server did
        if engine.waiter is not None and not engine.waiter.done():
            await engine.process.wait()
        logger.info("stopped engine for %s/%s: %s", engine.pod.namespace, engine.pod.name, reason)
