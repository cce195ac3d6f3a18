"""flow_grpo's Qwen-VL aesthetic judge's reply rule (``extract_scores`` in
``flow_grpo/qwenvl.py``) restated on its own, for the agreement tests where no copy of that file
is at hand (CI): the first ``<Score>`` tag of whole digits over 5, a reply without one 0, no
bound on the value. It imports nothing of ours; ``tests/judge/test_judge_flow_grpo.py`` checks
it against the file itself when ``SCORER_TEST_FLOW_GRPO_QWENVL`` names a copy."""

from __future__ import annotations

import re


def extract_scores(output_text: list[str]) -> list[float]:
    """Each reply's score as flow_grpo reads it."""
    scores: list[float] = []
    for text in output_text:
        match = re.search(r"<Score>(\d+)</Score>", text)
        scores.append(float(match.group(1)) / 5 if match else 0)
    return scores
