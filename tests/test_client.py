"""The clients' retry policy: what is retried, what is final."""

from __future__ import annotations

import pytest
import requests

from common.client import RetryPolicy, ScorerClient, ScorerRequestError
from tests.server import free_port


def test_settle_retries_only_retryable_statuses_until_the_last_attempt() -> None:
    policy = RetryPolicy(retries=2, backoff=0.5)
    assert policy.settle(200, {"scores": [1.0]}, 0) == {"scores": [1.0]}
    assert policy.settle(503, {"error": "busy"}, 0) is None
    assert policy.settle(500, {"error": "fault"}, 1) is None
    with pytest.raises(ScorerRequestError, match="HTTP 503: busy"):
        policy.settle(503, {"error": "busy"}, 2)
    with pytest.raises(ScorerRequestError, match="HTTP 422"):
        policy.settle(422, {"error": "bad"}, 0)
    assert [policy.delay(n) for n in range(3)] == [0.5, 1.0, 2.0]


def test_connection_refused_is_retried_then_raised() -> None:
    client = ScorerClient(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01)
    with pytest.raises(requests.ConnectionError):
        client.scores([b"x"], ["p"])
