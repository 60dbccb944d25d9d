"""When to retry an API call, and how long to wait: exponential backoff with full jitter, honouring Retry-After.

Pure (no client, no clock of its own) so the schedule is unit-tested without a server.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

# 429 (throttled, or a priority-and-fairness rejection) and the 5xx an API server answers while it restarts
# or while etcd is unavailable. 500 may come from a webhook that failed; retrying it is still safe for our
# idempotent requests (server-side apply, merge patches with a resourceVersion precondition, GET, DELETE).
RETRIABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Backoff:
    """Delay before retry `attempt` (0-based): uniform in [0, min(cap, base * 2**attempt)] (full jitter)."""

    base_s: float = 0.2
    cap_s: float = 10.0
    attempts: int = 4  # retries after the first try; every request stays well below a reconcile period

    def delay(self, attempt: int, retry_after_s: float | None, rng: random.Random | None = None) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** attempt))
        jittered = (rng or random).uniform(0.0, ceiling)
        if retry_after_s is None:
            return jittered
        # The server asked for at least this long; we never wait longer than the cap per retry.
        return min(self.cap_s, max(retry_after_s, jittered))


def retry_after_seconds(headers: Mapping[str, str], now_epoch_s: float | None = None) -> float | None:
    """Retry-After as seconds: either delta-seconds or an HTTP date (then `now_epoch_s` is needed)."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if now_epoch_s is None:
        return None
    return max(0.0, moment.timestamp() - now_epoch_s)


def parse_error_body(status: int, body: bytes) -> tuple[str, str]:
    """(reason, message) of a refused request; a body that is not a Status object (an HTML page from a proxy,
    an empty body, broken JSON) still yields the status code and a readable excerpt, never an exception."""
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text) if text.strip() else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        reason = str(data.get("reason", "") or "")
        message = str(data.get("message", "") or "") or text[:300]
        return reason, message
    return "", text[:300].strip() or f"HTTP {status} with an empty body"


class DownstreamBackoff:
    """Exponential backoff for one owned object the API server keeps refusing (a 4xx on a write).

    Keyed by the refused request, so a changed spec (a different body) is tried again at once.
    Times are monotonic seconds.
    """

    def __init__(self, base_s: float = 10.0, cap_s: float = 600.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._failures: dict[str, tuple[int, float]] = {}  # key -> (failures in a row, retry not before)

    def refused(self, key: str, now: float) -> float:
        """Record one more refusal; returns the seconds until the next try."""
        failures = self._failures.get(key, (0, 0.0))[0] + 1
        wait = min(self.cap_s, self.base_s * 2.0 ** (failures - 1))
        self._failures[key] = (failures, now + wait)
        return wait

    def ready(self, key: str, now: float) -> bool:
        entry = self._failures.get(key)
        return entry is None or now >= entry[1]

    def next_try_at(self) -> float | None:
        """When the earliest pending retry falls due, if any."""
        pending: list[float] = [at for _, at in self._failures.values()]
        return min(pending) if pending else None

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)

    def forget_except(self, keys: set[str]) -> None:
        self._failures = {k: v for k, v in self._failures.items() if k in keys}

    def failures(self, key: str) -> int:
        return self._failures.get(key, (0, 0.0))[0]
