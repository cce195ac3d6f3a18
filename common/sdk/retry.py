"""The one retry policy of every client of a scorer: the Python clients (common/sdk/client.py), the
VeRL-Omni drop-in (common/sdk/verl_omni.py), the load bench (bench/load) and the judge's engine
client (services/judge/engine.py). Scoring is safe to repeat, so what VeRL-Omni's stock
``http_scorer_client`` retries is retried: a dropped connection, an attempt past its timeout,
408, 429 and any 5xx, ``retries`` times after ``backoff`` seconds, doubling (up to
``backoff_max``); every attempt sends the same body. Any other status is final.

``Attempts`` is the policy applied to one call: each attempt gets the policy's time, cut to what
is left before the call's deadline, and no pause ends past it, so a whole call is bounded by
its deadline, however slowly a server sends (an attempt's time bounds it whole: aiohttp's
``total``, or the judge's exchange, never a per-read timeout). Its two loops are ``post_async``
(the clients; the blocking client runs it too) and ``call_before`` (a caller that must answer
by a deadline). Neither urllib3's ``Retry`` nor tenacity fits: ``Retry`` drives only urllib3's
own blocking requests, pauses 0 s before the first retry (VeRL-Omni's client, 0.5 s) and knows no
deadline for a call; tenacity would be a new dependency of the drop-in's environment.

Imports the standard library and aiohttp only (the drop-in runs in the trainer's environment).
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


class Attempts:
    """``policy`` applied to one call that must end by ``expires`` (on ``clock``; none by default)."""

    def __init__(self, policy: RetryPolicy, expires: float = math.inf, clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self.expires = expires
        self.clock = clock
        self.failed = 0

    def time_for_next(self) -> float:
        """Seconds the next attempt may take, whole: the policy's, cut to what is left of the
        call; ``GaveUp("deadline")`` when nothing is left."""
        remaining = self.expires - self.clock()
        if remaining <= 0:
            raise GaveUp("deadline", "did not answer within the deadline")
        return min(self.policy.attempt_timeout_s, remaining)

    def pause_after(self, outcome: str, problem: str) -> float:
        """Seconds to pause after an attempt failed with ``outcome``; ``GaveUp`` when the policy
        does not retry it, the retries ran out or the pause would end past the deadline."""
        if not self.policy.retried(outcome) or self.failed == self.policy.retries:
            raise GaveUp("final", problem)
        delay = self.policy.delay(self.failed)
        if self.clock() + delay >= self.expires:
            raise GaveUp("deadline", f"{problem}; no time left to retry")
        self.failed += 1
        return delay


async def post_async(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    policy: RetryPolicy,
    headers: dict[str, str] | None = None,
    observe: Callable[[str], None] | None = None,
    expires: float = math.inf,
) -> Answer:
    """POST ``body`` until an attempt is final by ``policy``, by ``expires`` (``time.monotonic``);
    the last attempt's answer. The last attempt's error is raised when it got none
    (``asyncio.TimeoutError`` when the deadline passed first). ``observe`` is told each
    attempt's outcome."""
    attempts = Attempts(policy, expires)
    while True:
        try:
            timeout = aiohttp.ClientTimeout(total=attempts.time_for_next())
        except GaveUp as exc:
            raise asyncio.TimeoutError(exc.problem) from None
        answer, error = None, None
        try:
            async with session.post(url, data=body, headers=headers, timeout=timeout) as response:
                answer = Answer(
                    response.status,
                    await response.read(),
                    response.headers.get("Content-Type", ""),
                    attempts.failed + 1,
                )
            outcome = str(answer.status)
        except ASYNC_TRANSIENT as exc:
            error, outcome = exc, type(exc).__name__
        if observe is not None:
            observe(outcome)
        try:
            delay = attempts.pause_after(outcome, outcome)
        except GaveUp:
            if answer is None:
                raise error from None
            return answer
        await asyncio.sleep(delay)


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
    attempts = Attempts(policy, expires, clock)
    while True:
        try:
            return attempt(attempts.time_for_next())
        except Retryable as failure:
            outcome, problem = failure.outcome, failure.problem
        delay = attempts.pause_after(outcome, problem)
        if observe is not None:
            observe("retried")
        sleep(delay)
