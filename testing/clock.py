"""A clock the test moves by hand, for code that takes one (``DynamicBatcher(clock=...)``): a
unit test states what happens at a moment instead of sleeping until it and hoping."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ManualClock:
    """Monotonic seconds that change only by ``advance``; counts its readings, so that a test
    can wait until the code under test has looked at the clock again (and acted on it)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.readings = 0
        self._changed = threading.Condition()

    def __call__(self) -> float:
        with self._changed:
            self.readings += 1
            self._changed.notify_all()
            return self.now

    def advance(self, seconds: float) -> None:
        with self._changed:
            self.now += seconds

    def read_again(self, times: int = 2) -> None:
        """Until the clock has been read ``times`` more times: a thread polling it has seen its
        present value (the first reading may have begun before the last ``advance``)."""
        with self._changed:
            target = self.readings + times
            # A guard against a hang, never a measure: the readings come within milliseconds.
            assert self._changed.wait_for(lambda: self.readings >= target, timeout=60), "the clock was not read"


def wait_until(condition: Callable[[], bool], what: str, guard_s: float = 60.0, pause_s: float = 0.001) -> None:
    """Polls ``condition`` every ``pause_s`` until it holds: how a test waits for another thread
    or process to reach a state it cannot signal. ``guard_s`` stops a hang; it is never a measure."""
    end = time.monotonic() + guard_s
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(pause_s)
