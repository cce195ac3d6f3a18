# Over 400 lines: the gthread worker's connection handling, its parts sharing one connection's state.
"""The gunicorn worker of every service: gthread, where a slow client holds a socket, never a thread.

gunicorn's gthread worker hands a connection to a request thread as soon as it has a byte to
read, and the thread then reads the request's head and body from a blocking socket for as long
as the client takes: as many clients as there are threads, each sending a partial head or a
short body, stopped every other request, ``/health`` included. Here the worker's main loop
reads every request, non-blocking, and frames it itself (``common.server.framing``): a request thread
gets a whole request in memory (its head, parsed by gunicorn's parser; its body, already
de-chunked) and never reads from the socket. The main loop answers by itself, and closes, what
it refuses: a request it cannot frame (400, 413, 431, 501, ...), one that does not arrive within
its deadlines (408: ``SCORER_HEAD_TIMEOUT_S`` for the head, from the connection or its first
byte; ``SCORER_BODY_TIMEOUT_S`` for the body, from the end of the head), a request with a body
and without the bearer token when one is set (401, before a byte of its body is read), and one
that would take the worker's buffered bytes over ``BUFFERED_BYTES_LIMIT`` (503). An error on one
connection is answered on that connection; no exception ends the main loop.

Closing after an answer half-closes the connection and discards what the client still sends for
a moment (at most ``LINGER_BYTES``, ``LINGER_S``), as gunicorn's ``close_graceful`` does but
from the main loop, without blocking it: so the client reads its answer, not a reset.

Deadlines sit in one heap, so each event costs the main loop the same whatever the number of
connections (idle ones included); kept-alive connections wait in the same way between requests
(``keepalive`` seconds, then closed quietly).

On SIGTERM gunicorn's gthread worker stops accepting and lets its in-flight requests finish
within ``graceful_timeout``, but keeps its listening socket open until it exits: connections
the kernel completes meanwhile wait in the backlog for the whole grace period and are then
reset. This worker takes what is already in the backlog and closes its listeners at once, so
a client (or nginx) that connects after the stop is refused immediately and goes elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import select
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus

from gunicorn.http.errors import InvalidHeader
from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser
from gunicorn.http.unreader import Unreader
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, TConn, ThreadWorker

from common.configuration.config import from_env
from common.configuration.settings import CoreSettings
from common.sdk.wire import encode_body, pickle_status, wire_format
from common.server.auth import bearer_token_matches
from common.server.framing import Head, Refused, RequestFraming

# WSGI environ key: when the request was whole in the worker (monotonic clock). A request's
# deadline counts from there, so time spent waiting for a free thread counts too.
ARRIVED_KEY = "scorer.arrived"
# Bytes one worker holds for its requests, from their first byte until they are answered (at
# least the body limit): a request that would go over it is answered 503 at once.
BUFFERED_BYTES_LIMIT = 1 << 30
RECV_BYTES = 256 * 1024
RECV_TURNS = 16  # at most 4 MiB from one connection per event, then the other connections
# Closing after an answer: what the client still sends is discarded, this much for this long.
LINGER_BYTES = 64 * 1024
LINGER_S = 2.0
# Methods that need no token when they carry no body: the probes (/health, /ready, /metrics).
BODILESS_OPEN_METHODS = frozenset(("GET", "HEAD"))
# A failing accept() (out of descriptors) is logged at most this often.
ACCEPT_ERROR_LOG_EVERY_S = 10.0


@dataclass
class Incoming:
    """A request being read by the main loop."""

    framing: RequestFraming
    deadline: float
    fresh: bool  # a new connection (idle past the deadline: 408), not a kept-alive one
    received: bool = False  # a byte of it has arrived
    arrived: float | None = None  # when its head was whole


@dataclass
class Lingering:
    """A connection answered and half-closed, discarding what still comes."""

    deadline: float
    left: int = LINGER_BYTES


@dataclass
class Framed:
    """A whole request for a thread: its head, its body, and what followed it on the connection."""

    head: Head
    body: bytes
    rest: bytes
    arrived: float


@dataclass
class Watched:
    """The deadline heap's view of a connection: what it is waiting for, and until when."""

    heap: list = field(default_factory=list)
    order: itertools.count = field(default_factory=itertools.count)

    def watch(self, conn: TConn, state: Incoming | Lingering) -> None:
        conn.state = state
        heapq.heappush(self.heap, (state.deadline, next(self.order), conn, state))

    def expired(self, now: float) -> list[tuple[TConn, Incoming | Lingering]]:
        """Connections whose current state's deadline has passed (stale entries dropped)."""
        out = []
        while self.heap and self.heap[0][0] <= now:
            deadline, _, conn, state = heapq.heappop(self.heap)
            if conn.state is state and state.deadline == deadline:
                out.append((conn, state))
        return out


