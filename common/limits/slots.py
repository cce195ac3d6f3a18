"""Slots taken earliest deadline first: at most so many requests at a stage at once (a
worker's image decodes), the others waiting in deadline order and giving up at their deadline."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from common.limits.deadlines import Deadline
from common.limits.line import DeadlineLine


class OrderedSlots:
    """At most ``slots`` holders at once; waiters get in earliest deadline first (a plain
    semaphore lets a newcomer overtake threads that have waited longer), and give up at their
    deadline with a retryable 503."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._room = threading.Condition()
        self._line = DeadlineLine(self._room)

    @contextlib.contextmanager
    def hold(self, deadline: Deadline) -> Iterator[None]:
        with self._room:
            self._line.wait(1, self._fits, deadline, _late)
            self._free -= 1
        try:
            yield
        finally:
            with self._room:
                self._free += 1
                self._room.notify_all()  # the slot for the next in line

    def _fits(self, slots: int) -> bool:
        return self._free >= slots


def _late() -> str:
    return "the request's deadline passed while it waited to be decoded; retry later"
