"""The import block a dataset's harness runs before a Python program (a label's ``prelude``),
against the running server: what it lets a program use without imports, and what it must not
change (the program's line numbers and ``from __future__``, its own definitions, which function
a call reaches)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from services.code.preludes import PRELUDES
from testing.server import Server, gunicorn_server

ENV = {
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    "SCORER_CODE_TEST_CPU_S": "2",
    "SCORER_CODE_TEST_WALL_S": "4",
    "SCORER_CODE_SAMPLE_WALL_S": "40",
    "SCORER_CODE_MEMORY_MB": "256",
}
# A LeetCode answer as the datasets hold them: no imports (LeetCode's environment has them).
NO_IMPORTS = """
class Solution:
    def solve(self, nums: List[int], k: int) -> List[int]:
        counts = defaultdict(int, Counter(nums))
        heap = []
        for value, count in counts.items():
            heappush(heap, (-count, value))

        @lru_cache(maxsize=None)
        def best(i: int) -> float:
            return -inf if i < 0 else heap[0][0]

        assert best(0) < 0 and bisect_left([1, 2], 2) == 1
        return sorted(value for _, value in nsmallest(k, heap))
"""
CALLS = {"fn_name": "solve", "inputs": [[[1, 1, 2, 2, 2, 3], 2], [[5], 1]], "outputs": [[1, 2], [5]]}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with gunicorn_server("code", ENV, threads=16, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def score(url: str, programs: list[str], label: dict) -> dict:
    body = {"outputs": [f"```python\n{p}\n```" for p in programs], "prompts": ["p"] * len(programs)}
    response = requests.post(url + "/reward/score", json={**body, "labels": [label] * len(programs)}, timeout=300)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def test_a_leetcode_program_without_imports_passes_by_default(server: Server) -> None:
    out = score(server.url, [NO_IMPORTS], CALLS)
    assert out["rewards"] == [1.0], out
    assert score(server.url, [NO_IMPORTS], {**CALLS, "prelude": "none"})["rewards"] == [0.0]


def test_a_label_names_the_prelude_of_a_stdin_program(server: Server) -> None:
    program = "words = input().split()\nprint(Counter(words).most_common(1)[0][0], int(np.int64(len(words))))"
    label = {"inputs": ["a b a\n"], "outputs": ["a 3\n"]}
    out = score(server.url, [program], label)  # a contest judge's way: none
    assert out["rewards"] == [0.0] and out["error_types"] == ["runtime_error"], out
    assert score(server.url, [program], {**label, "prelude": "apps"})["rewards"] == [1.0]
    assert score(server.url, [program], {**label, "prelude": "taco"})["rewards"] == [1.0]


def test_the_prelude_changes_no_line_number_and_no_definition_of_the_program(server: Server) -> None:
    programs = [
        "from __future__ import annotations\nimport sys\nprint(sys._getframe().f_lineno)",
        "def gcd(a, b):\n    return 3\nprint(gcd(2, 3))",
        "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
        "    print(traceback.extract_tb(e.__traceback__)[0].lineno)",
    ]
    out = score(server.url, programs, {"inputs": [""], "outputs": ["3\n"], "prelude": "lcb"})
    assert out["rewards"] == [1.0, 1.0, 1.0], out


def test_a_call_reaches_only_the_programs_own_function(server: Server) -> None:
    """The prelude's ``gcd`` (math's) is no answer of the program's; a ``Solution.count`` is
    called, not itertools' ``count`` the prelude bound."""
    gcd = {"fn_name": "gcd", "inputs": [[12, 18], [7, 5]], "outputs": [6, 1]}
    out = score(server.url, ["x = 1", "def gcd(a, b):\n    return a if b == 0 else gcd(b, a % b)"], gcd)
    assert out["rewards"] == [0.0, 1.0], out
    count = {"fn_name": "count", "inputs": [[[1, 2, 3]]], "outputs": [3]}
    out = score(server.url, ["class Solution:\n    def count(self, xs):\n        return len(xs)"], count)
    assert out["rewards"] == [1.0], out


def test_assert_tests_get_the_prelude_their_label_names(server: Server) -> None:
    label = {"test": "assert root(17) == 4", "entry_point": "root"}
    program = "def root(n):\n    return isqrt(n)"
    assert score(server.url, [program], label)["rewards"] == [0.0]  # HumanEval's harness has none
    assert score(server.url, [program], {**label, "prelude": "lcb"})["rewards"] == [1.0]


def test_an_unknown_prelude_is_a_422(server: Server) -> None:
    for bad in ("numpy", ["lcb"], 1):
        body = {"outputs": ["x"], "prompts": ["p"], "labels": [{**CALLS, "prelude": bad}]}
        response = requests.post(server.url + "/reward/score", json=body, timeout=30)
        assert response.status_code == 422 and "prelude" in response.text, (bad, response.text[:200])


# Runs the prelude itself and says which names its candidate's namespace binds otherwise than
# that run does: the standard streams and ``argv`` its process made, ``exit`` as a fresh
# ``python3`` has it, and whatever the prelude's statements after its imports did.
SAME_AS_RUN = """
import sys as _sys

_ran = {{}}
exec(compile({prelude!r}, "<prelude>", "exec"), _ran)


def differs():
    found = globals()
    names = set(_ran) - {{"__builtins__"}}
    return sorted(n for n in names if n not in found or found[n] is not _ran[n]) + [_sys.getrecursionlimit()]
"""


@pytest.mark.parametrize("name", sorted(PRELUDES))
def test_each_prelude_binds_what_running_it_in_the_candidate_binds(server: Server, name: str) -> None:
    """The zygote runs a prelude's imports once for every candidate (``program.prepare_preludes``):
    each name it binds is the object running the prelude in the candidate binds, the standard
    streams, ``argv`` and ``exit`` included, and its ``sys.setrecursionlimit`` holds."""
    limit = 50000 if name == "lcb" else 1000
    label = {"fn_name": "differs", "inputs": [[]], "outputs": [[limit]], "prelude": name}
    out = score(server.url, [SAME_AS_RUN.format(prelude=PRELUDES[name])], label)
    assert out["rewards"] == [1.0], out