class FramedUnreader(Unreader):
    """gunicorn's parser reads a framed request's head from here, and nothing more."""

    def __init__(self, framed: Framed) -> None:
        super().__init__()
        self.framed = framed
        self.buf.write(framed.head.raw)

    def chunk(self, size_hint: int | None = None) -> bytes:
        raise InvalidHeader("request head (gunicorn's parser reads past where it was framed)")


class FramedParser(RequestParser):
    """gunicorn's parser over a framed request: nothing of its body is left on the socket."""

    def finish_body(self, deadline: float | None = None, max_bytes: int | None = None) -> bool:
        """Nothing to drain before the connection is kept alive: the main loop read the body
        whole (and what followed it) before the request was handed over."""
        return True


class FramedRequest(Request):
    """gunicorn's request, parsed from the head alone; its body is the one framed in the worker."""

    def set_body_reader(self) -> None:
        if self.unreader.buf.getvalue():
            raise InvalidHeader("request head (gunicorn's parser ends it before where it was framed)")
        super().set_body_reader()  # gunicorn's own checks of the framing fields
        self.body = FramedBody(self.unreader.framed.body)
        self._expected_100_continue = False  # the main loop answered it


class FramedBody:
    """``wsgi.input`` over a body in memory: reads cost what they return."""

    def __init__(self, body: bytes) -> None:
        self._body, self._at = body, 0

    def read(self, size: int | None = None) -> bytes:
        end = len(self._body) if size is None or size < 0 else min(len(self._body), self._at + size)
        data = self._body[self._at : end]  # the whole body is the same object, uncopied
        self._at = end
        return data

    def readline(self, size: int | None = None) -> bytes:
        newline = self._body.find(b"\n", self._at)
        end = len(self._body) if newline < 0 else newline + 1
        if size is not None and size >= 0:
            end = min(end, self._at + size)
        data = self._body[self._at : end]
        self._at = end
        return data

    def readlines(self, hint: int | None = None) -> list[bytes]:
        return list(iter(self.readline, b""))

    def __iter__(self):
        return iter(self.readline, b"")


