"""Wire protocols: what a client sends and reads, served on the app's one request path.

The path (``common.server.serving``) is the same for every protocol: bearer token, body read under the
size limit, the body parsed into a payload, the wait for the model, the payload prepared into
items under the decode limit, the batcher or ``score_request``, the results collated into an
answer, the answer encoded; errors go through the protocol's status and encoding too. A
protocol only says what differs: its routes, its wire format, how a payload becomes items and
results an answer, and which status its clients must see for an error. ``common.sdk.wire`` holds
the wire formats themselves. A service speaks the core protocol and those its registry entry
names (``Service.protocols``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from common.configuration.config import env_name
from common.limits.errors import ScorerError
from common.pipeline.scorer import Query, Result, Samples, Scored, Scorer
from common.sdk.wire import JsonCap, decode_body, encode_body, pickle_status, wire_format


class WireProtocol:
    """The core protocol, and the base of a service's own: ``POST /`` and ``/score`` take a
    pickled dict (flow_grpo, deepgen_rl, VeRL-Omni), or the same dict as JSON when the request
    says ``Content-Type: application/json``; the answer comes in the request's format."""

    name: ClassVar[str] = "core"
    routes: ClassVar[tuple[str, ...]] = ("/", "/score")

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        # Values a JSON body may hold, counted before it is parsed (the pickle path has its own cap).
        self.json_cap = JsonCap(scorer.core.max_json_values, env_name("", "max_json_values"))

    def parse(self, body: bytes, content_type: str | None) -> dict[str, Any]:
        """The request body -> the payload dict (a ``ScorerError`` for a bad body)."""
        return decode_body(body, wire_format(content_type), self.json_cap)

    def items(self, payload: dict[str, Any], query: Query) -> list[Any] | Samples:
        """The payload and the URL's query -> items (one per sample, or ``Samples``: an image
        scorer's video request has one per chosen frame): validation and per-item work, on the
        request thread."""
        return self.scorer.prepare_samples(payload, query)

    def answer(self, results: Sequence[Result]) -> dict[str, Any]:
        """One result per sample -> the answer: ``scores`` and ``outputs`` (flow_grpo reads
        ``outputs``), plus one per-sample list for each extras key of ``Scored`` results, and the
        scorer's own fields (``Scorer.answer_fields``)."""
        scores = [float(r.score if isinstance(r, Scored) else r) for r in results]
        out: dict[str, Any] = {"scores": scores, "outputs": scores}
        keys = {key for r in results if isinstance(r, Scored) for key in r.extras}
        for key in sorted(keys):
            out[key] = [r.extras.get(key) if isinstance(r, Scored) else None for r in results]
        out.update(self.scorer.answer_fields(results))
        return out

    def encode(self, answer: dict[str, Any], content_type: str | None) -> tuple[bytes, str]:
        """An answer or ``{"error": message}`` -> the body and its mimetype."""
        return encode_body(answer, wire_format(content_type))

    def status(self, error: ScorerError, content_type: str | None) -> int:
        """The status this protocol's clients must see for ``error`` on a body of ``content_type``.

        A JSON body's is the error's own. A pickle body's is flow_grpo's: its remote rewards
        retry a 500 only (a thousand times, with backoff, 120 s an attempt) and read any other
        answer as scores, so a 503 is its ``KeyError`` and a step lost. There the node's load or
        start-up (``retry_later``: the deadline passed, the work bytes taken, the model loading)
        is the 500 it retries, and a fault that would repeat (the model's exception, a model
        that failed to load, a judge's engine answering no chat completion) the 503 that stops
        it at once instead of a thousand times. Every other client retries any 5xx alike."""
        return pickle_status(error.status, error.retry_later) if wire_format(content_type) == "pickle" else error.status
