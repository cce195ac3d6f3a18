"""The one retry policy of every client of a scorer: the Python clients (common/client.py), the
VeRL-Omni drop-in (common/verl_omni.py) and the load bench (bench/load). Scoring is safe to
repeat, so what VeRL-Omni's stock ``http_scorer_client`` retries is retried: a dropped
connection, an attempt past its timeout, 408, 429 and any 5xx, ``retries`` times after
``backoff`` seconds, doubling; every attempt sends the same body. Any other status is final.

Imports the standard library and aiohttp only (the drop-in runs in the trainer's environment);
the blocking twin of ``post_async`` is ``common.client.ScorerClient.post``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

# What an attempt may fail with, short of an answer: it is retried as a retryable status is.
ASYNC_TRANSIENT = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


class ScorerRequestError(RuntimeError):
    """The server answered an error that retrying will not fix (or retries ran out)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Answer:
    """The last attempt's answer: its status, body and ``Content-Type``, and how many attempts it took."""

    status: int
    body: bytes
    content_type: str
    attempts: int


@dataclass(frozen=True)
class RetryPolicy:
    """What is retried, how often, after how long, and how long one attempt may take."""

    retries: int = 2
    backoff: float = 0.5
    attempt_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff < 0 or self.attempt_timeout_s <= 0:
            raise ValueError(
                f"retries ({self.retries}) and backoff ({self.backoff}) must be non-negative and the attempt "
                f"timeout ({self.attempt_timeout_s}) positive"
            )

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def delay(self, attempt: int) -> float:
        """Seconds to wait after attempt ``attempt`` (from 0) failed."""
        return self.backoff * 2**attempt

    @staticmethod
    def retryable(status: int) -> bool:
        """The status decides, before the body is looked at: a balancer in front of a node that
        is down answers 502/503/504 with its own HTML page, which is retried like ours."""
        return status in (408, 429) or 500 <= status < 600

    def retried(self, outcome: str) -> bool:
        """Whether an attempt's outcome (a status, or the name of the error it failed with) is retried."""
        return not outcome.isdigit() or self.retryable(int(outcome))


async def post_async(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    policy: RetryPolicy,
    headers: dict[str, str] | None = None,
    observe: Callable[[str], None] | None = None,
) -> Answer:
    """POST ``body`` until an attempt is final by ``policy``; the last attempt's answer. The last
    attempt's error is raised when it got none. ``observe`` is told each attempt's outcome."""
    timeout = aiohttp.ClientTimeout(total=policy.attempt_timeout_s)
    for attempt in range(policy.attempts):
        try:
            async with session.post(url, data=body, headers=headers, timeout=timeout) as response:
                answer = Answer(
                    response.status, await response.read(), response.headers.get("Content-Type", ""), attempt + 1
                )
        except ASYNC_TRANSIENT as exc:
            if observe is not None:
                observe(type(exc).__name__)
            if attempt == policy.retries:
                raise
        else:
            if observe is not None:
                observe(str(answer.status))
            if not policy.retryable(answer.status) or attempt == policy.retries:
                return answer
        await asyncio.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")
