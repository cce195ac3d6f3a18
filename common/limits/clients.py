"""Who a request comes from, the one definition every service shares out its capacity by.

A client is the peer address of the connection; behind a proxy the operator names as trusted
(``SCORER_TRUSTED_PROXIES``), the address that proxy appended to ``X-Forwarded-For`` (the last
one: anything before it was written by the client and may be forged). A header from any other
peer is ignored, so a direct client cannot pose as another to get a second turn.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

# The client of the request this thread is serving, and its connection (``request_client``).
_current_client: ContextVar[str] = ContextVar("scorer_request_client", default="")
_current_connection: ContextVar[socket.socket | None] = ContextVar("scorer_request_connection", default=None)


def trusted_networks(setting: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``SCORER_TRUSTED_PROXIES``: addresses or networks, separated by commas or spaces;
    ``ValueError`` names a bad one."""
    networks = []
    for item in setting.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or network") from None
    return tuple(networks)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None


def client_of(environ: Mapping[str, Any], trusted: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> str:
    """The client of a WSGI request: its peer, or the address a trusted proxy forwarded."""
    peer = str(environ.get("REMOTE_ADDR") or "")
    address = _address(peer)
    if address is None or not any(address in network for network in trusted):
        return peer
    forwarded = str(environ.get("HTTP_X_FORWARDED_FOR") or "").split(",")[-1]
    named = _address(forwarded)
    return str(named) if named is not None else peer


@contextlib.contextmanager
def request_client(client: str, connection: socket.socket | None = None) -> Iterator[str]:
    """Make ``client`` the one this thread's work is counted to, ``connection`` its socket."""
    tokens = _current_client.set(client), _current_connection.set(connection)
    try:
        yield client
    finally:
        _current_client.reset(tokens[0])
        _current_connection.reset(tokens[1])


def current_client() -> str:
    """The client of the request being served ("" outside a request)."""
    return _current_client.get()


def hang_up_check() -> Callable[[], bool]:
    """For the request being served, a check any thread may call: has its client closed the
    connection (no answer can reach it, so its queued work need not run)? A client that only
    shut down its sending side counts as gone too; HTTP clients keep it open for the answer."""
    connection = _current_connection.get()
    if connection is None:
        return lambda: False

    def hung_up() -> bool:
        try:
            return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    return hung_up
