"""A worker's request work in memory (decoded images, model inputs, items waiting for a model
call) is bounded in bytes (``WorkBudget``): a request holds the bytes its work will take,
estimated before it is made (``hold_work``), until it is answered."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar

from common.limits.errors import Overloaded, PayloadTooLarge


class WorkBudget:
    """The bytes of request work a worker holds in memory at once: each request holds what it
    declares (``hold_work``) from then until it is answered.

    A request that alone needs more than the whole budget is a 413; one that would take the
    budget past its size while others hold it, a retryable 503 at once (the early refusal of a
    full queue), before it makes any of that work.
    """

    def __init__(self, max_bytes: int, setting: str) -> None:
        self.max_bytes = max_bytes
        self.setting = setting
        self.held = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """The scope of one request: what it holds is given back at the end."""
        holding = _Holding(self)
        token = _current_holding.set(holding)
        try:
            yield
        finally:
            _current_holding.reset(token)
            with self._lock:
                self.held -= holding.bytes

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
        with self._lock:
            if self.held + nbytes > self.max_bytes:
                raise Overloaded(
                    f"the worker holds {_megabytes(self.held)} of request work; this request's {what} need "
                    f"{_megabytes(nbytes)} more, over {_megabytes(self.max_bytes)} ({self.setting}); retry later"
                )
            self.held += nbytes
        holding.bytes = wanted

    def give_back(self, holding: _Holding, nbytes: int) -> None:
        """Return ``nbytes`` of what ``holding`` holds before its request ends."""
        if not holding.trial:
            with self._lock:
                self.held -= nbytes
        holding.bytes -= nbytes


class _Holding:
    """What one request holds; a trial one (``trial_work``) holds nothing of the budget."""

    __slots__ = ("budget", "bytes", "trial")

    def __init__(self, budget: WorkBudget, trial: bool = False) -> None:
        self.budget = budget
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
    token = _current_holding.set(_Holding(holding.budget, trial=True))
    try:
        yield
    finally:
        _current_holding.reset(token)


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB"
