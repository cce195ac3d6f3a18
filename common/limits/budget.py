"""A worker's request work in memory (decoded images, model inputs, items waiting for a model
call) is bounded in bytes (``WorkBudget``): a request holds the bytes its work will take,
estimated before it is made (``hold_work``), until it is answered."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar

from common.limits.deadlines import Deadline
from common.limits.errors import PayloadTooLarge
from common.limits.line import DeadlineLine, Turn

HOLDING, EMPTY_HANDED = 0, 1  # a request's rank in line: one holding bytes first


class WorkBudget:
    """The bytes of request work a worker holds in memory at once: each request holds what it
    declares (``hold_work``) from then until it is answered.

    A request that alone needs more than the whole budget is a 413 at once. One that would take
    the budget past its size while others hold it waits for room, as a full batch queue is
    waited for (``DeadlineLine``): earliest deadline first, until its deadline, then a retryable
    503 (a pickle body's 500), before it makes any of that work.

    Waiting never deadlocks. A request's bytes (decoded images, model inputs) are in memory
    until it ends, so a waiting request gives back nothing, and one that holds bytes and wants
    more (its model inputs after its images) can only be helped by a request that is not
    waiting: one that holds bytes and runs ends, one that holds nothing cannot help. So a
    request holding bytes goes before every request holding nothing (finishing it is what
    makes room), and once every request holding bytes waits for more and the first in line
    does not fit, no room can ever come: the one due last is refused at once (a retryable 503)
    and its bytes, given back as its request ends, let the others go on.
    """

    def __init__(self, max_bytes: int, setting: str) -> None:
        self.max_bytes = max_bytes
        self.setting = setting
        self.held = 0
        self._holders = 0  # requests holding bytes of it
        self._room = threading.Condition()
        self._line = DeadlineLine(self._room)

    @contextlib.contextmanager
    def request(self, deadline: Deadline) -> Iterator[None]:
        """The scope of one request, which waits for room until ``deadline``: what it holds is
        given back at the end."""
        holding = _Holding(self, deadline)
        token = _current_holding.set(holding)
        try:
            yield
        finally:
            _current_holding.reset(token)
            self.give_back(holding, holding.bytes)

    def take(self, holding: _Holding, nbytes: int, what: str) -> None:
        wanted = holding.bytes + nbytes
        if wanted > self.max_bytes:
            raise PayloadTooLarge(
                f"the request's work needs about {_megabytes(wanted)} in memory ({what}); the limit is "
                f"{_megabytes(self.max_bytes)} ({self.setting}), split the request"
            )
        if holding.trial:
            holding.bytes = wanted
            return
        with self._room:

            def late() -> str:
                return (
                    f"the request's deadline passed while it waited for {_megabytes(nbytes)} for its {what}: the "
                    f"worker holds {_megabytes(self.held)} of request work, of {_megabytes(self.max_bytes)} "
                    f"({self.setting}); retry later"
                )

            def stuck(turn: Turn) -> str | None:
                if not self._never_fits(turn):
                    return None
                return (
                    f"the requests holding the worker's {_megabytes(self.held)} of request work "
                    f"({self.setting}) all wait for more, this one's {what} included; it is the one due last "
                    "and gives its share back, retry later"
                )

            rank = HOLDING if holding.bytes else EMPTY_HANDED
            self._line.wait(nbytes, self._fits, holding.deadline, late, rank, stuck)
            if not holding.bytes:
                self._holders += 1
            self.held += nbytes
            holding.bytes = wanted

    def give_back(self, holding: _Holding, nbytes: int) -> None:
        """Return ``nbytes`` of what ``holding`` holds before its request ends."""
        if holding.trial or not nbytes:
            holding.bytes -= nbytes
            return
        with self._room:
            self.held -= nbytes
            holding.bytes -= nbytes
            if not holding.bytes:
                self._holders -= 1
            self._room.notify_all()  # room for those waiting

    def _fits(self, nbytes: int) -> bool:
        return self.held + nbytes <= self.max_bytes

    def _never_fits(self, turn: Turn) -> bool:
        """Whether ``turn`` (a request holding bytes, due last of those waiting) is in a line
        that can never move: every request holding bytes waits and the first does not fit."""
        holding = [waiting for waiting in self._line.turns if waiting.rank == HOLDING]
        return (
            turn.rank == HOLDING
            and len(holding) == self._holders
            and turn == max(holding)
            and not self._fits(self._line.turns[0].need)
        )


class _Holding:
    """What one request holds; a trial one (``trial_work``) holds nothing of the budget."""

    __slots__ = ("budget", "bytes", "deadline", "trial")

    def __init__(self, budget: WorkBudget, deadline: Deadline, trial: bool = False) -> None:
        self.budget = budget
        self.deadline = deadline
        self.bytes = 0
        self.trial = trial


_current_holding: ContextVar[_Holding | None] = ContextVar("scorer_request_work", default=None)


def hold_work(nbytes: int, what: str) -> None:
    """Hold ``nbytes`` of the worker's work budget for the request being served, before making
    the work (``what``: its name in the error); outside a request's scope, nothing."""
    holding = _current_holding.get()
    if holding is not None and nbytes > 0:
        holding.budget.take(holding, nbytes, what)


@contextlib.contextmanager
def tentative_work() -> Iterator[None]:
    """A check that may refuse: what ``hold_work`` held in the block is given back when it
    raises, so that a refusal the request survives (an optional reward's) holds nothing."""
    holding = _current_holding.get()
    before = holding.bytes if holding is not None else 0
    try:
        yield
    except BaseException:
        if holding is not None:
            holding.budget.give_back(holding, holding.bytes - before)
        raise


@contextlib.contextmanager
def trial_work() -> Iterator[None]:
    """Checks that only ask whether their work alone fits the budget: ``hold_work`` in the block
    takes nothing of it (nor counts what the request holds), and refuses only what needs more
    than the whole budget (413)."""
    holding = _current_holding.get()
    if holding is None:
        yield
        return
    token = _current_holding.set(_Holding(holding.budget, holding.deadline, trial=True))
    try:
        yield
    finally:
        _current_holding.reset(token)


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB"
