"""flow_grpo's GenEval client (``flow_grpo/rewards.py`` ``geneval_score``) on the core's routes.

Its pickle ``{"images": [JPEG bytes], "meta_datas": [GenEval metadata], "only_strict": bool}``
becomes the core's request (each metadata's prompt, ``metadata["geneval"]``,
``metadata["geneval_only_strict"]``); a core request passes as it is. Every answer has the
core's lists (``scores``, ``outputs``, and per image ``rewards``, ``strict_rewards``, ``tag``,
``details``) and the reward server's per-tag lists ``group_rewards`` and
``group_strict_rewards`` (-10.0 where a sample has another tag). A bad request is a 4xx, never
the 500 that client retries a thousand times.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.limits.errors import Unprocessable
from common.pipeline.scorer import Query, Result, Samples, Scored
from common.server.protocols import WireProtocol
from services.geneval.rules import group_lists
from services.geneval.scorer import METADATA_KEY, ONLY_STRICT_KEY

FLOW_GRPO_KEYS = {"images", "meta_datas", "only_strict"}


def core_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """flow_grpo's GenEval request as the core's."""
    unknown = set(payload) - FLOW_GRPO_KEYS
    if unknown:
        raise Unprocessable(f"a request with 'meta_datas' (flow_grpo's) has no {sorted(map(str, unknown))}")
    metadatas = payload["meta_datas"]
    if not isinstance(metadatas, (list, tuple)):
        raise Unprocessable("'meta_datas' must be a list of GenEval metadata dicts, one per image")
    images = payload.get("images")
    if isinstance(images, (list, tuple)) and len(images) != len(metadatas):
        raise Unprocessable(f"{len(images)} images but {len(metadatas)} 'meta_datas'; need one per image")
    prompts = [m.get("prompt", "") if isinstance(m, dict) else "" for m in metadatas]
    if not all(isinstance(prompt, str) for prompt in prompts):
        raise Unprocessable("a 'meta_datas' entry's 'prompt' must be a string")
    return {
        "images": images,
        "prompts": prompts,
        "metadata": {METADATA_KEY: metadatas, ONLY_STRICT_KEY: payload.get("only_strict", False)},
    }


class GenEvalProtocol(WireProtocol):
    """The core protocol's routes, taking flow_grpo's GenEval request too."""

    name = "geneval"
    routes = ("/", "/score")

    def items(self, payload: dict[str, Any], query: Query) -> list[Any] | Samples:
        if "meta_datas" in payload:
            payload = core_payload(payload)
        return super().items(payload, query)

    def answer(self, results: Sequence[Result]) -> dict[str, Any]:
        out = super().answer(results)
        tags = [r.extras["tag"] for r in results if isinstance(r, Scored)]
        out["group_rewards"] = group_lists(tags, out.get("rewards", []))
        out["group_strict_rewards"] = group_lists(tags, out.get("strict_rewards", []))
        return out
