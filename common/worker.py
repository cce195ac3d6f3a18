"""The gunicorn worker of every service: gthread, with a shutdown that drops no connection.

On SIGTERM gunicorn's gthread worker stops accepting and lets its in-flight requests finish
within ``graceful_timeout``, but keeps its listening socket open until it exits: connections
the kernel completes meanwhile wait in the backlog for the whole grace period and are then
reset. This worker takes what is already in the backlog and closes its listeners at once, so
a client (or nginx) that connects after the stop is refused immediately and goes elsewhere.
"""

from __future__ import annotations

import select

from gunicorn.workers.gthread import ThreadWorker


class ScorerWorker(ThreadWorker):
    def handle_exit(self, sig, frame) -> None:
        if self.alive:
            self.method_queue.defer(self._stop_listening)
        super().handle_exit(sig, frame)

    def _stop_listening(self) -> None:
        """Serve every connection already accepted by the kernel, then refuse new ones."""
        self.set_accept_enabled(False)
        for listener in self.sockets:
            while select.select([listener], [], [], 0)[0]:
                self.accept(listener)
            listener.close()
