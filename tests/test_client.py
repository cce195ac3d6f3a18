"""The clients' retry policy: what is retried, what is final, and what a balancer answers."""

from __future__ import annotations

import asyncio
import pickle

import pytest
import requests

from common.client import AsyncScorerClient, RetryPolicy, ScorerClient, ScorerRequestError
from testing.server import free_port


def test_settle_retries_only_retryable_statuses_until_the_last_attempt() -> None:
    policy = RetryPolicy(retries=2, backoff=0.5)
    ours = "application/octet-stream"
    assert policy.settle(200, pickle.dumps({"scores": [1.0]}), ours, 0) == {"scores": [1.0]}
    assert policy.settle(503, pickle.dumps({"error": "busy"}), ours, 0) is None
    assert policy.settle(500, pickle.dumps({"error": "fault"}), ours, 1) is None
    with pytest.raises(ScorerRequestError, match="HTTP 503: busy"):
        policy.settle(503, pickle.dumps({"error": "busy"}), ours, 2)
    with pytest.raises(ScorerRequestError, match="HTTP 422"):
        policy.settle(422, b'{"error": "bad"}', "application/json", 0)
    assert [policy.delay(n) for n in range(3)] == [0.5, 1.0, 2.0]


def test_a_proxy_page_is_judged_by_its_status_not_unpickled() -> None:
    policy = RetryPolicy(retries=1)
    page = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    for status in (502, 503, 504):
        assert policy.settle(status, page, "text/html", 0) is None
    with pytest.raises(ScorerRequestError, match=r"HTTP 502: <html>.*Bad Gateway"):
        policy.settle(502, page, "text/html", 1)
    with pytest.raises(ScorerRequestError, match="HTTP 413"):
        policy.settle(413, page, "application/octet-stream", 0)  # a proxy's page in the wrong type


def test_connection_refused_is_retried_then_raised() -> None:
    client = ScorerClient(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01)
    with pytest.raises(requests.ConnectionError):
        client.scores([b"x"], ["p"])


def test_both_clients_retry_the_balancers_502_when_the_node_is_down(tmp_path) -> None:
    from tests.test_scaleout import nginx

    down = f"127.0.0.1:{free_port()}"  # nothing listens there: nginx answers its HTML 502
    with nginx([down], tmp_path / "lb") as balancer:
        with pytest.raises(ScorerRequestError) as sync_error:
            ScorerClient(balancer.url, retries=2, backoff=0.01).scores([b"x"], ["p"])
        assert sync_error.value.status == 502 and "Bad Gateway" in sync_error.value.message

        async def score() -> None:
            async with AsyncScorerClient(balancer.url, retries=2, backoff=0.01) as client:
                await client.score_each([b"x"], ["p"])

        with pytest.raises(ScorerRequestError) as async_error:
            asyncio.run(score())
        assert async_error.value.status == 502
        statuses = [status for status, _, _ in balancer.attempts()]
    assert statuses == [502] * 6, statuses  # three attempts each
