"""Errors as first-class objects: each carries the HTTP status its client must see.

Statuses follow the retry rules of the trainers' clients (docs/ARCHITECTURE.md §5.3): a malformed request is
a 4xx that is never retried, an overloaded server 503 (retried), an internal fault 500.
"""

from __future__ import annotations


class ScorerError(Exception):
    """Base class; ``status`` is the HTTP status the request is answered with."""

    status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ScorerError):
    """The body cannot be decoded at all (not pickle/JSON, forbidden pickle class)."""

    status = 400


class Unauthorized(ScorerError):
    status = 401


class RequestTimeout(ScorerError):
    """The request's body did not arrive within its deadline."""

    status = 408


class PayloadTooLarge(ScorerError):
    """Body bytes, item count, pixels or text length over a configured limit."""

    status = 413


class Unprocessable(ScorerError):
    """The body decodes but its content is wrong: missing keys, wrong types, bad images."""

    status = 422


class Overloaded(ScorerError):
    """The batch queue is full; the client should retry later."""

    status = 503


class NotReady(ScorerError):
    """The model is still loading (or failed to load)."""

    status = 503


class InternalError(ScorerError):
    status = 500
