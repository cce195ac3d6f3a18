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
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
HUMAN_EVAL = HERE.parents[1] / "tests" / "code" / "data" / "HumanEval.jsonl.gz"
# The server the corpus is graded by: the shipped limits, a few runs at once (2 shared cores
# would otherwise turn the wall limit into verdicts).
SERVER_ENV = {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan", "SCORER_CODE_MAX_PARALLEL": "4"}


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


def grade(url: str, items: Sequence[Item]) -> list[tuple[float, str | None]]:
    """Our verifier's (reward, error type) for each item, in one ``/reward/score`` request."""
    body = {
        "outputs": [f"```python\n{item.code}\n```" for item in items],
        "prompts": ["p"] * len(items),
        "labels": [item.label for item in items],
    }
    response = requests.post(url + "/reward/score", json=body, timeout=600)
    response.raise_for_status()
    out = response.json()
    return list(zip(out["rewards"], out["error_types"], strict=True))


# Every item the two harnesses grade differently today (on main at 2629f24), with its cause.
EXIT = "our harness: exit()/quit() missing (python -S)"
MODE = "our harness: sys.stdin/sys.stdout have no .mode (FastIO template)"
MODE_THREAD = MODE + "; then threading.Thread(target=main).start() without join() (os._exit)"
ATEXIT = "our harness: output printed by an atexit handler is lost (os._exit)"
LOAD = "load: ~3 s of CPU per test judged by a 10 s wall limit on 2 shared cores (item 2: CPU time)"
COUNTER = "our harness: Counter/defaultdict results are not plain data"
COMPLEX = "our harness: complex numbers do not cross"
CHECK = "our harness: the program's own check() is popped before each test"
BUILTIN = "our harness: a program function shadowing a builtin (sum) is not used by the tests"
OBJECTS = "our harness: instances of the program's classes cannot cross (setup or arguments)"
TYPE_ARG = "our harness: a type (int) as an argument is not plain data"
KNOWN_DISAGREEMENTS: dict[str, str] = {
    **{
        f"CodeContests/{name}": EXIT
        for name in [
            "913_b_christmas_spruce_7977",
            "371_b_fox_dividing_cheese_352",
            "104_c_cthulhu_10214",
            "1169_b_pairs_11885",
            "156_d_clues_3678",
            "80_e_beavermuncher0xff_11410",
            "334_b_eight_point_sets_7016",
            "886_f_symmetric_projections_6728",
            "889_d_symmetric_projections_6832",
            "1151_b_dima_and_a_bad_xor_6990",
            "627_a_xor_equation_4011",
            "793_d_presents_in_bankopolis_2144",
            "1016_d_vasya_and_the_matrix_3445",
            "460_d_little_victor_and_set_2650",
        ]
    },
    **{
        f"CodeContests/{name}": MODE
        for name in [
            "1249_b1_books_exchange_easy_version_7099",
            "1076_e_vasya_and_a_tree_11985",
            "1453_e_dog_snacks_5757",
            "1468_f_full_turn_7213",
            "1303_e_erase_subsequences_10330",
            "597_c_subsequences_6091",
            "289_e_polo_the_penguin_and_xor_operation_6598",
            "397_c_on_number_of_decompositions_into_multipliers_6811",
            "1442_c_graph_transpositions_9085",
            "95_c_volleyball_8708",
            "96_d_volleyball_6419",
        ]
    },
    **{
        f"CodeContests/{name}": MODE_THREAD
        for name in ["893_e_counting_arrays_6936", "1336_a_linova_and_kingdom_8768", "1499_e_chaotic_merge_7526"]
    },
    "CodeContests/938_e_max_history_10478": ATEXIT,
    "CodeContests/61_e_enemy_is_weak_2240": ATEXIT,
    "CodeContests/1278_f_cards_5019": LOAD,
    **{f"MBPP/{n}": COUNTER for n in (40, 88, 653, 902)},
    **{f"MBPP/{n}": COMPLEX for n in (124, 590)},
    **{f"MBPP/{n}": CHECK for n in (56, 349, 899, 967)},
    "MBPP/126": BUILTIN,
    **{f"MBPP/{n}": OBJECTS for n in (367, 927, 601)},
    "MBPP/533": TYPE_ARG,
}
# Verdicts that depend on the machine's load rather than on either harness: 1278_f needs ~3 s
# of CPU per test (our 10 s wall limit), MBPP/123 ~2.5 s (human-eval's 3 s wall limit).
LOAD_DEPENDENT = {"CodeContests/1278_f_cards_5019", "MBPP/123"}
