"""Backoff with full jitter, Retry-After, error bodies that are not JSON, and refused-object backoff."""

from __future__ import annotations

import random

import pytest

from specdec_operator.kube.retry import Backoff, DownstreamBackoff, parse_error_body, retry_after_seconds


def test_delays_grow_exponentially_within_full_jitter_and_the_cap() -> None:
    backoff = Backoff(base_s=0.5, cap_s=4.0)
    rng = random.Random(7)
    for attempt, ceiling in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        delays = [backoff.delay(attempt, None, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) > 0.8 * ceiling  # the whole range is used: jitter, not a fixed delay
        assert len({round(d, 6) for d in delays}) > 150


def test_retry_after_is_a_floor_but_never_beyond_the_cap() -> None:
    backoff = Backoff(base_s=0.1, cap_s=10.0)
    rng = random.Random(1)
    assert all(backoff.delay(0, 3.0, rng) == 3.0 for _ in range(50))  # jitter below 0.1 s: the server wins
    assert backoff.delay(0, 60.0, rng) == 10.0


@pytest.mark.parametrize(("headers", "now", "expected"), [
    ({"Retry-After": "3"}, None, 3.0),
    ({"retry-after": " 1.5 "}, None, 1.5),
    ({"Retry-After": "-4"}, None, 0.0),
    ({"Retry-After": "Mon, 30 Nov 2026 12:00:07 GMT"}, 1796040000.0, 7.0),
    ({"Retry-After": "soon"}, 1796040000.0, None),
    ({}, None, None),
])
def test_retry_after_as_seconds_or_http_date(
    headers: dict[str, str], now: float | None, expected: float | None
) -> None:
    assert retry_after_seconds(headers, now) == expected


@pytest.mark.parametrize(("body", "reason", "message"), [
    (b'{"kind":"Status","reason":"Invalid","message":"spec.replicas: Invalid value"}', "Invalid",
     "spec.replicas: Invalid value"),
    (b"<html><body>502 Bad Gateway</body></html>", "", "<html><body>502 Bad Gateway</body></html>"),
    (b'{"kind":"Status",', "", '{"kind":"Status",'),
    (b"", "", "HTTP 503 with an empty body"),
    (b"\xff\xfe not utf-8", "", "\ufffd\ufffd not utf-8"),
    (b'["a list"]', "", '["a list"]'),
])
def test_error_bodies_never_raise_and_keep_the_servers_words(body: bytes, reason: str, message: str) -> None:
    assert parse_error_body(503, body) == (reason, message)


def test_refused_objects_back_off_exponentially_until_the_cap() -> None:
    backoff = DownstreamBackoff(base_s=10.0, cap_s=60.0)
    waits = [backoff.refused("Deployment/a@1", now=0.0) for _ in range(5)]
    assert waits == [10.0, 20.0, 40.0, 60.0, 60.0]
    assert not backoff.ready("Deployment/a@1", now=59.0) and backoff.ready("Deployment/a@1", now=60.0)
    assert backoff.ready("Deployment/a@2", now=0.0)  # a changed body is tried at once
    assert backoff.next_try_at() == 60.0
    backoff.succeeded("Deployment/a@1")
    assert backoff.next_try_at() is None and backoff.failures("Deployment/a@1") == 0
