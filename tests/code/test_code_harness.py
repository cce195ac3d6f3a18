"""The programs' harness against a running server: nothing a program can observe depends on
the expected answers, and what CPython (and the usual judges) run correctly scores 1.

Each test failed on the design before it: the job a program could read in its own memory
held how much output comparison needed (from the expected outputs' length); scoring ``all``
stopped at the first failing test; an assert's message called the program again only when
the answer was wrong; a stdin program ended with ``os._exit`` right after its last line; call
and assert programs ran as ``__main__``; results had to be exact builtin types.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from testing.code import ENV, reward
from testing.server import Server, gunicorn_server

HUMAN_EVAL = [json.loads(line) for line in gzip.open(Path(__file__).with_name("data") / "HumanEval.jsonl.gz", "rt")]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with gunicorn_server("code", ENV, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def grade_labels(server: Server, codes: list[str], labels: list[dict]) -> dict:
    fenced = [f"```python\n{code}\n```" for code in codes]
    return reward(server.url, {"outputs": fenced, "prompts": ["p"] * len(codes), "labels": labels})


# -- nothing the program can read or observe depends on the expected outputs -----------------

# Finds every value named ``keep_bytes`` in its interpreter (the job it was forked with).
FIND_KEEP = (
    "import gc\n"
    "def keep():\n"
    "    for obj in gc.get_objects():\n"
    "        found = obj.get('keep_bytes') if isinstance(obj, dict) else getattr(obj, 'keep_bytes', None)\n"
    "        if isinstance(found, int):\n"
    "            return found\n"
    "    return 0\n"
)


def test_what_is_kept_of_the_output_says_nothing_of_the_answer(server: Server) -> None:
    """The program derives the expected answer's length from ``keep_bytes`` (stdin: twice the
    longest expected output plus 64 KiB; call: four times its JSON plus 64 KiB) and answers
    YES/NO or True/False from it without reading its input. What is kept is the same whatever
    the answer, and not of the answer's length: the program answers NO (False) to both labels,
    so it passes the one that expects it and fails the other."""
    stdin = FIND_KEEP + "print('YES' if (keep() - 65536) // 2 == 3 else 'NO')"
    out = grade_labels(server, [stdin] * 2, [{"inputs": ["1"], "outputs": [answer]} for answer in ("YES", "NO")])
    assert out["rewards"] == [0.0, 1.0] and out["error_types"] == ["wrong_answer", None], out
    call = FIND_KEEP + "def f(x):\n    return (keep() - 65536) // 4 == 4\n"
    labels = [{"fn_name": "f", "inputs": [[1]], "outputs": [answer]} for answer in (True, False)]
    out = grade_labels(server, [call] * 2, labels)
    assert out["rewards"] == [0.0, 1.0] and out["error_types"] == ["wrong_answer", None], out


def test_an_assert_message_never_calls_the_program(server: Server) -> None:
    """HumanEval/95's asserts call the program a second time in their message, evaluated only
    when the first answer was wrong: the program counts its calls and tells the next test."""
    label = {"test": ["assert f(1) == 2, 'got ' + str(f(1))", "assert calls() == 1"]}
    code = "count = 0\ndef f(x):\n    global count\n    count += 1\n    return 0\ndef calls():\n    return count\n"
    out = grade_labels(server, [code], [label])
    assert out["rewards"] == [0.5], out


def test_every_assert_of_a_check_runs_whatever_the_answers(server: Server) -> None:
    """Which of check()'s calls come tells the program nothing: after a wrong answer the rest
    of its asserts still call it (the test fails all the same)."""
    check = "def check(candidate):\n" + "".join(f"    assert candidate({x}) == {2 * x}\n" for x in (1, 2, 3))
    label = {"test": [check, "assert calls() == 3"], "entry_point": "double"}
    code = "count = 0\ndef double(x):\n    global count\n    count += 1\n    return 0\ndef calls():\n    return count\n"
    out = grade_labels(
        server, [code, "count = 3\ndef double(x):\n    return 2 * x\ndef calls():\n    return 3\n"], [label] * 2
    )
    assert out["rewards"] == [0.5, 1.0], out
    assert out["error_types"] == ["wrong_answer", None], out


def test_scoring_all_runs_every_test(tmp_path) -> None:
    """With scoring ``all`` the run went on only while tests passed: which ran told the program
    which answers were right. Every test runs; the pass fraction counts them all."""
    env = {**ENV, "SCORER_CODE_SCORING": "all"}
    label = {"inputs": ["1", "2", "3"], "outputs": ["0", "2", "3"]}
    with gunicorn_server("code", env, log_dir=tmp_path) as srv:
        out = grade_labels(srv, ["print(input())", "n = input()\nprint(0 if n == '1' else n)"], [label] * 2)
    assert out["rewards"] == [0.0, 1.0], out
    assert out["extra_logs"]["pass_fraction"] == [2 / 3, 1.0], out
    assert out["error_types"] == ["wrong_answer", None], out


def test_a_check_nothing_calls_is_an_invalid_label(server: Server) -> None:
    """HumanEval's rows given without their entry point: nothing would call ``check``, and
    ``pass`` scored 1.0 on all 164. The sample scores 0 as ``invalid_label``; the others in
    the request are graded as usual."""
    labels = [{"test": row["test"], "setup": row["prompt"]} for row in HUMAN_EVAL]
    codes = [row["prompt"] + "    pass\n" for row in HUMAN_EVAL]
    out = grade_labels(server, codes, labels)
    assert out["rewards"] == [0.0] * len(HUMAN_EVAL), out
    assert set(out["error_types"]) == {"invalid_label"}
    assert out["extra_logs"]["invalid_label"] == [1.0] * len(HUMAN_EVAL)
    good = {"test": "assert f(1) == 2"}
    out = grade_labels(server, ["def f(x):\n    return 2 * x"] * 2, [good, {"test": "def check(candidate):\n    pass"}])
    assert out["rewards"] == [1.0, 0.0] and out["error_types"] == [None, "invalid_label"], out


# -- a harness as faithful as CPython ------------------------------------------------------

# Programs CPython runs correctly, each printing 42 its own way.
EXITS = {
    "thread not joined, deep recursion": (
        "import sys, threading\nsys.setrecursionlimit(1 << 20)\nthreading.stack_size(1 << 26)\n"
        "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
        "def main():\n    print(42 + depth(50000) - 50000)\nthreading.Thread(target=main).start()"
    ),
    "atexit": "import atexit\natexit.register(print, 42)",
    "os.fdopen(1)": "import os\nout = os.fdopen(1, 'w')\nout.write('42\\n')",
    "open(1)": "out = open(1, 'w')\nout.write('42\\n')",
    "TextIOWrapper": "import io, sys\nout = io.TextIOWrapper(sys.stdout.buffer)\nout.write('42\\n')",
    "__del__": "class Bye:\n    def __del__(self):\n        print(42)\nbye = Bye()",
    "exit()": "print(42)\nexit()\nprint(0)",
    "quit(0)": "print(42)\nquit(0)",
    "help": "print(42 if callable(help) and 'help' in repr(help) else 0)",
    "raise after the thread": (
        "import threading, time\ndef late():\n    time.sleep(0.2)\n    print(42)\n"
        "threading.Thread(target=late).start()\nraise SystemExit(0)"
    ),
    "pickled own function": "import pickle\ndef f():\n    return 42\nprint(pickle.loads(pickle.dumps(f))())",
    # What templates such as PyRival's FastIO read of the standard streams.
    "standard streams": (
        "import sys\n"
        "streams = (sys.stdin.mode, sys.stdout.mode, sys.stdout.name, sys.stderr.name, sys.stdout.encoding)\n"
        "same = sys.__stdout__ is sys.stdout and sys.__stdin__ is sys.stdin\n"
        "print(42 if streams == ('r', 'w', '<stdout>', '<stderr>', 'utf-8') and same else streams)"
    ),
}


@pytest.mark.parametrize("name", EXITS)
def test_stdin_programs_end_as_cpython_ends_them(server: Server, name: str) -> None:
    code = EXITS[name]
    direct = subprocess_output(code)
    assert direct.split() == ["42"], f"CPython itself prints {direct!r}"
    out = grade_labels(server, [code], [{"inputs": [""], "outputs": ["42"]}])
    assert out["rewards"] == [1.0], out


def subprocess_output(code: str) -> str:
    import subprocess

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stdout


def test_call_and_assert_programs_are_not_main(server: Server) -> None:
    """A call-based or assert program's ``if __name__ == "__main__":`` block (reading stdin)
    does not run at load, and pickle finds its functions by their module."""
    code = (
        "import pickle, sys\n"
        "def add(a, b):\n    return pickle.loads(pickle.dumps(add)).__name__ == 'add' and a + b\n"
        "if __name__ == '__main__':\n    a, b = map(int, sys.stdin.readline().split())\n    print(add(a, b))\n"
    )
    call = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}
    asserts = {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n", "entry_point": "add"}
    out = grade_labels(server, [code, code], [call, asserts])
    assert out["rewards"] == [1.0, 1.0], out


SUBCLASSES = {
    "Counter": ("from collections import Counter\ndef f():\n    return Counter('abb')", {"a": 1, "b": 2}),
    "defaultdict": (
        "from collections import defaultdict\ndef f():\n    d = defaultdict(int)\n    d['a'] += 1\n    return d",
        {"a": 1},
    ),
    "OrderedDict": ("from collections import OrderedDict\ndef f():\n    return OrderedDict(a=1)", {"a": 1}),
    "namedtuple": (
        "from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\ndef f():\n    return [Point(1, 2)]",
        [[1, 2]],
    ),
    "str subclass": ("class S(str):\n    pass\ndef f():\n    return S('ok')", "ok"),
    "int subclass": ("import enum\nclass E(enum.IntEnum):\n    A = 3\ndef f():\n    return E.A", 3),
}


@pytest.mark.parametrize("name", SUBCLASSES)
def test_builtin_subclasses_compare_as_their_plain_values(server: Server, name: str) -> None:
    code, expected = SUBCLASSES[name]
    out = grade_labels(server, [code], [{"fn_name": "f", "inputs": [[]], "outputs": [expected]}])
    assert out["rewards"] == [1.0], out


NUMPY = (
    "import numpy as np\n"
    "def f(n):\n"
    "    return np.arange(n).reshape(2, -1)\n"
    "def total(n):\n"
    "    return np.int64(n) * 2\n"
    "def dot():\n"
    "    a = np.ones((200, 200))\n"
    "    return float((a @ a).sum())\n"
)


def test_numpy_and_sortedcontainers_import_in_the_sandbox(server: Server) -> None:
    """The default ``sandbox_packages``: numpy's arrays and scalars compare as their values,
    its BLAS runs one thread, and its files come from the packages directory alone."""
    call = {"fn_name": "f", "inputs": [[4]], "outputs": [[[0, 1], [2, 3]]]}
    asserts = {"test": ["assert total(21) == 42", "assert dot() == 200 ** 3", "assert f(2) == [[0], [1]]"]}
    stdin = (
        "import os, numpy, sortedcontainers\n"
        "s = sortedcontainers.SortedList(map(int, input().split()))\n"
        "threads = [os.environ.get(v) for v in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS')]\n"
        "print(*s, threads == ['1'] * 3, numpy.__file__.startswith('/sandbox-packages/'))"
    )
    out = grade_labels(
        server, [NUMPY, NUMPY, stdin], [call, asserts, {"inputs": ["3 1 2"], "outputs": ["1 2 3 True True"]}]
    )
    assert out["rewards"] == [1.0, 1.0, 1.0], out


def test_and_or_all_any_in_asserts_call_every_operand(server: Server) -> None:
    """``f(1) == 2 and f(2) == 4`` called ``f(2)`` only when ``f(1)`` was right."""
    label = {
        "test": ["assert f(1) == 2 and f(2) == 4", "assert all(f(x) == 2 * x for x in (3, 4))", "assert calls() == 4"]
    }
    code = "count = 0\ndef f(x):\n    global count\n    count += 1\n    return 0\ndef calls():\n    return count\n"
    out = grade_labels(server, [code], [label])
    assert out["rewards"] == [1 / 3], out


def test_complex_numbers_types_and_a_function_named_check_cross(server: Server) -> None:
    """MBPP/124 passes ``1j``, MBPP/590 returns complex numbers, MBPP/533 passes ``int``, and
    MBPP/56's function is called ``check`` (the tests' process dropped it before each test)."""
    label = {
        "test": [
            "assert angle(1j) == 1j.imag",
            "assert polar(3 + 4j) == (5.0, 3 - 4j)",
            "assert drop((4, 5.5, 'a'), int) == [5.5, 'a']",
            "assert check(70) == False",
            "assert check(73) == True",
        ]
    }
    code = (
        "def angle(z):\n    return z.imag\n"
        "def polar(z):\n    return (abs(z), z.conjugate())\n"
        "def drop(items, kind):\n    return [x for x in items if not isinstance(x, kind)]\n"
        "def check(n):\n    return n % 2 == 1\n"
    )
    out = grade_labels(server, [code], [label])
    assert out["rewards"] == [1.0], out


def test_human_eval_111_returning_a_counter_passes(server: Server) -> None:
    row = HUMAN_EVAL[111]
    code = row["prompt"] + (
        "    from collections import Counter\n"
        "    counts = Counter(test.split())\n"
        "    most = max(counts.values(), default=0)\n"
        "    return Counter({k: v for k, v in counts.items() if v == most})\n"
    )
    label = {"test": row["test"], "entry_point": row["entry_point"], "setup": row["prompt"]}
    out = grade_labels(server, [code], [label])
    assert out["rewards"] == [1.0], out


@pytest.fixture
def long_integers() -> Iterator[None]:
    """This process writes integers of up to 30,000 digits in its requests."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(30_000)
    yield
    sys.set_int_max_str_digits(before)


