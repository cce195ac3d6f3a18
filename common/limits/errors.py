"""Errors as first-class objects: each carries the HTTP status its client must see.

Statuses follow the retry rules of the trainers' clients (docs/ARCHITECTURE.md §5.3): a malformed request is
a 4xx that is never retried, an overloaded server 503 (retried), an internal fault 500. A protocol
may answer an error with another status (``WireProtocol.status``): on a pickle body, flow_grpo's
clients retry a 500 only, so there overload (``retry_later``) is the 500 and a fault a 503.
"""

from __future__ import annotations

import re
from itertools import islice
from typing import Any

# Error messages quote input so the client sees what was wrong, never more than this of it.
QUOTE_CHARS = 100
_QUOTE_ITEMS = 4  # items shown per container
_QUOTE_LEVELS = 3  # containers shown inside containers
_QUOTE_INT_BITS = 128  # beyond it an int is described: its decimal form may take seconds to build
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """A repr of request input for an error message, bounded in length and in work whatever the
    value's size, nesting or sharing, that never shows an object's address."""
    text = _bounded_repr(value, _QUOTE_LEVELS)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bounded_repr(value: Any, levels: int) -> str:
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= _QUOTE_INT_BITS else f"<int of {value.bit_length()} bits>"
    if isinstance(value, (str, bytes)):
        return repr(value[:QUOTE_CHARS]) + ("..." if len(value) > QUOTE_CHARS else "")
    if not isinstance(value, (list, tuple, dict, set, frozenset)):
        return f"<{type(value).__name__}>"
    if not levels:
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, dict):
        parts = [
            f"{_bounded_repr(k, levels - 1)}: {_bounded_repr(v, levels - 1)}"
            for k, v in islice(value.items(), _QUOTE_ITEMS)
        ]
    else:
        parts = [_bounded_repr(item, levels - 1) for item in islice(value, _QUOTE_ITEMS)]
    if len(value) > _QUOTE_ITEMS:
        parts.append(f"... {len(value)} in all")
    opening, closing = {list: "[]", tuple: "()", dict: "{}"}.get(type(value), "{}")
    return f"{opening}{', '.join(parts)}{closing}"


def describe_error(exc: BaseException) -> str:
    """An exception raised on request input, for an error message: its type and its message,
    bounded and without object addresses (a library's message may quote a buffer object)."""
    message = _ADDRESS.sub("", str(exc))
    if len(message) > 2 * QUOTE_CHARS:
        message = message[: 2 * QUOTE_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {message}"


class ScorerError(Exception):
    """Base class; ``status`` is the HTTP status the request is answered with."""

    status: int = 500
    # The node's load or start-up refused the request, not the request nor a fault: the same
    # request succeeds later, here or on another node.
    retry_later: bool = False

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
    """The node has no room for the request now; the client should retry, after
    ``retry_after_s`` when the node can tell (the answer's ``Retry-After``)."""

    status = 503
    retry_later = True

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotReady(ScorerError):
    """The model is still loading."""

    status = 503
    retry_later = True


class SetupFailed(NotReady):
    """The model failed to load: the node answers nothing else until it is restarted."""

    retry_later = False


class InternalError(ScorerError):
    """A fault of the node's own (its model's exception, a result that is no score): the same
    request would fail the same way."""

    status = 500
