"""HTTP protocols a scorer speaks: each is a small spec the app factory serves on one request path.

The path (``common.app``) is the same for every protocol: bearer token, body read under the
size limit, ``decode`` of the body, wait for the model, ``items`` under the decode limit, the
batcher or ``score_request``, ``answer`` from the results, ``encode`` of the answer; errors go
through the protocol's ``status`` and ``encode`` too. A protocol only says what differs: its
routes, its wire format, how a payload becomes items and results an answer, and which status
its clients must see for an error. (``common.wire`` holds the wire formats themselves.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.config import env_name
from common.errors import ScorerError
from common.scorer import Scored, Scorer
from common.wire import JsonCap, decode_body, encode_body, wire_format


@dataclass(frozen=True)
class Protocol:
    name: str
    # POST routes that speak it.
    routes: tuple[str, ...]
    # The request body and its Content-Type -> the payload dict (a ``ScorerError`` for a bad body).
    decode: Callable[[bytes, str | None], dict[str, Any]]
    # The payload -> items, one per sample (validation; runs on the request thread, limited).
    items: Callable[[dict[str, Any]], list[Any]]
    # One result per item -> the answer object.
    answer: Callable[[Sequence[float | Scored]], dict[str, Any]]
    # An answer or ``{"error": message}`` and the request's Content-Type -> body and mimetype.
    encode: Callable[[dict[str, Any], str | None], tuple[bytes, str]]
    # The status this protocol's clients must see for an error (default: the error's own).
    status: Callable[[ScorerError], int] = lambda error: error.status


def collate(results: Sequence[float | Scored]) -> dict[str, Any]:
    """Results to the core answer: ``scores`` and ``outputs`` (flow_grpo reads ``outputs``), plus
    one per-sample list for each extras key of ``Scored`` results."""
    scores = [float(r.score if isinstance(r, Scored) else r) for r in results]
    out: dict[str, Any] = {"scores": scores, "outputs": scores}
    keys = {key for r in results if isinstance(r, Scored) for key in r.extras}
    for key in sorted(keys):
        out[key] = [r.extras.get(key) if isinstance(r, Scored) else None for r in results]
    return out


def core_protocol(scorer: Scorer) -> Protocol:
    """``POST /`` and ``/score``: a pickled dict (flow_grpo, deepgen_rl, VeRL-Omni), or the same
    dict as JSON when the request says ``Content-Type: application/json``; the answer in the
    request's format."""
    json_cap = JsonCap(scorer.core.max_json_values, env_name("", "max_json_values"))
    return Protocol(
        name="core",
        routes=("/", "/score"),
        decode=lambda body, content_type: decode_body(body, wire_format(content_type), json_cap),
        items=scorer.decode,
        answer=collate,
        encode=lambda obj, content_type: encode_body(obj, wire_format(content_type)),
    )
