"""What a kubelet would report for a runtime pod on the local fleet, where the fleet driver stands in for it.

Pure: a pod (as the API returns it, camelCase dicts) and what exists in its namespace in; the container's
waiting or last-terminated state, restart count and Ready conditions out, as the kubelet writes them. The
same causes give the same reasons as on a real node:

- a Secret or ConfigMap, or a key in one, that the container's env references (`valueFrom`, `envFrom`) and
  that does not exist, unless the reference is optional: `CreateContainerConfigError`;
- an image the local fleet cannot "pull": `ErrImagePull`, then `ImagePullBackOff`. The local stand-in for a
  registry is a rule, not a network: the fleet holds the images this project builds,
  `ghcr.io/specdec/specdec-runtime` with a tag `0.1.0-simulator` or `0.1.0-vllm0.33.0-{cdna,rdna3,rdna4}`,
  plus any listed in the driver's `SPECDEC_FLEET_PULLABLE_IMAGES` (comma-separated); a reference that does not
  parse is `InvalidImageName`;
- a simulator that exits (it refused its arguments as vLLM would, or was told to simulate an OOM kill with the
  pod env `SPECDEC_SIMULATE_OOM=true`): `CrashLoopBackOff`, with `lastState.terminated` (`OOMKilled`, exit 137;
  or `Error` with the process's last stderr line as the message) and a growing restart count.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KNOWN_REPOSITORY = "ghcr.io/specdec/specdec-runtime"
KNOWN_TAG = re.compile(r"^0\.1\.0-(simulator|vllm0\.33\.0-(cdna|rdna3|rdna4))$")
PULLABLE_ENV = "SPECDEC_FLEET_PULLABLE_IMAGES"
SIMULATE_OOM_ENV = "SPECDEC_SIMULATE_OOM"
# The reference grammar's shape, enough to refuse what a kubelet refuses (upper case in a path, spaces).
REFERENCE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
                       r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$")
# The kubelet's restart back-off: 10 s, doubling, at most 5 minutes.
BACKOFF_FIRST_S = 10.0
BACKOFF_MAX_S = 300.0


@dataclass(frozen=True)
class Waiting:
    reason: str
    message: str


@dataclass(frozen=True)
class Terminated:
    reason: str  # Error | OOMKilled
    exit_code: int
    message: str = ""


def pullable_images(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    extra = (environ if environ is not None else os.environ).get(PULLABLE_ENV, "")
    return frozenset(image.strip() for image in extra.split(",") if image.strip())


def pull_failure(image: str, extra: Collection[str] = (), attempts: int = 0) -> Waiting | None:
    """The kubelet's waiting state for an image the local fleet cannot pull; None when it can.

    The first attempt reads ErrImagePull, later ones ImagePullBackOff, as the kubelet alternates."""
    if image in extra:
        return None
    if not REFERENCE.match(image):
        return Waiting("InvalidImageName", f'Failed to apply default image tag "{image}": couldn\'t parse image '
                                           f'reference "{image}": invalid reference format')
    repository, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    if repository == KNOWN_REPOSITORY and KNOWN_TAG.match(tag):
        return None
    if attempts > 0:
        return Waiting("ImagePullBackOff", f'Back-off pulling image "{image}"')
    return Waiting("ErrImagePull", f'failed to pull and unpack image "{image}": not found in the local fleet\'s '
                                   f"registry (it holds {KNOWN_REPOSITORY}:0.1.0-simulator and "
                                   f"0.1.0-vllm0.33.0-{{cdna,rdna3,rdna4}}, and {PULLABLE_ENV})")


def config_failure(container: Mapping[str, Any], namespace: str, secrets: Mapping[str, Mapping[str, Any]],
                   config_maps: Mapping[str, Mapping[str, Any]]) -> Waiting | None:
    """CreateContainerConfigError for the first env reference to a missing Secret, ConfigMap or key.

    `secrets` and `config_maps`: name -> data keys present (values are not needed) for what exists."""
    def missing(kind: str, found: Mapping[str, Mapping[str, Any]], name: str, key: str | None) -> str | None:
        if name not in found:
            return f'{kind.lower()} "{name}" not found'
        if key is not None and key not in found[name]:
            return f"couldn't find key {key} in {kind} {namespace}/{name}"
        return None

    for env in container.get("env") or []:
        source = env.get("valueFrom") or {}
        for field, kind, found in (("secretKeyRef", "Secret", secrets), ("configMapKeyRef", "ConfigMap", config_maps)):
            ref = source.get(field)
            if ref and not ref.get("optional"):
                problem = missing(kind, found, str(ref.get("name")), str(ref.get("key")))
                if problem:
                    return Waiting("CreateContainerConfigError", problem)
    for env_from in container.get("envFrom") or []:
        for field, kind, found in (("secretRef", "Secret", secrets), ("configMapRef", "ConfigMap", config_maps)):
            ref = env_from.get(field)
            if ref and not ref.get("optional"):
                problem = missing(kind, found, str(ref.get("name")), None)
                if problem:
                    return Waiting("CreateContainerConfigError", problem)
    return None


def referenced_objects(container: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(Secret names, ConfigMap names) the container's env reads, for the driver to look up."""
    secrets: set[str] = set()
    config_maps: set[str] = set()
    for env in container.get("env") or []:
        source = env.get("valueFrom") or {}
        if source.get("secretKeyRef"):
            secrets.add(str(source["secretKeyRef"].get("name")))
        if source.get("configMapKeyRef"):
            config_maps.add(str(source["configMapKeyRef"].get("name")))
    for env_from in container.get("envFrom") or []:
        if env_from.get("secretRef"):
            secrets.add(str(env_from["secretRef"].get("name")))
        if env_from.get("configMapRef"):
            config_maps.add(str(env_from["configMapRef"].get("name")))
    return secrets, config_maps


