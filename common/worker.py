"""The gunicorn worker of every service: gthread, where a slow client holds a socket, never a thread.

gunicorn's gthread worker hands a connection to a request thread as soon as it has a byte to
read, and the thread then reads the request's head and body from a blocking socket for as long
as the client takes: as many clients as there are threads, each sending a partial head or a
short body, stopped every other request, ``/health`` included. Here the worker's main loop
reads every request (head and body, non-blocking, ``common.framing`` telling when it is whole)
and only a complete request goes to a thread. A request must arrive within its deadlines
(``SCORER_HEAD_TIMEOUT_S`` for the head, from the connection or its first byte;
``SCORER_BODY_TIMEOUT_S`` for the body, from the end of the head): past them it is answered 408
and the connection closed. Kept-alive connections idle between requests stay gunicorn's
(``keepalive`` seconds, then closed quietly).

On SIGTERM gunicorn's gthread worker stops accepting and lets its in-flight requests finish
within ``graceful_timeout``, but keeps its listening socket open until it exits: connections
the kernel completes meanwhile wait in the backlog for the whole grace period and are then
reset. This worker takes what is already in the backlog and closes its listeners at once, so
a client (or nginx) that connects after the stop is refused immediately and goes elsewhere.
"""

from __future__ import annotations

import contextlib
import select
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import partial

from gunicorn.http.errors import NoMoreData
from gunicorn.http.unreader import SocketUnreader
from gunicorn.workers.gthread import TConn, ThreadWorker

from common.config import from_env
from common.framing import Arrival, RequestScan
from common.settings import CoreSettings
from common.wire import encode_body, wire_format

# WSGI environ key: when the request was whole in the worker (monotonic clock). A request's
# deadline counts from there, so time spent waiting for a free thread counts too.
ARRIVED_KEY = "scorer.arrived"
# Bytes one worker's main loop holds for requests still arriving; beyond it, a request is read
# on its thread (under the same deadlines) instead.
BUFFERED_BYTES_LIMIT = 1 << 30
RECV_BYTES = 256 * 1024
# How often the main loop looks for requests past their deadline.
SWEEP_EVERY_S = 0.25


class ReadTimedOut(NoMoreData, TimeoutError):
    """A request thread's read from the client passed the request's deadline."""