def error_answer(status: int, reason: str, content_type: str | None, message: str, extra: str = "") -> bytes:
    """A complete error response that closes the connection, in the request's wire format."""
    body, mimetype = encode_body({"error": message}, wire_format(content_type))
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n{extra}"
        f"Content-Type: {mimetype}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class ScorerWorker(ThreadWorker):
    def init_process(self) -> None:
        core = from_env(CoreSettings)
        self.head_timeout_s, self.body_timeout_s = core.head_timeout_s, core.body_timeout_s
        self.max_body_bytes = core.max_body_bytes
        self.auth_token = core.auth_token
        self.buffered_limit = max(BUFFERED_BYTES_LIMIT, 2 * core.max_body_bytes)
        self.buffered_bytes = 0
        self.watched = Watched()
        self._accept_error_logged = 0.0
        self.idle_capped = False  # the stop's cap on kept-alive connections is set
        self._serving = threading.local()
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        app, serving = self.wsgi, self._serving

        def stamped(environ, start_response):
            environ[ARRIVED_KEY] = serving.arrived
            return app(environ, start_response)

        self.wsgi = stamped

    # -- the main loop: no exception on one connection ends it ------------------------------

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        try:
            events = self.poller.select(timeout)
        except InterruptedError:
            return
        for key, _ in events:
            try:
                key.data(key.fileobj)
            except Exception:
                self.log.exception("the worker's main loop failed on an event; it carries on")

    def accept(self, listener) -> None:
        try:
            super().accept(listener)
        except OSError as exc:  # out of descriptors or memory: the connection waits in the backlog
            now = time.monotonic()
            if now - self._accept_error_logged > ACCEPT_ERROR_LOG_EVERY_S:
                self._accept_error_logged = now
                self.log.warning("accept failed: %s", errno.errorcode.get(exc.errno, exc))

    def enqueue_req(self, conn: TConn) -> None:
        """A new connection (from gunicorn's ``accept``): its request is read here, not on a thread."""
        self._await_request(conn, fresh=True, pipelined=b"")

    def _await_request(self, conn: TConn, fresh: bool, pipelined: bytes, idle_s: float | None = None) -> None:
        """Read the next request of ``conn`` in the main loop (idle for ``idle_s`` at most, when
        it is a kept-alive connection with nothing yet)."""
        framing = RequestFraming(self.max_body_bytes)
        incoming = Incoming(framing, time.monotonic() + (idle_s or self.head_timeout_s), fresh)
        conn.held = len(pipelined)  # already counted in buffered_bytes when pipelined
        conn.sock.setblocking(False)
        self.watched.watch(conn, incoming)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._receive, conn))
        if pipelined:
            with self._answering_errors(conn):
                framing.receive(pipelined)
                self._on_bytes(conn, incoming)
        elif fresh:
            self._receive(conn)

    def _receive(self, conn: TConn, *_: object) -> None:
        incoming = conn.state
        if not isinstance(incoming, Incoming):
            return
        with self._answering_errors(conn):
            for _ in range(RECV_TURNS):
                want = incoming.framing.wants(RECV_BYTES)
                try:
                    data = conn.sock.recv(want)
                except (BlockingIOError, InterruptedError):
                    return
                if not data:  # the client is done sending: a request cut short is answered
                    if incoming.received:
                        raise Refused(400, f"the request was cut short in its {incoming.framing.step()}")
                    self._close(conn)
                    return
                self._hold(conn, len(data))
                incoming.framing.receive(data)
                if not self._on_bytes(conn, incoming) or len(data) < want:
                    return

    @contextlib.contextmanager
    def _answering_errors(self, conn: TConn) -> Iterator[None]:
        """An error reading ``conn`` is answered on it (a refusal with its own status, anything
        else 400) and ends that connection, never the main loop."""
        try:
            yield
        except Refused as refusal:
            self._refuse(conn, refusal)
        except OSError:
            self._close(conn)
        except Exception as exc:
            self.log.exception("reading a request failed")
            self._refuse(conn, Refused(400, f"the request could not be read ({type(exc).__name__})"))

    def _on_bytes(self, conn: TConn, incoming: Incoming) -> bool:
        """Frame what has arrived; hand a whole request to a thread. False: stop reading."""
        if not incoming.received:
            incoming.received = True
            if not incoming.fresh:  # a kept-alive connection's next request: its head is due now
                incoming.deadline = time.monotonic() + self.head_timeout_s
                self.watched.watch(conn, incoming)
        framing = incoming.framing
        if framing.head is None:
            head = framing.read_head()
            if head is None:
                return True
            self._check_token(head)
            incoming.arrived = time.monotonic()
            incoming.deadline = incoming.arrived + self.body_timeout_s
            self.watched.watch(conn, incoming)
            if not framing.read_body():
                if head.expects_continue:
                    self._send(conn.sock, b"HTTP/1.1 100 Continue\r\n\r\n")
                return True
        elif not framing.read_body():
            return True
        self._release(conn)
        conn.state = Framed(framing.head, bytes(framing.body), framing.rest(), incoming.arrived or time.monotonic())
        conn.data_ready = True
        super().enqueue_req(conn)
        return False

    def _check_token(self, head: Head) -> None:
        """With a token set, a request with a body (or a POST) must carry it, before its body is read."""
        if not self.auth_token or (head.method in BODILESS_OPEN_METHODS and not head.has_body):
            return
        if not bearer_token_matches(head.authorization, self.auth_token):
            raise Refused(401, "missing or wrong bearer token")

    def _hold(self, conn: TConn, size: int) -> None:
        conn.held += size
        self.buffered_bytes += size
        if self.buffered_bytes > self.buffered_limit:
            message = f"the worker holds {self.buffered_limit} bytes of requests; retry later"
            raise Refused(503, message, retry_later=True)

    def _unhold(self, conn: TConn, keep: int = 0) -> None:
        self.buffered_bytes -= getattr(conn, "held", 0) - keep
        conn.held = keep

    def _release(self, conn: TConn) -> None:
        """The main loop stops reading ``conn``."""
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)

    # -- answers and closes from the main loop ----------------------------------------------

    def _refuse(self, conn: TConn, refusal: Refused) -> None:
        incoming = conn.state
        head = incoming.framing.head if isinstance(incoming, Incoming) else None
        if refusal.status != 401 and 400 <= refusal.status < 500:
            self.log.info("refused a request: %d %s", refusal.status, refusal.message)
        extra = 'WWW-Authenticate: Bearer realm="scorer"\r\n' if refusal.status == 401 else ""
        content_type = head and head.content_type
        status = refusal.status
        if refusal.retry_later and wire_format(content_type) == "pickle":  # the load's: flow_grpo's 500
            status = pickle_status(status, retry_later=True)
        answer = error_answer(status, HTTPStatus(status).phrase, content_type, refusal.message, extra)
        self._send(conn.sock, answer)
        self._linger(conn)

    def _linger(self, conn: TConn) -> None:
        """Half-close ``conn`` and discard what the client still sends, then close it."""
        self._release(conn)
        self._unhold(conn)
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._discard, conn))
        except (OSError, ValueError, KeyError):
            self._close(conn)
            return
        self.watched.watch(conn, Lingering(time.monotonic() + LINGER_S))

    def _discard(self, conn: TConn, *_: object) -> None:
        lingering = conn.state
        if not isinstance(lingering, Lingering):
            return
        try:
            while lingering.left > 0:
                data = conn.sock.recv(min(RECV_BYTES, lingering.left))
                if not data:
                    break
                lingering.left -= len(data)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn: TConn) -> None:
        self._release(conn)
        self._unhold(conn)
        conn.state = None
        self.nr_conns -= 1
        conn.close()

    @staticmethod
    def _send(sock: socket.socket, data: bytes) -> None:
        """Best effort on a non-blocking socket: a small answer fits its send buffer."""
        with contextlib.suppress(OSError):
            sock.send(data)

    def _close_idle_by(self, deadline: float) -> None:
        """Stopping: kept-alive connections with nothing sent are closed by ``deadline``."""
        for _, _, conn, state in list(self.watched.heap):
            idle = isinstance(state, Incoming) and not state.fresh and not state.received
            if idle and conn.state is state and state.deadline > deadline:
                state.deadline = deadline
                self.watched.watch(conn, state)

    def murder_pending(self) -> None:
        """gunicorn's own, then every connection past its deadline; once the worker stops (for
        whatever reason), kept-alive connections stay open ``STOP_KEEPALIVE_LINGER`` at most."""
        super().murder_pending()
        if not self.alive and not self.idle_capped:
            self.idle_capped = True
            self._close_idle_by(time.monotonic() + STOP_KEEPALIVE_LINGER)
        for conn, state in self.watched.expired(time.monotonic()):
            try:
                if isinstance(state, Lingering) or not state.received:
                    if isinstance(state, Incoming) and state.fresh:  # connected and sent nothing
                        self._refuse(conn, Refused(408, f"no request within {self.head_timeout_s:g}s"))
                    else:
                        self._close(conn)
                    continue
                part = "body" if state.framing.head is not None else "head"
                limit = self.body_timeout_s if state.framing.head is not None else self.head_timeout_s
                self._refuse(conn, Refused(408, f"the request's {part} did not arrive within {limit:g}s"))
            except Exception:
                self.log.exception("closing a connection past its deadline failed")

    # -- a request thread serves a whole request ---------------------------------------------

    def handle(self, conn: TConn):
        framed: Framed = conn.state
        conn.parser = FramedParser(self.cfg, [], conn.client)
        conn.parser.mesg_class = FramedRequest
        conn.parser.unreader = FramedUnreader(framed)
        conn.initialized = True  # no TLS or HTTP/2 on the main loop's sockets
        self._serving.arrived = framed.arrived
        return super().handle(conn)

    def finish_request(self, conn: TConn, fs) -> None:
        """Main loop: the next request of a kept-alive connection (maybe pipelined), or a close."""
        framed: Framed = conn.state
        try:
            keep = not fs.cancelled() and bool(fs.result())
        except Exception:
            keep = False
        conn.parser = None
        if not keep:
            self._linger(conn)
            return
        self._unhold(conn, keep=len(framed.rest))
        idle_s = self.cfg.keepalive if self.alive else min(self.cfg.keepalive, STOP_KEEPALIVE_LINGER)
        try:
            self._await_request(conn, fresh=False, pipelined=framed.rest, idle_s=idle_s)
        except Exception:
            self.log.exception("keeping a connection alive failed")
            self._close(conn)

    # -- graceful stop -----------------------------------------------------------------------

    def handle_exit(self, sig, frame) -> None:
        if self.alive:
            self.method_queue.defer(self._stop_listening)
        super().handle_exit(sig, frame)

    def _stop_listening(self) -> None:
        """Serve every connection already accepted by the kernel, then refuse new ones."""
        self.set_accept_enabled(False)
        for listener in self.sockets:
            for _ in range(self.worker_connections):
                if not select.select([listener], [], [], 0)[0]:
                    break
                self.accept(listener)
            listener.close()
