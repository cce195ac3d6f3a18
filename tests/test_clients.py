"""Who a request comes from: the peer, or behind a proxy the operator trusts, the address it
appended to ``X-Forwarded-For``; a header from any other peer cannot make a client another."""

from __future__ import annotations

import pytest

from common.limits.clients import client_of, trusted_networks

pytestmark = pytest.mark.unit

PROXY = trusted_networks("10.0.0.5, 192.168.1.0/24")


def test_a_direct_client_is_its_peer_whatever_it_forwards() -> None:
    environ = {"REMOTE_ADDR": "203.0.113.7", "HTTP_X_FORWARDED_FOR": "198.51.100.1"}
    assert client_of(environ, PROXY) == "203.0.113.7"
    assert client_of(environ, ()) == "203.0.113.7"


def test_behind_a_trusted_proxy_the_client_is_the_address_it_appended() -> None:
    """The last address is the proxy's own entry; anything before it the client wrote."""
    forged = {"REMOTE_ADDR": "10.0.0.5", "HTTP_X_FORWARDED_FOR": "198.51.100.1, 203.0.113.7"}
    assert client_of(forged, PROXY) == "203.0.113.7"
    assert client_of({"REMOTE_ADDR": "192.168.1.9", "HTTP_X_FORWARDED_FOR": "2001:db8::1"}, PROXY) == "2001:db8::1"


def test_a_trusted_proxy_without_a_usable_header_is_its_own_client() -> None:
    assert client_of({"REMOTE_ADDR": "10.0.0.5"}, PROXY) == "10.0.0.5"
    assert client_of({"REMOTE_ADDR": "10.0.0.5", "HTTP_X_FORWARDED_FOR": "not an address"}, PROXY) == "10.0.0.5"


def test_a_bad_trusted_proxy_is_named() -> None:
    with pytest.raises(ValueError, match=r"'proxy\.local'"):
        trusted_networks("10.0.0.1 proxy.local")
