"""Slots taken earliest deadline first: at most so many requests at a stage at once (a
worker's image decodes), the others waiting in deadline order and giving up at their deadline."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
from collections.abc import Iterator

from common.limits.deadlines import Deadline
from common.limits.errors import Overloaded


class OrderedSlots:
    """At most ``slots`` holders at once; waiters get in earliest deadline first (a plain
    semaphore lets a newcomer overtake threads that have waited longer), and give up at their
    deadline with a retryable 503."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiting: list[tuple[float, int, threading.Event]] = []
        self._sequence = itertools.count()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, deadline: Deadline) -> Iterator[None]:
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                turn = None
            else:
                turn = (deadline.expires, next(self._sequence), threading.Event())
                heapq.heappush(self._waiting, turn)
        if turn is not None and not turn[2].wait(max(0.0, deadline.remaining())):
            with self._lock:
                if not turn[2].is_set():  # still waiting: leave the line
                    self._waiting.remove(turn)
                    heapq.heapify(self._waiting)
                    raise Overloaded("the request's deadline passed while it waited to be decoded; retry later")
        try:
            yield
        finally:
            with self._lock:
                if self._waiting:
                    heapq.heappop(self._waiting)[2].set()  # the slot passes on directly
                else:
                    self._free += 1
