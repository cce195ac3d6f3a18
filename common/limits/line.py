"""Requests waiting for room, earliest deadline first, until their deadline: the one way a
worker's limits hold a request back (room in the batch queue, a decoding slot, work bytes).

The trainers' clients time out after 120 s and do not survive an early 503 (flow_grpo's reads a
503's body as scores; VeRL-Omni's retries twice within 1.5 s), so a limit reached is waited out
within the request's deadline; only past it is the request refused (a retryable 503, a pickle
body's 500)."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import NamedTuple

from common.limits.deadlines import Deadline
from common.limits.errors import Overloaded


class Turn(NamedTuple):
    """A request's place in line: lower ``rank`` first, then the earlier deadline, then arrival."""

    rank: int
    expires: float
    sequence: int
    need: int  # what it waits for room for (items, slots, bytes)


class DeadlineLine:
    """The requests waiting under one condition for room, in ``Turn`` order: a newcomer never
    overtakes a request due earlier (a plain condition wakes whichever thread the scheduler
    picks)."""

    def __init__(self, room: threading.Condition) -> None:
        self._room = room  # notified by whoever makes room
        self._turns: list[Turn] = []  # a heap
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._turns)

    @property
    def turns(self) -> list[Turn]:
        """The requests in line, first in a heap's order (``turns[0]`` is next)."""
        return self._turns

    def wait(
        self,
        need: int,
        fits: Callable[[int], bool],
        deadline: Deadline,
        late: Callable[[], str],
        rank: int = 0,
        give_up: Callable[[Turn], str | None] | None = None,
    ) -> None:
        """Under the room's lock: return once ``fits(need)`` and nobody is in line before this
        request; ``Overloaded(late())`` once its deadline has passed, ``Overloaded(reason)``
        once ``give_up`` gives a reason (room that can never come)."""
        if not self._turns and fits(need):
            return
        turn = Turn(rank, deadline.expires, next(self._sequence), need)
        heapq.heappush(self._turns, turn)
        if give_up is not None:
            self._room.notify_all()  # those in line may now see that room can never come
        try:
            while self._turns[0] is not turn or not fits(need):
                reason = give_up(turn) if give_up is not None else None
                if reason is None and deadline.remaining() <= 0:
                    reason = late()
                if reason is not None:
                    raise Overloaded(reason)
                self._room.wait(deadline.remaining())
        finally:
            self._turns.remove(turn)
            heapq.heapify(self._turns)
            self._room.notify_all()  # the next in line may fit now, or see that it never will