class DeadlineUnreader(SocketUnreader):
    """gunicorn's socket reader, each read bounded by the request's deadline."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.deadline = float("inf")
        self.timed_out = False

    def chunk(self, size_hint: int | None = None) -> bytes:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.timed_out = True
            raise ReadTimedOut("the request did not arrive within its deadline")
        prior = self.sock.gettimeout()
        self.sock.settimeout(remaining if prior is None else min(prior, remaining))
        try:
            return super().chunk(size_hint)
        except TimeoutError:
            self.timed_out = True
            raise ReadTimedOut("the request did not arrive within its deadline") from None
        finally:
            self.sock.settimeout(prior)


@dataclass
class Incoming:
    """A request being read by the main loop."""

    scan: RequestScan
    deadline: float
    fresh: bool  # a new connection (idle past the deadline: 408), not a kept-alive one
    buffer: bytearray = field(default_factory=bytearray)
    arrived: float | None = None
    whole: bool = False  # ready for a request thread


def timeout_answer(content_type: str | None, message: str) -> bytes:
    """A complete 408 response that closes the connection, in the request's wire format."""
    body, mimetype = encode_body({"error": message}, wire_format(content_type))
    head = (
        "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
        f"Content-Type: {mimetype}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class ScorerWorker(ThreadWorker):
    def init_process(self) -> None:
        core = from_env(CoreSettings)
        self.head_timeout_s, self.body_timeout_s = core.head_timeout_s, core.body_timeout_s
        self.max_body_bytes = core.max_body_bytes
        self.arriving: set[TConn] = set()
        self.buffered_bytes = 0
        self._next_sweep = 0.0
        self._serving = threading.local()
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        app, serving = self.wsgi, self._serving

        def stamped(environ, start_response):
            serving.app_called = True
            environ[ARRIVED_KEY] = serving.arrived
            return app(environ, start_response)

        self.wsgi = stamped

    # -- the main loop reads requests -------------------------------------------------------

    def enqueue_req(self, conn: TConn) -> None:
        """A new connection, a kept-alive one with bytes, or a whole request (to a thread)."""
        incoming: Incoming | None = getattr(conn, "incoming", None)
        if incoming is not None and incoming.whole:
            super().enqueue_req(conn)
            return
        pipelined = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        conn.incoming = Incoming(
            RequestScan(self.max_body_bytes), time.monotonic() + self.head_timeout_s, fresh=conn.parser is None
        )
        conn.incoming.buffer += pipelined
        self.buffered_bytes += len(pipelined)
        conn.sock.setblocking(False)
        self.arriving.add(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._receive, conn))
        self._receive(conn)

    def _receive(self, conn: TConn, *_: object) -> None:
        incoming: Incoming = conn.incoming
        try:
            for _ in range(16):  # at most 4 MiB per turn, then the other connections
                data = conn.sock.recv(RECV_BYTES)
                if not data:  # the client is done sending: what it sent is answered (400 if cut short)
                    if incoming.buffer:
                        self._hand_over(conn)
                    else:
                        self._drop(conn)
                    return
                incoming.buffer += data
                self.buffered_bytes += len(data)
                if len(data) < RECV_BYTES:
                    break
        except BlockingIOError:
            pass
        except OSError:
            self._drop(conn)
            return
        self._advance(conn)

    def _advance(self, conn: TConn) -> None:
        incoming: Incoming = conn.incoming
        had_head = incoming.scan.head_complete
        arrival = incoming.scan.feed(incoming.buffer)
        if not had_head and incoming.scan.head_complete:
            incoming.arrived = time.monotonic()
            incoming.deadline = incoming.arrived + self.body_timeout_s
            if incoming.scan.expects_continue and arrival is Arrival.PARTIAL:
                self._send(conn.sock, b"HTTP/1.1 100 Continue\r\n\r\n")
        if arrival is Arrival.PARTIAL and self.buffered_bytes <= BUFFERED_BYTES_LIMIT:
            return
        self._hand_over(conn)

    def _hand_over(self, conn: TConn) -> None:
        """To a request thread (whole, or not framed here, or over the buffer limit)."""
        self._release(conn)
        conn.incoming.whole = True
        conn.data_ready = True
        super().enqueue_req(conn)

    def _release(self, conn: TConn) -> None:
        """The main loop stops reading ``conn``."""
        self.arriving.discard(conn)
        self.buffered_bytes -= len(conn.incoming.buffer)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)

    def _drop(self, conn: TConn, answer: bytes = b"") -> None:
        self._release(conn)
        if answer:
            self._send(conn.sock, answer)
        self.nr_conns -= 1
        conn.close()

    @staticmethod
    def _send(sock: socket.socket, data: bytes) -> None:
        """Best effort on a non-blocking socket: a small answer fits its send buffer."""
        with contextlib.suppress(OSError):
            sock.send(data)

    def murder_pending(self) -> None:
        """gunicorn's own, then every request past its deadline: 408, closed."""
        super().murder_pending()
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        for conn in [conn for conn in self.arriving if conn.incoming.deadline <= now]:
            incoming: Incoming = conn.incoming
            if not incoming.buffer and not incoming.fresh:
                self._drop(conn)
                continue
            part = "body" if incoming.scan.head_complete else "head"
            limit = self.body_timeout_s if incoming.scan.head_complete else self.head_timeout_s
            message = f"the request's {part} did not arrive within {limit:g}s"
            self._drop(conn, timeout_answer(incoming.scan.content_type, message))

    # -- a request thread serves a whole request ---------------------------------------------

    def handle(self, conn: TConn):
        incoming: Incoming = conn.incoming
        conn.incoming = None  # the next request on this connection is read afresh
        conn.sock.setblocking(True)
        conn.init()
        if not isinstance(conn.parser.unreader, DeadlineUnreader):
            conn.parser.unreader = DeadlineUnreader(conn.sock)
        reader: DeadlineUnreader = conn.parser.unreader
        reader.unread(bytes(incoming.buffer))
        reader.deadline, reader.timed_out = incoming.deadline, False
        self._serving.arrived = incoming.arrived or time.monotonic()
        self._serving.app_called = False
        result = super().handle(conn)
        if reader.timed_out and not self._serving.app_called:  # timed out in the head: say so
            conn.sock.setblocking(False)
            self._send(conn.sock, timeout_answer(None, "the request's head did not arrive in time"))
        return result

    # -- graceful stop -----------------------------------------------------------------------

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