def simulates_oom(container: Mapping[str, Any]) -> bool:
    return any(env.get("name") == SIMULATE_OOM_ENV and str(env.get("value", "")).lower() in ("1", "true", "yes")
               for env in container.get("env") or [])


def backoff_s(restarts: int) -> float:
    return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** max(0, restarts - 1)))


def _ready_conditions(ready: bool, now: str, reason: str = "ContainersNotReady",
                      message: str = "") -> list[dict[str, Any]]:
    if ready:
        return [{"type": kind, "status": "True", "lastTransitionTime": now} for kind in ("Ready", "ContainersReady")]
    return [{"type": kind, "status": "False", "reason": reason, "message": message, "lastTransitionTime": now}
            for kind in ("Ready", "ContainersReady")]


def container_status(container: Mapping[str, Any], *, state: dict[str, Any], ready: bool, restarts: int,
                     last: Terminated | None, now: str) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": container.get("name"), "image": container.get("image"), "imageID": "",
        "ready": ready, "started": ready, "restartCount": restarts, "state": state,
    }
    if last is not None:
        terminated: dict[str, Any] = {"exitCode": last.exit_code, "reason": last.reason, "startedAt": now,
                                      "finishedAt": now}
        if last.message:
            terminated["message"] = last.message
        status["lastState"] = {"terminated": terminated}
    return status


def waiting_status(pod: Mapping[str, Any], waiting: Waiting, restarts: int, last: Terminated | None,
                   now: str, phase: str = "Pending") -> dict[str, Any]:
    """The status patch for a pod whose runtime container waits (config error, image pull, crash back-off)."""
    container = runtime_container(pod)
    unready = f"containers with unready status: [{container.get('name')}]"
    return {
        "phase": phase,
        "conditions": _ready_conditions(False, now, message=unready),
        "containerStatuses": [container_status(
            container, state={"waiting": {"reason": waiting.reason, "message": waiting.message}}, ready=False,
            restarts=restarts, last=last, now=now)],
    }


def running_status(pod: Mapping[str, Any], restarts: int, last: Terminated | None, now: str) -> dict[str, Any]:
    """The status patch for a pod whose container runs and is ready again."""
    container = runtime_container(pod)
    return {
        "phase": "Running",
        "conditions": _ready_conditions(True, now),
        "containerStatuses": [container_status(container, state={"running": {"startedAt": now}}, ready=True,
                                               restarts=restarts, last=last, now=now)],
    }


def crash_waiting(pod: Mapping[str, Any], restarts: int) -> Waiting:
    meta = pod.get("metadata") or {}
    container = runtime_container(pod)
    return Waiting("CrashLoopBackOff", f"back-off {backoff_s(restarts):.0f}s restarting failed "
                                       f"container={container.get('name')} pod={meta.get('name')}_"
                                       f"{meta.get('namespace')}({meta.get('uid')})")


def runtime_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod's first container: runtime pods run vLLM (here, its simulator) alone."""
    containers: Sequence[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or [{}]
    return containers[0]


def pre_stop_sleep_s(container: Mapping[str, Any]) -> float:
    """The container's preStop sleep action (lifecycle.preStop.sleep.seconds): how long the kubelet waits before it
    sends SIGTERM. 0 without one."""
    pre_stop = ((container.get("lifecycle") or {}).get("preStop") or {})
    return float((pre_stop.get("sleep") or {}).get("seconds") or 0)


def reports_running(pod: Mapping[str, Any], restarts: int) -> bool:
    """Whether the pod's status already says its runtime container runs, ready, after `restarts` restarts."""
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    containers = status.get("containerStatuses") or []
    return ready and status.get("phase") == "Running" and any(
        c.get("ready") and "running" in (c.get("state") or {}) and int(c.get("restartCount", 0)) == restarts
        for c in containers)


def current_waiting(pod: Mapping[str, Any]) -> str | None:
    """The waiting reason the pod's status shows now, if any."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting:
            return str(waiting.get("reason"))
    return None
