"""OpenRLHF's remote reward protocol (DESIGN 2.2): ``POST /reward/score`` and ``/get_reward``.

Request JSON ``{"query" | "outputs": [str], "prompts": [str], "labels": [any]}``; answer
``{"rewards", "scores", "extra_logs", "error_types"}``, one entry per sample in each list
(every ``extra_logs`` value too: OpenRLHF logs each list's mean). NaN is written as the JSON
constant, which Flask's own JSON provider refuses.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, current_app

from common.app import read_body
from common.errors import BadRequest, PayloadTooLarge, Unprocessable
from common.protocol import decode_body
from services.code.grader import STATUSES, Verdict

if TYPE_CHECKING:
    from services.code.scorer import CodeScorer

ROUTES = ("/reward/score", "/get_reward")


def answer(scorer: CodeScorer, verdicts: list[Verdict]) -> dict[str, Any]:
    """The OpenRLHF answer: rewards, and per-sample indicators whose means are rates."""
    rewards = [scorer.reward(v) for v in verdicts]
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


def blueprint(scorer: CodeScorer) -> Blueprint:
    bp = Blueprint("openrlhf", __name__)

    def reward_view() -> Response:
        try:
            payload = decode_body(read_body(scorer.core.max_body_bytes), "json")
        except (BadRequest, PayloadTooLarge) as exc:
            # OpenRLHF retries any failure; DESIGN 2.2 answers every malformed or oversized body 422.
            raise Unprocessable(exc.message) from None
        key = "query" if "query" in payload else "outputs"
        if key not in payload:
            raise Unprocessable("body needs 'query' (prompt + response) or 'outputs' (responses), and 'prompts'")
        samples = scorer.samples(payload[key], payload.get("prompts"), payload.get("labels"), from_query=key == "query")
        current_app.extensions["scorer_runtime"].wait_ready()
        body = json.dumps(answer(scorer, scorer.grade(samples)), allow_nan=True)
        return Response(body, mimetype="application/json")

    for rule in ROUTES:
        bp.add_url_rule(rule, endpoint=rule.strip("/").replace("/", "_"), view_func=reward_view, methods=["POST"])
    return bp
