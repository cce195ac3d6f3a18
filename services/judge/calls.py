"""The engine calls a worker's requests wait to send, taken in turn: between clients
(``common.limits.clients``), then between each client's requests, one call at a time. A client that
queues a thousand calls delays another's next call by one turn, not a thousand; a request whose
calls would wait past its deadline (at the median recent call time, as ``common.pipeline.batching``
estimates) is refused whole at once, and so is one that would overfill the queue."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from common.configuration.config import env_name
from common.limits.errors import Overloaded, PayloadTooLarge

# The calls whose times the wait estimate looks at: their median, so that neither one quick
# call nor one slow one sets it.
RECENT_CALLS = 64


@dataclass(eq=False)
class Call:
    """One chat completion's body, and the future its answer goes to."""

    body: dict[str, Any]
    expires: float
    future: Future = field(default_factory=Future)


@dataclass(eq=False)
class Queued:
    """One request's calls: ``futures`` in order, ``waiting`` those not yet taken."""

    client: str
    futures: list[Future]
    waiting: deque[Call]


class FairQueue:
    """The calls ``slots`` senders take, fairly between clients and requests (the module's
    docstring); at most ``max_queued`` waiting."""

    def __init__(self, slots: int, max_queued: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.slots = slots
        self.max_queued = max_queued
        self._clock = clock
        # Each client with calls waiting, in turn order, and its requests, in turn order.
        self._clients: OrderedDict[str, deque[Queued]] = OrderedDict()
        self._waiting = 0
        self._sending = 0
        self._times: deque[float] = deque(maxlen=RECENT_CALLS)
        self._closed = False
        self._cond = threading.Condition()

    def add(self, client: str, bodies: list[dict[str, Any]], expires: float) -> Queued:
        """Queue all of a request's calls or none: 413 when they could never fit, 503 when the
        queue is full or they would be answered past ``expires``."""
        if len(bodies) > self.max_queued:
            raise PayloadTooLarge(
                f"{len(bodies)} engine calls in one request; a worker queues {self.max_queued} "
                f"({env_name('', 'max_queue')}): split the request"
            )
        calls = deque(Call(body, expires) for body in bodies)
        queued = Queued(client, [call.future for call in calls], calls)
        with self._cond:
            if self._closed:
                raise Overloaded("the judge is shutting down")
            if self._waiting + len(bodies) > self.max_queued:
                raise Overloaded(
                    f"the judge's engine queue is full ({self._waiting} of {self.max_queued} calls waiting); "
                    "retry later"
                )
            remaining = expires - self._clock()
            wait = self.estimated_wait(client, len(bodies))
            if remaining <= 0 or (wait is not None and wait > remaining):
                raise Overloaded(
                    f"the wait for the judge's engine (about {wait or 0:.0f}s, {self._waiting} calls queued) runs past "
                    f"the request's deadline (in {max(0.0, remaining):.0f}s); retry on another node or later"
                )
            if bodies:
                self._clients.setdefault(client, deque()).append(queued)
                self._waiting += len(bodies)
                self._cond.notify(len(bodies))
        return queued

    def estimated_wait(self, client: str, count: int) -> float | None:
        """About how many seconds until ``count`` new calls of ``client`` are answered: the calls
        taken before its last one, turn by turn, ``slots`` at a time, each the median recent
        call time. Call under the lock."""
        if not self._times:
            return None
        own = sum(min(len(queued.waiting), count) for queued in self._clients.get(client, ())) + count
        others = sum(
            min(sum(len(queued.waiting) for queued in requests), own)
            for name, requests in self._clients.items()
            if name != client
        )
        return math.ceil((self._sending + others + own) / self.slots) * statistics.median(self._times)

    def take(self) -> Call | None:
        """The next call by turn (blocking until there is one); None once closed."""
        with self._cond:
            while not self._clients and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            client, requests = next(iter(self._clients.items()))
            queued = requests.popleft()
            call = queued.waiting.popleft()
            if queued.waiting:
                requests.append(queued)
            if requests:
                self._clients.move_to_end(client)
            else:
                del self._clients[client]
            self._waiting -= 1
            self._sending += 1
            return call

    def done(self, seconds: float | None) -> None:
        """A taken call ended; ``seconds`` its time when the engine answered it."""
        with self._cond:
            self._sending -= 1
            if seconds is not None:
                self._times.append(seconds)

    def withdraw(self, queued: Queued) -> None:
        """Drop a request's calls not yet taken (it failed, or its answer is in)."""
        with self._cond:
            if not queued.waiting:
                return
            self._waiting -= len(queued.waiting)
            queued.waiting.clear()
            requests = self._clients[queued.client]
            requests.remove(queued)
            if not requests:
                del self._clients[queued.client]

    def close(self) -> None:
        """Senders stop; calls waiting fail with a retryable error."""
        with self._cond:
            self._closed = True
            for requests in self._clients.values():
                for queued in requests:
                    for call in queued.waiting:
                        call.future.set_exception(Overloaded("the judge is shutting down"))
            self._clients.clear()
            self._cond.notify_all()
