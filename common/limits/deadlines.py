"""A request's deadline: set when it arrives, on the monotonic clock, and shared by every stage
it goes through (``request_deadline``); work between stages checks it (``check_deadline``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from common.limits.errors import Overloaded


class Deadline:
    """When a request must be answered by, on the monotonic clock (``clock``: a test's own, to
    move by hand)."""

    def __init__(self, seconds: float, start: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self.expires = (clock() if start is None else start) + seconds

    def remaining(self) -> float:
        return self.expires - self._clock()


# The deadline of the request this thread is serving (``request_deadline``).
_current_deadline: ContextVar[Deadline | None] = ContextVar("scorer_request_deadline", default=None)


@contextlib.contextmanager
def request_deadline(deadline: Deadline) -> Iterator[Deadline]:
    """Make ``deadline`` the one every batched stage called from this thread works to."""
    token = _current_deadline.set(deadline)
    try:
        yield deadline
    finally:
        _current_deadline.reset(token)


def current_deadline() -> Deadline | None:
    return _current_deadline.get()


def check_deadline(stage: str) -> None:
    """A retryable 503 when the request being served is past its deadline: work that does not
    look at the clock (an image decode, a rule) is not interrupted, so it is checked between."""
    deadline = current_deadline()
    if deadline is not None and deadline.remaining() <= 0:
        raise Overloaded(f"the request's {deadline.seconds:.0f}s deadline passed before {stage}; retry later")
