"""A worker gives a burst's memory back once it is idle. A request's work (decoded images, model
inputs, OCR's detector maps) is freed when it ends, but not always returned: exceptions kept
for an answer hold their frames in reference cycles until the cyclic collector runs, and glibc's
malloc keeps freed arenas for the next allocation. After a burst a worker stayed gigabytes above
its baseline, idle. When the last request in flight ends and none has started for ``quiet_s``,
the worker collects the cycles and trims malloc's free memory back to the system (glibc's
``malloc_trim``; elsewhere the collection alone).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class Reclaimer:
    """Counts the requests in flight; a daemon thread reclaims memory once they are none for
    ``quiet_s`` seconds on ``clock`` (``reclaim``: the collection and trim, by default)."""

    def __init__(
        self,
        quiet_s: float = 0.5,
        reclaim: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quiet_s = quiet_s
        self._reclaim = reclaim or reclaim_memory
        self._clock = clock  # a test's own, to move by hand
        self._active = 0
        self._ended = 0  # requests ended, so that the thread sees one that came and went
        self._reclaimed = 0  # of those, how many had ended when memory was last reclaimed
        self._last_end = 0.0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        with self._cond:
            self._active += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="reclaim-memory", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._ended += 1
                self._last_end = self._clock()
                self._cond.notify_all()

    def due_in(self) -> float | None:
        """Seconds until memory is due to be reclaimed (0: now); None while a request is in
        flight or none has ended since the last reclaim, when only a request's end changes it."""
        with self._cond:
            if self._active or self._ended == self._reclaimed:
                return None
            return max(0.0, self._last_end + self.quiet_s - self._clock())

    def _loop(self) -> None:
        while True:
            with self._cond:
                while (wait_s := self.due_in()) != 0:
                    self._cond.wait(wait_s)
                self._reclaimed = self._ended
            try:
                self._reclaim()
            except Exception:  # never the worker's end: the memory stays as it was
                log.exception("reclaiming memory failed")


_TRIM = _malloc_trim()


def reclaim_memory() -> None:
    """Collect reference cycles, then return malloc's free memory to the system."""
    gc.collect()
    if _TRIM is not None:
        _TRIM()
