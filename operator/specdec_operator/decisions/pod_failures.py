"""Why a runtime pod does not serve, in the kubelet's own words.

Pure: the runtime pod as the watch cache keeps it (handlers/services/watches.py runtime_pod_view) in; one named
cause out, with the message the kubelet (or the scheduler) wrote. A rollout that waits on such a pod
says so instead of "waiting for ...", and each cause is its own condition reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Waiting reasons that mean the container cannot start until someone fixes something.
CONFIG_REASONS = ("CreateContainerConfigError", "CreateContainerError", "InvalidImageName")
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff")


@dataclass(frozen=True)
class PodFailure:
    pod: str
    pool: str
    reason: str  # one of conditions.POD_FAILURE_REASONS
    message: str  # the kubelet's or scheduler's message, with the last exit where there was one


def _last_exit(status: Mapping[str, Any]) -> str:
    terminated = ((status.get("lastState") or {}).get("terminated")) or {}
    if not terminated:
        return ""
    reason = terminated.get("reason") or "Error"
    code = terminated.get("exitCode")
    message = str(terminated.get("message") or "").strip()
    text = f"last exit {reason} (exit code {code})" if code is not None else f"last exit {reason}"
    return f"{text}: {message}" if message else text


def container_failure(status: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) for one container status, or None when it is starting or running as it should."""
    waiting = ((status.get("state") or {}).get("waiting")) or {}
    reason = str(waiting.get("reason") or "")
    message = str(waiting.get("message") or "").strip()
    restarts = int(status.get("restartCount") or 0)
    if reason in CONFIG_REASONS or reason in PULL_REASONS:
        return reason, message or reason
    last = ((status.get("lastState") or {}).get("terminated")) or {}
    if reason == "CrashLoopBackOff":
        cause = "OOMKilled" if last.get("reason") == "OOMKilled" else "CrashLoopBackOff"
        detail = _last_exit(status) or message or "container keeps exiting"
        return cause, f"{detail} ({restarts} restarts)"
    running = (status.get("state") or {}).get("running") is not None
    if running and status.get("started") is False and restarts > 0:
        # The kubelet restarts a container whose startup probe keeps failing; until one passes, started=false.
        exit_text = _last_exit(status)
        return "StartupProbeFailed", (f"startup probe has not passed after {restarts} restarts"
                                      + (f"; {exit_text}" if exit_text else ""))
    return None


def pod_failure(pod: Mapping[str, Any], pool_label: str) -> PodFailure | None:
    """The first failing runtime container of `pod`, or its scheduler message when it cannot be placed."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return None  # a terminating pod is going anyway
    name = str(meta.get("name", ""))
    pool = str((meta.get("labels") or {}).get(pool_label, ""))
    for container in status.get("containerStatuses") or []:
        found = container_failure(container)
        if found is not None:
            reason, message = found
            return PodFailure(name, pool, reason, f"container {container.get('name')}: {message}")
    for condition in status.get("conditions") or []:
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            return PodFailure(name, pool, "Unschedulable", str(condition.get("message") or "Unschedulable"))
    return None


def pod_failures(pods: Iterable[Mapping[str, Any]], pool_label: str) -> list[PodFailure]:
    found = [failure for pod in pods if (failure := pod_failure(pod, pool_label)) is not None]
    return sorted(found, key=lambda f: (f.pool, f.reason, f.pod))


def failure_summaries(failures: Sequence[PodFailure], skip: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(reason, message) per pool and cause: the first pod's message, and how many pods share it.

    `skip`: reasons reported elsewhere (Unschedulable has its own grace, reconcile/capacity.py).
    """
    grouped: dict[tuple[str, str], list[PodFailure]] = {}
    for failure in failures:
        if failure.reason in skip:
            continue
        grouped.setdefault((failure.pool, failure.reason), []).append(failure)
    summaries = []
    for (pool, reason), group in grouped.items():
        first = group[0]
        more = f" (and {len(group) - 1} more pod(s))" if len(group) > 1 else ""
        summaries.append((reason, f"{pool}: pod {first.pod}: {first.message}{more}"))
    return summaries
