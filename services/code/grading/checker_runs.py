"""A label's custom checker or interactor: built before the program runs, its time kept from
the program's, and the checker run on what each test printed in a sandbox of its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from services.code.grading.build_step import built
from services.code.grading.runner import Owner, Runner
from services.code.judging import checkers
from services.code.judging.checkers import Checker
from services.code.labels.suites import Suite
from services.code.languages import CHECKER_LANGUAGES, LANGUAGES, Program
from services.code.sandbox.inside.messages import StdinOutcome

# What a label's checker is given to start, beyond its tests' wall limits (``check_reserve``).
CHECK_START_S = 1.0


class JudgeFailure(Exception):
    """A label's custom checker failed (did not build, crashed, hung, flooded, exit 3): the
    sample gets no verdict."""


@contextlib.contextmanager
def checker_built(
    runner: Runner, checker: Checker, deadline: float, owner: Owner, uid: int
) -> Iterator[Program | None]:
    """The label's custom checker or interactor (None without one), built in the slot
    ``uid`` and held in the compile cache while the sample runs. Raises ``JudgeFailure``."""
    if checker.mode != "custom":
        yield None
        return
    if runner.builds is None:
        raise JudgeFailure("this server builds no programs")
    language = LANGUAGES[CHECKER_LANGUAGES[checker.language]]
    if runner.builds.missing(language):
        raise JudgeFailure(f"the checker's toolchain is missing ({', '.join(runner.builds.missing(language))})")
    program = runner.builds.program(language, checker.program, runner.settings.memory_mb)
    with built(runner, program, deadline, owner, uid, judge=True) as error:
        if error is not None:
            raise JudgeFailure(f"the checker does not compile: {error[:300]}")
        yield program


def interactor_cpu_s(runner: Runner, interactor: Checker) -> float:
    """An interactor's CPU limit per test: a test's, in its language's scale."""
    return runner.scale(LANGUAGES[CHECKER_LANGUAGES[interactor.language]].name).of(runner.settings.test_cpu_s)


def check_reserve(runner: Runner, suite: Suite) -> float:
    """The time the label's checker may take on every test's output at its CPU limit (its
    language's, each: a checker that sleeps is the label's failure), and a second for its
    start: kept from the program's."""
    language = LANGUAGES[CHECKER_LANGUAGES[suite.checker.language]].name
    return runner.scale(language).of(runner.settings.test_cpu_s) * len(suite.tests) + CHECK_START_S


def check(
    runner: Runner, suite: Suite, checker: Program, outputs: dict[int, str], deadline: float, uid: int
) -> dict[int, tuple[str, float]]:
    """The label's custom checker on each test's output, in a sandbox of its own (the
    program has exited) in the sample's slot, as its protocol runs it. Raises
    ``JudgeFailure``."""
    assert runner.builds is not None
    order = sorted(outputs)
    files = [[str(suite.tests[i]), outputs[i], str(suite.expected[i])] for i in order]
    job = runner.job(Suite("stdin", [""] * len(order), [""]), "", deadline, checker.language.name)
    job = runner.builds.check_job(checker, job, files, runner.cgroups(), suite.checker.protocol)
    found: dict[int, tuple[str, float]] = {}
    runs = runner.sandbox.run(job, uid)
    try:
        for run in runs:
            if not isinstance(run, StdinOutcome):
                raise JudgeFailure("the checker ran out of time")
            verdict = checkers.custom_verdict(
                run.exit, run.timed_out or run.output_exceeded, run.stderr or run.stdout, suite.checker.protocol
            )
            if verdict is None:
                raise JudgeFailure(f"the checker exited {run.exit}: {(run.stderr or run.stdout)[:300]}")
            found[order[run.index]] = verdict
    finally:
        runs.close()
    if len(found) != len(order):
        raise JudgeFailure("the checker's runs ended early")
    return found
