"""Authenticated /metrics: the verdicts from TokenReview and SubjectAccessReview answers, and their cache."""

from __future__ import annotations

import asyncio
from typing import Any

from specdec_operator.handlers.services.metrics_server import ACCESS_REVIEWS, TOKEN_REVIEWS, MetricsAuthorizer


class FakeReviews:
    """The API server's answers: tokens -> user, users allowed to get /metrics."""

    def __init__(self, tokens: dict[str, str], readers: set[str]) -> None:
        self.tokens, self.readers, self.calls = tokens, readers, []

    async def __call__(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((path, body))
        if path == TOKEN_REVIEWS:
            user = self.tokens.get(body["spec"]["token"])
            return {"status": {"authenticated": True, "user": {"username": user, "groups": ["g"]}}
                    if user else {"authenticated": False, "error": "invalid bearer token"}}
        assert path == ACCESS_REVIEWS
        assert body["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        return {"status": {"allowed": body["spec"]["user"] in self.readers}}


def verdict(authorizer: MetricsAuthorizer, header: str | None) -> tuple[int, str]:
    result = asyncio.run(authorizer.verdict(header))
    return result.status, result.reason


def test_verdicts() -> None:
    reviews = FakeReviews({"t-reader": "prometheus", "t-other": "someone"}, {"prometheus"})
    authorizer = MetricsAuthorizer(reviews)
    assert verdict(authorizer, None)[0] == 401
    assert verdict(authorizer, "Basic abc")[0] == 401
    assert verdict(authorizer, "Bearer nope") == (401, "token not authenticated: invalid bearer token")
    assert verdict(authorizer, "Bearer t-other")[0] == 403
    assert verdict(authorizer, "Bearer t-reader") == (200, "")


def test_a_token_is_reviewed_once_per_ttl() -> None:
    now = [0.0]
    reviews = FakeReviews({"t": "prometheus"}, {"prometheus"})
    authorizer = MetricsAuthorizer(reviews, clock=lambda: now[0])
    for _ in range(5):
        assert verdict(authorizer, "Bearer t")[0] == 200
    assert len(reviews.calls) == 2  # one TokenReview, one SubjectAccessReview
    now[0] = 61.0
    reviews.readers.clear()  # the binding was removed: seen once the cached verdict expires
    assert verdict(authorizer, "Bearer t")[0] == 403
