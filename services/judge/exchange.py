"""One HTTP exchange with the engine, bounded in time and bytes: every send and every read of
the connection gets only the time left to the deadline, so an engine that sends a byte a
second (each read quick, the whole answer never) is cut off at the deadline, head or body; and
no more than ``limit`` bytes of its body are read."""

from __future__ import annotations

import http.client
import io
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class Unreachable(Exception):
    """No connection to the engine: nothing there answers."""


@dataclass(frozen=True)
class Answered:
    """An answer's status and at most ``limit`` bytes of its body; ``over`` when it had more."""

    status: int
    body: bytes
    over: bool


class _DeadlineSocket:
    """A connected socket whose sends and reads end by ``expires`` (``time.monotonic()``)."""

    def __init__(self, sock: socket.socket, expires: float) -> None:
        self.sock = sock
        self.expires = expires

    def _left(self) -> float:
        left = self.expires - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        return left

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(self._left())  # since Python 3.5, the whole sendall's bound
        self.sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self.sock.settimeout(self._left())
        return self.sock.recv_into(buffer)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_Reads(self))

    def close(self) -> None:
        self.sock.close()


class _Reads(io.RawIOBase):
    """The socket's bytes for ``http.client``'s buffered reader, each read by the deadline."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.sock.recv_into(buffer)


class _Bounded:
    """Connects as its ``http.client`` class does, then bounds the connection by ``expires``."""

    expires: float
    sock: Any

    def connect(self) -> None:
        try:
            super().connect()  # type: ignore[misc]
        except OSError as exc:
            raise Unreachable(f"could not be reached: {type(exc).__name__}") from None
        self.sock = _DeadlineSocket(self.sock, self.expires)


class _HTTP(_Bounded, http.client.HTTPConnection):
    pass


class _HTTPS(_Bounded, http.client.HTTPSConnection):
    pass


class Connections:
    """Exchanges with one engine, each sender thread keeping its own connection alive between
    them (at most one a thread, as many as the senders); an exchange that fails, is cut off or
    has more than ``limit`` bytes drops its connection."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.kind = _HTTPS if parts.scheme == "https" else _HTTP
        self.host, self.port = parts.hostname or "", parts.port
        self.prefix = parts.path.rstrip("/")
        self._local = threading.local()

    def exchange(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        expires: float,
        limit: int,
        keep: bool,
    ) -> Answered:
        """``method`` ``path`` by ``expires``, on this thread's connection when ``keep``:
        ``Unreachable`` when no connection is made, ``TimeoutError`` at the deadline, ``OSError``
        or ``http.client.HTTPException`` when the connection fails after. A kept connection the
        engine closed while idle is replaced at once, as HTTP clients do."""

        def over(connection: _HTTP) -> Answered:
            """One exchange on ``connection``, kept for the thread's next when ``keep`` and it ended cleanly."""
            connection.expires = connection.sock.expires = expires
            try:
                connection.request(method, self.prefix + path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read(limit + 1)
            except BaseException:
                connection.close()
                raise
            if keep and len(data) <= limit and not response.will_close:
                self._local.connection = connection
            else:
                connection.close()
            return Answered(response.status, data[:limit], len(data) > limit)

        kept: _HTTP | None = getattr(self._local, "connection", None) if keep else None
        self._local.connection = None
        if kept is not None:
            try:
                return over(kept)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                pass  # closed while idle: sent again on a new connection, as HTTP clients do
        left = expires - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        connection = self.kind(self.host, self.port, timeout=left)
        connection.expires = expires
        connection.connect()
        return over(connection)
