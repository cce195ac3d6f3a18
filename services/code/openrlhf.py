"""OpenRLHF's remote reward protocol: ``POST /reward/score`` and ``/get_reward``
(docs/ARCHITECTURE.md §5.2).

Request JSON ``{"query" | "outputs": [str], "prompts": [str], "labels": [any]}``; answer
``{"rewards", "scores", "extra_logs", "error_types"}``, one entry per sample in each list
(every ``extra_logs`` value too: OpenRLHF logs each list's mean). Always JSON, encoded by
``common.wire`` as the core's JSON twin is: NaN as the JSON constant, which Flask's own JSON
provider refuses. OpenRLHF retries any failure, so a body it cannot decode or that is too large
is a 422, which it does not retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.errors import BadRequest, PayloadTooLarge, ScorerError, Unprocessable
from common.protocols import Protocol
from common.wire import decode_body, encode_body
from services.code.grader import STATUSES
from services.code.scorer import CodeScorer, Graded

ROUTES = ("/reward/score", "/get_reward")


def answer(results: Sequence[Graded]) -> dict[str, Any]:
    """The OpenRLHF answer: rewards, and per-sample indicators whose means are rates."""
    rewards = [r.score for r in results]
    verdicts = [r.verdict for r in results]
    extra_logs: dict[str, list[float]] = {
        "pass_fraction": [v.passed / v.total if v.total else 0.0 for v in verdicts],
        "no_verdict": [float(v.score is None) for v in verdicts],
    }
    for status in STATUSES:
        extra_logs[status] = [float(v.status == status) for v in verdicts]
    return {
        "rewards": rewards,
        "scores": rewards,
        "extra_logs": extra_logs if verdicts else {},
        "error_types": [None if v.status == "passed" else v.status for v in verdicts],
    }


def status(error: ScorerError) -> int:
    return Unprocessable.status if isinstance(error, BadRequest | PayloadTooLarge) else error.status


def protocol(scorer: CodeScorer) -> Protocol:
    def items(payload: dict[str, Any]) -> list[Any]:
        key = "query" if "query" in payload else "outputs"
        if key not in payload:
            raise Unprocessable("body needs 'query' (prompt + response) or 'outputs' (responses), and 'prompts'")
        return scorer.samples(
            payload[key], payload.get("prompts"), payload.get("labels"), key == "query", payload.get("language")
        )

    return Protocol(
        name="openrlhf",
        routes=ROUTES,
        decode=lambda body, _content_type: decode_body(body, "json"),
        items=items,
        answer=answer,  # type: ignore[arg-type]  # the code scorer's results are Graded
        encode=lambda obj, _content_type: encode_body(obj, "json"),
        status=status,
    )
