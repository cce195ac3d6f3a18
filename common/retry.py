"""The one retry policy of every client of a scorer: the Python clients (common/client.py), the
VeRL-Omni drop-in (common/verl_omni.py), the load bench (bench/load) and the judge's engine
client (services/judge/engine.py). Scoring is safe to repeat, so what VeRL-Omni's stock
``http_scorer_client`` retries is retried: a dropped connection, an attempt past its timeout,
408, 429 and any 5xx, ``retries`` times after ``backoff`` seconds, doubling (up to
``backoff_max``); every attempt sends the same body. Any other status is final.

Imports the standard library and aiohttp only (the drop-in runs in the trainer's environment);
the blocking twin of ``post_async`` is ``common.client.ScorerClient.post``, and
``call_before`` is the loop of a caller that must answer by a deadline.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

T = TypeVar("T")

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
    # The longest pause: the doubling stops there.
    backoff_max: float = math.inf

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff < 0 or self.backoff_max < 0 or self.attempt_timeout_s <= 0:
            raise ValueError(
                f"retries ({self.retries}), backoff ({self.backoff}) and its cap ({self.backoff_max}) must be "
                f"non-negative and the attempt timeout ({self.attempt_timeout_s}) positive"
            )

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def delay(self, attempt: int) -> float:
        """Seconds to wait after attempt ``attempt`` (from 0) failed."""
        return min(self.backoff * 2**attempt, self.backoff_max)

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


class Retryable(Exception):
    """An attempt that got no usable answer: its outcome (a status, or the name of the error it
    failed with), which the policy judges, and what went wrong, in words."""

    def __init__(self, outcome: str, problem: str) -> None:
        super().__init__(problem)
        self.outcome = outcome
        self.problem = problem


class GaveUp(Exception):
    """No attempt answered: ``reason`` is ``final`` (an outcome not retried, or the retries ran
    out) or ``deadline`` (no time left for another attempt, or for the pause before it)."""

    def __init__(self, reason: str, problem: str) -> None:
        super().__init__(problem)
        self.reason = reason
        self.problem = problem


def call_before(
    attempt: Callable[[float], T],
    policy: RetryPolicy,
    expires: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    observe: Callable[[str], None] | None = None,
) -> T:
    """``attempt(seconds_left)`` until it returns, by ``policy``, never past ``expires`` (on
    ``clock``): each ``Retryable`` it raises is retried after the policy's pause when the policy
    retries its outcome, retries are left and the pause ends before ``expires``; ``GaveUp``
    after. ``observe`` is told ``retried`` before each pause."""
    for number in range(policy.attempts):
        remaining = expires - clock()
        if remaining <= 0:
            raise GaveUp("deadline", "did not answer within the deadline")
        try:
            return attempt(remaining)
        except Retryable as failure:
            if not policy.retried(failure.outcome) or number == policy.retries:
                raise GaveUp("final", failure.problem) from None
            delay = policy.delay(number)
            if clock() + delay >= expires:
                raise GaveUp("deadline", f"{failure.problem}; no time left to retry") from None
        if observe is not None:
            observe("retried")
        sleep(delay)
    raise AssertionError("unreachable")
