"""Interactive labels: a program judged in conversation with the label's interactor (testlib's
``registerInteraction``, as Codeforces and Polygon run it), and the verdict of each test.

A label ``{"interactor": source | {"program": source, "language": "cpp" | "python"}, "tests":
[{"input": str, "answer": str}]}`` (or ``"inputs"`` and ``"answers"``): for each test, the
program and the interactor run at once in the sample's sandbox, each one's stdout the other's
stdin (``sandbox.inside.interactive_test``); the interactor alone reads the input and the answer,
and its exit is the test's verdict unless the program failed on its own first. Precedence
(Codeforces' and Kattis' alike, but for 4 and 5):

1. the interactor ended first with a rejection (testlib 1 or 2, Kattis 43): wrong answer,
   whatever the program does next (it is killed);
2. the program wrote the interactor more than its output limit (what the interactor read):
   ``output_limit`` (testlib skips blanks without end: the interactor's CPU limit, not the
   program's, would end it);
3. the interactor ended first and failed as a judge fails (its limits, testlib's ``_fail``
   (3), a Kattis validator's exit 0, which is testlib's accepted): no verdict (``judge_failure``);
4. the program failed (its time, its memory, a crash, a non-zero exit): its own status, but a
   broken pipe (SIGPIPE, Python's ``BrokenPipeError``) after the interactor ended first: the
   interactor's verdict (BAPCtools files a program writing on after acceptance accepted);
5. the interactor crashed (any other exit or signal, not at its limits): the program's wrong
   answer, logged. Only the program's early end or what it wrote can make a working
   interactor crash (a broken pipe, an unexpected end of its input, a line it cannot parse);
   Kattis and DOMjudge file any exit but 42 and 43 as the judge's error, which hands the
   program the infra-failure score (NaN) for its own mistake. A broken interactor shows as
   these warnings, and as ``judge_failure`` when it hangs, loops or calls ``_fail``;
6. otherwise the interactor's exit: 0 accepted, 1 or 2 wrong answer, 7 its points (Kattis: 42
   accepted, 43 wrong answer).

When the program's process ends, all it started ends too (interactive tests only: its pipes'
last holders), and the interactor has as much of its own time as its CPU limit to finish.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
from typing import Any

from common.limits.errors import Unprocessable
from services.code.judging.checkers import EXIT_FAIL, EXIT_OK, REJECTIONS, Checker, custom_verdict, parse_checker
from services.code.languages import Program, run_failure
from services.code.sandbox.inside.compiled_programs import ARTIFACT_DIR
from services.code.sandbox.inside.interactive_test import EXECUTABLE_FD
from services.code.sandbox.inside.messages import InteractorFiles, InteractOutcome, Job

log = logging.getLogger(__name__)

# An interactor's own word that it failed, by protocol: testlib's ``_fail``; a Kattis validator
# exiting 0 speaks testlib's protocol, not Kattis' (a label's mistake, not the program's).
OWN_FAILURES = {"testlib": (EXIT_FAIL,), "kattis": (EXIT_OK,)}
# Its tasks (threads) beyond the program's in the sample's cgroup.
TASKS = 16
MAX_TESTS = 10_000


def parse(label: dict[str, Any]) -> tuple[Checker, list[str], list[str]]:
    """An interactive label's interactor (a custom checker's program: C++ with testlib.h or
    Python), its tests' inputs and their answers (``""`` when a test has none)."""
    value = label["interactor"]
    spec = {"program": value} if isinstance(value, str) else value
    if not isinstance(spec, dict) or set(spec) - {"program", "language", "protocol"}:
        raise Unprocessable(
            "labels: 'interactor' is source code or {'program': source, 'language': 'cpp' | 'python', "
            "'protocol': 'testlib' | 'kattis'}"
        )
    protocol = spec.get("protocol", "testlib")
    if protocol not in REJECTIONS:
        raise Unprocessable(f"labels: an interactor's 'protocol' is one of {', '.join(REJECTIONS)}")
    interactor = parse_checker({"program": spec.get("program"), "language": spec.get("language", "cpp")})
    interactor = dataclasses.replace(interactor, protocol=protocol)
    if "tests" in label:
        cases = label["tests"]
        if not isinstance(cases, list) or not all(isinstance(c, dict) and "input" in c for c in cases):
            raise Unprocessable("labels: an interactive label's 'tests' are [{'input': str, 'answer': str}]")
        inputs, answers = [c["input"] for c in cases], [c.get("answer", "") for c in cases]
    else:
        inputs = label.get("inputs")
        answers = label.get("answers", [""] * len(inputs) if isinstance(inputs, list) else None)
    if not isinstance(inputs, list) or not isinstance(answers, list) or len(inputs) != len(answers):
        raise Unprocessable("labels: an interactive label needs 'tests', or 'inputs' and as many 'answers'")
    if not 0 < len(inputs) <= MAX_TESTS or not all(isinstance(t, str) for t in (*inputs, *answers)):
        raise Unprocessable(f"labels: an interactive label has 1 to {MAX_TESTS} tests of text")
    return interactor, inputs, answers


