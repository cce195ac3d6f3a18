"""The bearer token check, shared by the worker's main loop (before a body is read) and the app."""

from __future__ import annotations

import hmac


def bearer_token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` value carries ``token``: the scheme name is case-insensitive
    (RFC 9110 11.1, "bearer" is "Bearer"), the token is not, and is compared in constant time."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
