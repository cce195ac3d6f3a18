"""A dynamic batcher: items from concurrent requests are gathered into one model call.

One inference thread owns the model. Request threads ``submit`` their items and wait on
futures. The thread takes the first waiting item, keeps collecting until ``max_batch`` items
are there or ``max_wait_ms`` has passed since that first item, then calls ``fn`` once. The
queue is bounded: a request whose items do not fit is refused whole (``Overloaded``, 503),
never half-queued. The model code does not know any of this.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from common.errors import InternalError, Overloaded

log = logging.getLogger(__name__)

BatchFn = Callable[[Sequence[Any]], Sequence[Any]]


class DynamicBatcher:
    def __init__(
        self,
        fn: BatchFn,
        max_batch: int,
        max_wait_ms: float,
        max_queue: int,
        on_batch: Callable[[int, float], None] | None = None,
        name: str = "batcher",
    ) -> None:
        if max_batch < 1 or max_queue < max_batch:
            raise ValueError("need max_batch >= 1 and max_queue >= max_batch")
        self._fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self._on_batch = on_batch
        self._queue: deque[tuple[Any, Future, float]] = deque()
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
            _, future, _ = self._queue.popleft()
            future.set_exception(Overloaded("scorer is shutting down"))

    def submit(self, items: Sequence[Any]) -> list[Future]:
        """Queue all ``items`` or none; one future per item, in order."""
        futures = [Future() for _ in items]
        now = time.monotonic()
        with self._cond:
            if self._stopped:
                raise Overloaded("scorer is shutting down")
            if len(self._queue) + len(items) > self.max_queue:
                raise Overloaded(
                    f"batch queue full ({len(self._queue)} of {self.max_queue} items waiting); retry later"
                )
            self._queue.extend((item, future, now) for item, future in zip(items, futures))
            self._cond.notify()
        return futures

    def _take_batch(self) -> list[tuple[Any, Future, float]] | None:
        with self._cond:
            while not self._queue and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return None
            deadline = self._queue[0][2] + self.max_wait_s
            while len(self._queue) < self.max_batch and not self._stopped:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            count = min(self.max_batch, len(self._queue))
            return [self._queue.popleft() for _ in range(count)]

    def _loop(self) -> None:
        while (taken := self._take_batch()) is not None:
            # Items whose request gave up (timed out, cancelled) are not scored.
            batch = [entry for entry in taken if entry[1].set_running_or_notify_cancel()]
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = self._fn([item for item, _, _ in batch])
                if len(results) != len(batch):
                    raise InternalError(f"scorer returned {len(results)} results for {len(batch)} items")
            except Exception as exc:  # the error goes to every waiting request, the thread lives on
                log.exception("batch of %d failed", len(batch))
                for _, future, _ in batch:
                    future.set_exception(exc)
                continue
            for (_, future, _), result in zip(batch, results):
                future.set_result(result)
            if self._on_batch is not None:
                self._on_batch(len(batch), time.perf_counter() - started)


class BatchedCall:
    """A model call shared by concurrent callers.

    ``call(items)`` from any request thread returns that caller's results, in order; underneath,
    one ``DynamicBatcher`` gathers the items of all callers into shared invocations of ``fn``.
    A caller waits at most ``timeout_s``, then gets a retryable 503 and its items are dropped.
    """

    def __init__(self, batcher: DynamicBatcher, timeout_s: float) -> None:
        self.batcher = batcher
        self.timeout_s = timeout_s
        self.batcher.start()

    def __call__(self, items: Sequence[Any]) -> list[Any]:
        if not items:
            return []
        deadline = time.monotonic() + self.timeout_s
        futures = self.batcher.submit(items)
        try:
            return [future.result(timeout=max(0.0, deadline - time.monotonic())) for future in futures]
        except FutureTimeout:
            for future in futures:
                future.cancel()
            raise Overloaded(f"no result within {self.timeout_s:.0f}s; the model is saturated, retry later") from None
