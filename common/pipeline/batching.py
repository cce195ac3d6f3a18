"""A dynamic batcher: items from concurrent requests are gathered into one model call.

One inference thread owns the model. Request threads ``submit`` their items and wait on
futures. The thread takes the waiting items of the earliest deadline first (every request has
the same timeout, so that is arrival order), keeps collecting until ``max_batch`` items are
there or ``max_wait_ms`` has passed since the queue stopped being empty, then calls ``fn`` once.
The model code does not know any of this.

A request has one ``Deadline`` (``common.limits.deadlines``), set when it arrives and shared by
every stage it goes through. A stage queues a request whole, never half: with 413 when it has
more items than the queue can ever hold; when the queue is full, the request waits for room in
deadline order (``common.limits.line``), and a request gets a retryable 503 only once its
deadline has passed, never early from an estimate of its wait: the trainers' clients time out
after 120 s and do not survive an early 503 (flow_grpo's reads the body as scores; VeRL-Omni's
retries twice within 1.5 s, and lost 87 of 128 one-image requests to early 503s on a busy node
that served the rest within 105 s), while a request held to its deadline is either served or
retried by them with a fresh one. Work between stages checks the deadline too
(``check_deadline``). The bytes of request work a worker holds are bounded apart from the
queue, and waited for the same way (``common.limits.budget``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from common.limits.deadlines import Deadline, current_deadline
from common.limits.errors import InternalError, Overloaded, PayloadTooLarge
from common.limits.line import DeadlineLine

log = logging.getLogger(__name__)

BatchFn = Callable[[Sequence[Any]], Sequence[Any]]


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
        self._cond = threading.Condition()
        self._line = DeadlineLine(self._cond)  # requests waiting for room in the queue
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, items: Sequence[Any], deadline: Deadline) -> list[Future]:
        """Queue all ``items`` or none, waiting for room in deadline order; one future per item,
        in order."""
        if len(items) > self.max_queue:
            raise PayloadTooLarge(
                f"{len(items)} items in one request; the batch queue holds {self.max_queue}, split the request"
            )
        futures = [Future() for _ in items]
        with self._cond:
            if deadline.remaining() <= 0:
                raise Overloaded(f"the request's deadline passed before {self.name}; retry later")
            self._line.wait(len(items), self._fits, deadline, self._late)
            if not self._queue:
                self._window_start = self._clock()
            for item, future in zip(items, futures):
                heapq.heappush(self._queue, _Entry(deadline.expires, next(self._sequence), item, future))
            self._cond.notify_all()
        return futures

    def _fits(self, count: int) -> bool:
        return len(self._queue) + count <= self.max_queue

    def _late(self) -> str:
        return (
            f"the request's deadline passed while it waited for room in the batch queue at {self.name} "
            f"({len(self._queue)} of {self.max_queue} items waiting); retry later"
        )

    def withdraw(self, futures: Sequence[Future]) -> None:
        """Take the items of ``futures`` (a request that gave up) out of the queue now: the
        request's inputs are not held until the thread would have reached them."""
        gone = set(map(id, futures))
        with self._cond:
            kept = [entry for entry in self._queue if id(entry.future) not in gone]
            if len(kept) < len(self._queue):
                self._queue = kept
                heapq.heapify(self._queue)
                if self._line:
                    self._cond.notify_all()  # room for those waiting

    def _take_batch(self) -> list[_Entry]:
        with self._cond:
            while not self._queue:
                self._cond.wait()
            closes = self._window_start + self.max_wait_s
            while len(self._queue) < self.max_batch:
                remaining = closes - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch = [heapq.heappop(self._queue) for _ in range(min(self.max_batch, len(self._queue)))]
            self._window_start = 0.0  # what is left has waited already: next batch at once
            if self._line:
                self._cond.notify_all()  # room for those waiting
            return batch

    def _loop(self) -> None:
        while True:
            # Items whose request gave up (deadline passed, cancelled) are not scored.
            batch = [entry for entry in self._take_batch() if entry.future.set_running_or_notify_cancel()]
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
            if self._on_batch is not None:
                self._on_batch(len(batch), self._clock() - started)
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
            self.batcher.withdraw(futures)
            raise Overloaded(
                f"no result within the request's {deadline.seconds:.0f}s; the model is saturated, retry later"
            ) from None
