"""OpenRLHF's remote reward protocol: ``POST /reward/score`` and ``/get_reward``
(docs/ARCHITECTURE.md §5.2).

Request JSON ``{"query" | "outputs": [str], "prompts": [str], "labels": [any]}``; answer
``{"rewards", "scores", "extra_logs", "error_types"}``, one entry per sample in each list
(every ``extra_logs`` value too: OpenRLHF logs each list's mean). Always JSON, encoded by
``common.sdk.wire`` as the core's JSON twin is: NaN as the JSON constant, which Flask's own JSON
provider refuses. OpenRLHF retries any failure, so a body it cannot decode or that is too large
is a 422, which it does not retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.configuration.config import env_name
from common.limits.errors import BadRequest, PayloadTooLarge, ScorerError, Unprocessable
from common.pipeline.scorer import Query, Result
from common.sdk.wire import JsonCap, decode_body, encode_body
from common.server.protocols import WireProtocol
from services.code.judging.statuses import STATUSES
from services.code.scorer import SECTION, CodeScorer, Graded


class OpenRLHFProtocol(WireProtocol):
    """``--reward.remote_url``: OpenRLHF's reward model client posts here."""

    name = "openrlhf"
    routes = ("/reward/score", "/get_reward")
    scorer: CodeScorer

    def __init__(self, scorer: CodeScorer) -> None:
        super().__init__(scorer)
        # Its labels carry the tests: a cap of its own, sized for the largest legitimate ones.
        self.json_cap = JsonCap(scorer.settings.max_json_values, env_name(SECTION, "max_json_values"))

    def parse(self, body: bytes, content_type: str | None) -> dict[str, Any]:
        return decode_body(body, "json", self.json_cap)

    def items(self, payload: dict[str, Any], query: Query = ()) -> list[Any]:
        key = "query" if "query" in payload else "outputs"
        if key not in payload:
            raise Unprocessable("body needs 'query' (prompt + response) or 'outputs' (responses), and 'prompts'")
        return self.scorer.samples(
            payload[key], payload.get("prompts"), payload.get("labels"), key == "query", payload.get("language")
        )

    def answer(self, results: Sequence[Result]) -> dict[str, Any]:
        """The OpenRLHF answer: rewards, and per-sample indicators whose means are rates."""
        graded = [r for r in results if isinstance(r, Graded)]
        assert len(graded) == len(results), "the code scorer answers Graded results"
        rewards = [r.score for r in graded]
        verdicts = [r.verdict for r in graded]
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

    def encode(self, answer: dict[str, Any], content_type: str | None) -> tuple[bytes, str]:
        return encode_body(answer, "json")

    def status(self, error: ScorerError, content_type: str | None) -> int:
        """OpenRLHF retries any failure: a body it cannot decode or that is too large is a 422."""
        return Unprocessable.status if isinstance(error, BadRequest | PayloadTooLarge) else error.status
