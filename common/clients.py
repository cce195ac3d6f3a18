"""Who a request comes from, the one definition every service shares out its capacity by.

A client is the peer address of the connection; behind a proxy the operator names as trusted
(``SCORER_TRUSTED_PROXIES``), the address that proxy appended to ``X-Forwarded-For`` (the last
one: anything before it was written by the client and may be forged). A header from any other
peer is ignored, so a direct client cannot pose as another to get a second turn.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

# The client of the request this thread is serving (``request_client``).
_current_client: ContextVar[str] = ContextVar("scorer_request_client", default="")


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
def request_client(client: str) -> Iterator[str]:
    """Make ``client`` the one this thread's work is counted to."""
    token = _current_client.set(client)
    try:
        yield client
    finally:
        _current_client.reset(token)


def current_client() -> str:
    """The client of the request being served ("" outside a request)."""
    return _current_client.get()
