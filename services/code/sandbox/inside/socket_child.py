"""A child the supervisor forks to serve it over a socket pair: the interactive keeper, the
assert tests' candidate source. The child holds what the supervisor must not (a sample's
answers; a memory with no outcome in it), so it is forked before that is at risk and answers
on its socket alone."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable


class SocketChild:
    """Forks a child that runs ``serve`` on its end of a new socket pair and exits (0 when
    ``serve`` returns, 1 when it raises); the parent keeps ``sock`` and ``pid``."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                self.sock.close()
                serve(theirs)
                code = 0
            finally:
                os._exit(code)
        theirs.close()

    def close(self) -> None:
        """End the child (it reads the end of its socket) and reap it."""
        self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