def job(run: Job, interactor: Program, protocol: str, artifact: str, cpu_s: float, memory_bytes: int) -> Job:
    """``run`` (the program's runs) turned into interactive tests with ``interactor``'s build
    (the cache entry ``artifact``), speaking ``protocol``, which gets ``cpu_s`` and
    ``memory_bytes`` of its own, and as much of its own time as ``cpu_s`` once the program
    ended. The inputs go apart (``files``): for an interactive problem the input is the secret."""
    command, executable = [], ""
    for arg in interactor.run:
        if arg.startswith(ARTIFACT_DIR + "/"):
            executable, arg = arg.removeprefix(ARTIFACT_DIR + "/"), f"/proc/self/fd/{EXECUTABLE_FD}"
        command.append(arg)
    return dataclasses.replace(
        run, kind="interact", tests=[None] * len(run.tests), interactor_command=command, interactor_protocol=protocol,
        interactor_rejections=list(REJECTIONS[protocol]),
        interactor_env=dict(interactor.env), interactor_artifact=artifact, interactor_file=executable,
        interactor_cpu_s=cpu_s, interactor_wall_s=cpu_s, interactor_memory_bytes=memory_bytes,
        cgroup_memory_bytes=run.cgroup_memory_bytes + memory_bytes, cgroup_tasks=run.cgroup_tasks + TASKS,
    )  # fmt: skip


def files(inputs: list[str], answers: list[str]) -> InteractorFiles:
    """What the sample's keeper holds for its interactor: each test's input and answer."""
    return InteractorFiles([[test, answer] for test, answer in zip(inputs, answers, strict=True)])


def verdict(run: InteractOutcome, protocol: str = "testlib") -> tuple[str, float] | None:
    """(status, points) of an interactive test by the precedence above (the interactor's exit
    read by its ``protocol``); None: no verdict."""
    try:
        reported = json.loads(run.result) if run.result else {}
    except ValueError:
        reported = {}
    if isinstance(reported, dict) and "compile_error" in reported:
        return "compile_error", 0.0
    decided = custom_verdict(run.interactor_exit, run.interactor_stopped, run.interactor_report, protocol)
    if run.interactor_first and not run.interactor_stopped and run.interactor_exit in REJECTIONS[protocol]:
        return "wrong_answer", 0.0
    if run.output_exceeded:
        return "output_limit", 0.0
    crashed = decided is None and not run.interactor_stopped and run.interactor_exit not in OWN_FAILURES[protocol]
    if run.interactor_first and decided is None and not crashed:
        return None
    failure = run_failure(run.timed_out, run.over_memory, run.exit, run.stderr)
    echo = (
        run.interactor_first and (decided is not None or crashed) and failure == "runtime_error" and _broken_pipe(run)
    )
    if failure is not None and not echo:
        return failure, 0.0
    if crashed:
        log.warning(
            "an interactor crashed after what the program wrote or its early end (its wrong answer): exit %d: %.300s",
            run.interactor_exit, run.interactor_report,
        )  # fmt: skip
        return "wrong_answer", 0.0
    return decided


def _broken_pipe(run: InteractOutcome) -> bool:
    """Whether the program ended writing to an interactor that had gone: SIGPIPE, or Python's
    ``BrokenPipeError`` (Python ignores SIGPIPE) as the last words of its stderr."""
    last = run.stderr.strip().rsplit("\n", 1)[-1]
    return run.exit == -signal.SIGPIPE or (run.exit != 0 and last.startswith("BrokenPipeError"))