def test_big_integers_cross_both_ways(server: Server, long_integers: None) -> None:
    """Integers past CPython's 4,300-digit default cross in labels (up to 20,000 digits, where
    parsing costs 4.5 times more a digit), answers and arguments (as hex past 4,300)."""
    big = 7**20000  # 16,902 digits
    label = {"fn_name": "power", "inputs": [[7, 20000]], "outputs": [big]}
    body = json.dumps(
        {"outputs": ["```python\ndef power(a, b):\n    return a ** b\n```"], "prompts": ["p"], "labels": [label]}
    )
    response = requests.post(server.url + "/reward/score", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text[:300]
    assert response.json()["rewards"] == [1.0]
    asserts = {"test": ["assert power(7, 20000) % 1000 == 1", "assert len(str(power(10, 60000))) == 60001",
                        "assert half(10 ** 50000) == 5 * 10 ** 49999"]}  # fmt: skip
    code = "def power(a, b):\n    return a ** b\ndef half(n):\n    return n // 2"
    assert grade_labels(server, [code], [asserts])["rewards"] == [1.0]
    too_long = {"fn_name": "power", "inputs": [[10, 20000]], "outputs": [10**20000]}  # 20,001 digits
    body = json.dumps({"outputs": ["x"], "prompts": ["p"], "labels": [too_long]})
    response = requests.post(server.url + "/reward/score", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text[:300]
    printed = grade_labels(
        server, ["print(7 ** 20000 % 1000, len(str(10 ** 60000)))"], [{"inputs": [""], "outputs": ["1 60001"]}]
    )
    assert printed["rewards"] == [1.0], printed
