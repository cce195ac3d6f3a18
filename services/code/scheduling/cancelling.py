"""A request's work stopped once its client hung up: no answer can reach it, so its samples
neither wait for a slot nor keep one (``Grader.grade``).

Each running sample is known by its init's pidfd (``Sandbox.run``): killing the init, pid 1 of
the sample's PID namespace, makes the kernel kill the rest of it, and a pidfd never names a
later process that reused the number.
"""

from __future__ import annotations

import contextlib
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator

# How often a request's client is looked at while its samples are graded.
HANG_UP_POLL_S = 0.5
# How long a killed init is waited for to be gone (with every process of its namespace).
KILL_WAIT_S = 5.0


class Cancelled(Exception):
    """A sample's request was cancelled (its client hung up): it gets no verdict, and is not re-run."""


def kill_and_wait(pidfd: int) -> None:
    """Kill the process of ``pidfd`` and wait (at most ``KILL_WAIT_S``) until it has exited."""
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    gone = select.poll()
    gone.register(pidfd, select.POLLIN)  # readable once it has exited
    gone.poll(KILL_WAIT_S * 1000)


class Cancellation:
    """One request's running samples, each by its init's pidfd: ``cancel`` kills them all, and
    any that starts afterwards, at once. Their owners wait for them and close the pidfds, each
    after ``unwatch`` (a pidfd is never signalled once its number may name another file)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inits: set[int] = set()
        self.cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            for pidfd in self._inits:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    def watch(self, pidfd: int) -> None:
        """Kill the init of ``pidfd`` when the request is cancelled (now, if it was)."""
        with self._lock:
            self._inits.add(pidfd)
            if self.cancelled:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    def unwatch(self, pidfd: int) -> None:
        with self._lock:
            self._inits.discard(pidfd)


class HangUps:
    """Cancels a request once its client hung up: one thread, while any request is watched,
    asks each one's ``gone()`` every ``poll_s`` (under the lock, so never after the request
    stopped being watched and its connection may be closed)."""

    def __init__(self, poll_s: float = HANG_UP_POLL_S) -> None:
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._watched: dict[Cancellation, Callable[[], bool]] = {}
        self._polling = False

    @contextlib.contextmanager
    def watching(self, gone: Callable[[], bool]) -> Iterator[Cancellation]:
        """A cancellation of the request, made once ``gone()`` holds, while in this block."""
        cancellation = Cancellation()
        with self._lock:
            self._watched[cancellation] = gone
            if not self._polling:
                self._polling = True
                threading.Thread(target=self._poll, name="code-hang-ups", daemon=True).start()
        try:
            yield cancellation
        finally:
            with self._lock:
                del self._watched[cancellation]

    def _poll(self) -> None:
        while True:
            with self._lock:
                if not self._watched:
                    self._polling = False
                    return
                for cancellation, gone in self._watched.items():
                    if not cancellation.cancelled and gone():
                        cancellation.cancel()
            time.sleep(self.poll_s)
