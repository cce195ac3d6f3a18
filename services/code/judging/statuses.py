"""A test's outcome into its status: the sandbox only reports what each test printed or
returned; every status is made here, from nothing the program can choose but its output."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass

from services.code.judging import comparison, kattis_default
from services.code.judging.checkers import KATTIS_DEFAULT
from services.code.labels.suites import Suite
from services.code.languages import run_failure
from services.code.sandbox.inside.messages import (
    CallOutcome,
    InteractOutcome,
    Job,
    Outcome,
    Skipped,
    StdinOutcome,
    from_plain,
)

STATUSES = (
    "passed", "wrong_answer", "runtime_error", "timeout", "memory_limit", "output_limit", "compile_error", "no_code",
    "invalid_label", "sandbox_error", "language_unavailable", "judge_failure", "prompt_not_found", "deadline",
    "cancelled",
)  # fmt: skip
# How much of the kept output (``compared_output_bytes``) an expected output may need: a
# program's stdout may pad each line (twice), a call's answer tags tuples, sets and dicts
# (four times its JSON). A label that needs more could never pass: an invalid label.
KEEP_FACTOR = {"stdin": 2, "call": 4}
LONG_OUTPUT = "an expected output longer than compared_output_bytes allows"
# A stdin test whose program exited cleanly, for the label's custom checker to judge. What
# a sample's tests printed waits for it in this process (``HELD_OUTPUT_FACTOR``), then goes to
# the checker's sandbox as one job.
UNCHECKED = "unchecked"
# What a call-based or assert test that failed before an answer or a report gets.
FAILURES = {
    "compile_error": "compile_error", "timeout": "timeout", "output_exceeded": "output_limit",
    "memory_limit": "memory_limit",
}  # fmt: skip
# An assert test's report names the exception that ended it.
ASSERT_ERRORS = {"AssertionError": "wrong_answer", "MemoryError": "memory_limit"}


@dataclass(frozen=True)
class Verdict:
    status: str
    passed: int
    total: int
    # None: no verdict (the service's infra_failure_score applies).
    score: float | None
    # The wall seconds its tests had (its limits, or its plan when the node was shared); None: not run.
    budget_s: float | None = None


def judge(suite: Suite, run: Outcome, tolerance: float) -> str:
    """The status of test ``run.index`` from what the sandbox reported (a test the sample's
    time did not reach: ``timeout``, its own time spent)."""
    if isinstance(run, Skipped):
        return "timeout"
    if isinstance(run, CallOutcome):
        return _judge_call(suite, run, tolerance)
    try:
        reported = json.loads(run.result) if run.result else {}
    except ValueError:
        reported = {}
    if isinstance(reported, dict) and "compile_error" in reported:
        return "compile_error"
    failure = run_failure(run.timed_out, run.over_memory, run.exit, run.stderr, run.output_exceeded)
    if failure is not None:
        return failure
    if run.stdout_truncated:
        return "wrong_answer"
    checker, want = suite.checker, suite.expected[run.index]
    if checker.mode == "custom":
        return UNCHECKED
    if checker.mode == KATTIS_DEFAULT:
        matched = kattis_default.matches(run.stdout, want, checker.case_sensitive, checker.abs_tol, checker.rel_tol)
        return "passed" if matched else "wrong_answer"
    abs_tol, rel_tol = (tolerance, tolerance) if checker.mode == "default" else (checker.abs_tol, checker.rel_tol)
    return "passed" if comparison.output_matches(checker.mode, run.stdout, want, abs_tol, rel_tol) else "wrong_answer"


def cut_short(run: Outcome, job: Job) -> bool:
    """Whether the sample's time, not the test's own limits, ended test ``run.index``: it was
    never reached, or it was stopped under its CPU and wall limits."""
    if isinstance(run, Skipped):
        return True
    if not isinstance(run, (StdinOutcome, InteractOutcome)) or not run.timed_out:
        return False
    return not (run.exit == -signal.SIGXCPU or run.cpu_s > job.cpu_s or run.wall_s >= job.wall_s)


def _judge_call(suite: Suite, run: CallOutcome, tolerance: float) -> str:
    """A call-based test from the candidate's answer (plain data), compared here; an assert
    test from the tests' process's report, never from anything the candidate sent."""
    failure = run.failure
    if failure is not None:
        return FAILURES.get(failure) or ("memory_limit" if "MemoryError" in run.stderr else "runtime_error")
    if suite.kind == "assert":
        report = run.report or {}
        return "passed" if report.get("passed") is True else ASSERT_ERRORS.get(report.get("error"), "runtime_error")
    try:
        answer = from_plain(run.answer or "")
    except (ValueError, TypeError, RecursionError):
        return "runtime_error"
    if isinstance(answer, list) and len(answer) == 2 and answer[0] == "result":
        return (
            "passed" if comparison.result_matches(answer[1], suite.expected[run.index], tolerance) else "wrong_answer"
        )
    return "memory_limit" if isinstance(answer, list) and answer[1:2] == ["MemoryError"] else "runtime_error"


def too_long(suite: Suite, kept: int) -> bool:
    """Whether an expected output of ``suite`` needs more than ``kept`` bytes of a program's
    output to be matched (``KEEP_FACTOR``): no program could pass it."""
    if suite.interactor is not None:  # its answers are the interactor's, never compared here
        return False
    if suite.kind == "stdin":
        longest = max(len(want.encode()) for want in suite.expected)
    elif suite.kind == "call":
        longest = max(len(json.dumps(want, default=str)) for want in suite.expected)
    else:  # assert tests: the label's code compares in the tests' process
        return False
    return KEEP_FACTOR[suite.kind] * longest > kept


def answers_needed(suite: Suite) -> int:
    """How much of a call-based sample's answers its label's expected outputs could need (each
    as its answer line, ``KEEP_FACTOR`` times): the server holds them until the sample ends."""
    if suite.kind != "call":
        return 0
    return KEEP_FACTOR["call"] * sum(len(json.dumps(["result", want], default=str)) for want in suite.expected)
