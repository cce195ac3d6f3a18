"""A dynamic batcher: items from concurrent requests are gathered into one model call.

One inference thread owns the model. Request threads ``submit`` their items and wait on
futures. The thread takes the waiting items of the earliest deadline first (every request has
the same timeout, so that is arrival order), keeps collecting until ``max_batch`` items are
there or ``max_wait_ms`` has passed since the queue stopped being empty, then calls ``fn`` once.
The model code does not know any of this.

A request has one ``Deadline``, set when it arrives and shared by every stage it goes through.
A stage refuses a request whole, never half-queued: with 413 when it has more items than the
queue can ever hold, with a retryable 503 when the queue is full or when the wait it would have
(at the median recent batch time) runs past its deadline, so that a balancer or client sends it
elsewhere at once instead of after the timeout. Work between stages checks the deadline too
(``check_deadline``).

A worker's request work in memory (decoded images, model inputs, items waiting for a model
call) is bounded in bytes (``WorkBudget``): a request holds the bytes its work will take,
estimated before it is made (``hold_work``), until it is answered.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from common.errors import InternalError, Overloaded, PayloadTooLarge

log = logging.getLogger(__name__)

BatchFn = Callable[[Sequence[Any]], Sequence[Any]]

# Batches whose times the wait estimate looks at: their median, so that neither one fast batch
# (a few small items) nor one slow one sets it.
RECENT_BATCHES = 32


class Deadline:
    """When a request must be answered by, on the monotonic clock."""

    def __init__(self, seconds: float, start: float | None = None) -> None:
        self.seconds = seconds
        self.expires = (time.monotonic() if start is None else start) + seconds

    def remaining(self) -> float:
        return self.expires - time.monotonic()


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


@dataclass(order=True)
class _Entry:
    expires: float
    sequence: int
    item: Any = field(compare=False)
    future: Future = field(compare=False)


class DynamicBatcher:
    def __init__(
        self,
        fn: BatchFn,
        max_batch: int,
        max_wait_ms: float,
        max_queue: int,
        on_batch: Callable[[int, float], None] | None = None,
        name: str = "batcher",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batch < 1 or max_queue < max_batch:
            raise ValueError("need max_batch >= 1 and max_queue >= max_batch")
        self._fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self._on_batch = on_batch
        self.name = name
        self._clock = clock  # the batch window's and batch times' (a test's own, to move by hand)
        self._queue: list[_Entry] = []  # a heap: earliest deadline first
        self._sequence = itertools.count()
        self._window_start = 0.0
        self._batch_times: deque[float] = deque(maxlen=RECENT_BATCHES)
        self._batches = 0
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the batch in progress; waiting items fail with a retryable error."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=5)
        while self._queue:
            heapq.heappop(self._queue).future.set_exception(Overloaded("scorer is shutting down"))

    def estimated_wait(self, expires: float, count: int) -> float | None:
        """About how many seconds until ``count`` items due at ``expires`` are scored: the
        batches of the items due before them and their own, each taking the median recent
        batch time. Call under the lock."""
        if not self._batch_times:
            return None
        ahead = sum(1 for entry in self._queue if entry.expires <= expires)
        return math.ceil((ahead + count) / self.max_batch) * statistics.median(self._batch_times)

    def submit(self, items: Sequence[Any], deadline: Deadline) -> list[Future]:
        """Queue all ``items`` or none; one future per item, in order."""
        if len(items) > self.max_queue:
            raise PayloadTooLarge(
                f"{len(items)} items in one request; the batch queue holds {self.max_queue}, split the request"
            )
        futures = [Future() for _ in items]
        with self._cond:
            if self._stopped:
                raise Overloaded("scorer is shutting down")
            if len(self._queue) + len(items) > self.max_queue:
                raise Overloaded(
                    f"batch queue full ({len(self._queue)} of {self.max_queue} items waiting); retry later"
                )
            remaining = deadline.remaining()
            wait = self.estimated_wait(deadline.expires, len(items))
            if remaining <= 0 or (wait is not None and wait > remaining):
                raise Overloaded(
                    f"the wait at {self.name} (about {wait or 0:.0f}s, {len(self._queue)} items queued) runs past the "
                    f"request's deadline (in {max(0.0, remaining):.0f}s); retry on another node or later"
                )
            if not self._queue:
                self._window_start = self._clock()
            for item, future in zip(items, futures):
                heapq.heappush(self._queue, _Entry(deadline.expires, next(self._sequence), item, future))
            self._cond.notify()
        return futures

    def _take_batch(self) -> list[_Entry] | None:
        with self._cond:
            while not self._queue and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return None
            closes = self._window_start + self.max_wait_s
            while len(self._queue) < self.max_batch and not self._stopped:
                remaining = closes - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch = [heapq.heappop(self._queue) for _ in range(min(self.max_batch, len(self._queue)))]
            self._window_start = 0.0  # what is left has waited already: next batch at once
            return batch

    def _record(self, count: int, seconds: float) -> None:
        with self._cond:
            self._batches += 1
            # The first call pays lazy initialisation (the warm-up's): it is no measure of a batch.
            if self._batches > 1:
                self._batch_times.append(seconds)
        if self._on_batch is not None:
            self._on_batch(count, seconds)

    def _loop(self) -> None:
        while (taken := self._take_batch()) is not None:
            # Items whose request gave up (deadline passed, cancelled) are not scored.
            batch = [entry for entry in taken if entry.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            started = self._clock()
            try:
                results = self._fn([entry.item for entry in batch])
                if len(results) != len(batch):
                    raise InternalError(f"scorer returned {len(results)} results for {len(batch)} items")
            except Exception as exc:  # the error goes to every waiting request, the thread lives on
                log.exception("batch of %d failed", len(batch))
                for entry in batch:
                    entry.future.set_exception(exc)
                continue
            self._record(len(batch), self._clock() - started)
            for entry, result in zip(batch, results):
                entry.future.set_result(result)


class BatchedCall:
    """A model call shared by concurrent callers.

    ``call(items)`` from any request thread returns that caller's results, in order; underneath,
    one ``DynamicBatcher`` gathers the items of all callers into shared invocations of ``fn``.
    A caller works to its request's deadline (``request_deadline``; ``timeout_s`` from now
    outside a request): past it, a retryable 503 and its items are dropped.
    """

    def __init__(self, batcher: DynamicBatcher, timeout_s: float) -> None:
        self.batcher = batcher
        self.timeout_s = timeout_s
        self.batcher.start()

    def __call__(self, items: Sequence[Any]) -> list[Any]:
        if not items:
            return []
        deadline = current_deadline() or Deadline(self.timeout_s)
        futures = self.batcher.submit(items, deadline)
        try:
            return [future.result(timeout=max(0.0, deadline.remaining())) for future in futures]
        except FutureTimeout:
            for future in futures:
                future.cancel()
            raise Overloaded(
                f"no result within the request's {deadline.seconds:.0f}s; the model is saturated, retry later"
            ) from None


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
