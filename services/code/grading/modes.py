"""How a sample's tests are judged, one strategy per mode (``mode_of``), so that the grader's
loop over a sample's runs (``Grader._taken``) only hands each outcome to its mode:

- ``Judged``: stdin, call-based and assert tests, each outcome judged in the service as it
  arrives (``judging.statuses``); an assert label's code goes to the tests' process alone;
- ``CheckedAfter``: stdin tests a label's custom checker judges, run on the held outputs once
  the program exited, in the sample's slot, its time kept from the program's;
- ``Interactive``: the program beside the label's interactor, whose exit is each test's
  verdict and points (``judging.interactor``).
"""

from __future__ import annotations

import logging

from services.code.grading import checker_runs
from services.code.grading.checker_runs import JudgeFailure
from services.code.grading.runner import Runner
from services.code.judging import interactor
from services.code.judging.statuses import UNCHECKED, judge
from services.code.labels.suites import Suite
from services.code.languages import Program
from services.code.sandbox.host import HELD_OUTPUT_FACTOR
from services.code.sandbox.inside.messages import (
    InteractorFiles,
    InteractOutcome,
    Job,
    Outcome,
    StdinOutcome,
    TrustedTests,
)

log = logging.getLogger(__name__)


class Judged:
    """Stdin, call-based and assert tests: each outcome judged in the service as it arrives."""

    judged_by = "checker"  # what failed when the mode raises ``JudgeFailure``: the label's ...
    reserve_s = 0.0  # the time kept from the program's for the mode's step after its runs

    def __init__(self, suite: Suite, tolerance: float) -> None:
        self.suite = suite
        self.tolerance = tolerance
        self.statuses = ["timeout"] * len(suite.tests)  # a test that never reported ran out of time

    def prepared(self, job: Job) -> tuple[Job, TrustedTests | InteractorFiles | None]:
        """The sample's job as this mode runs it, and what only the trusted side is given: an
        assert label's code, for the tests' process alone."""
        if self.suite.kind != "assert":
            return job, None
        suite = self.suite
        return job, TrustedTests(tests=list(suite.tests), setup=suite.setup, entry_point=suite.entry_point)

    def take(self, run: Outcome) -> None:
        """One test's outcome, as the sandbox streams it. Raises ``JudgeFailure``."""
        self.statuses[run.index] = judged(self.suite, run, self.tolerance)

    def points(self, deadline: float, uid: int) -> list[float]:
        """Each test's points once every run ended (``statuses`` final). Raises ``JudgeFailure``."""
        return [float(status == "passed") for status in self.statuses]


class CheckedAfter(Judged):
    """Stdin tests a label's custom checker judges: each output held (at most
    ``HELD_OUTPUT_FACTOR`` times what is kept of one, in all; beyond, ``output_limit``), then the
    checker run on them in a sandbox of its own once the program exited."""

    def __init__(self, suite: Suite, tolerance: float, runner: Runner, checker: Program) -> None:
        super().__init__(suite, tolerance)
        self.runner = runner
        self.checker = checker
        self.reserve_s = checker_runs.check_reserve(runner, suite)
        self.outputs: dict[int, str] = {}  # what the checker judges
        self.held = 0  # characters of output waiting for the checker

    def take(self, run: Outcome) -> None:
        super().take(run)
        if self.statuses[run.index] == UNCHECKED:
            assert isinstance(run, StdinOutcome)
            self.held += len(run.stdout)
            if self.held > HELD_OUTPUT_FACTOR * self.runner.kept_bytes():
                self.statuses[run.index] = "output_limit"
            else:
                self.outputs[run.index] = run.stdout

    def points(self, deadline: float, uid: int) -> list[float]:
        points = super().points(deadline, uid)
        if self.outputs:
            checked = checker_runs.check(self.runner, self.suite, self.checker, self.outputs, deadline, uid)
            for index, (status, got) in checked.items():
                self.statuses[index], points[index] = status, got
        return points


class Interactive(Judged):
    """Interactive tests: the program and the label's interactor run at once, joined by pipes;
    the interactor alone is given the tests' inputs and answers, and its exit is each test's
    verdict and points."""

    judged_by = "interactor"

    def __init__(self, suite: Suite, tolerance: float, runner: Runner, program: Program) -> None:
        super().__init__(suite, tolerance)
        assert suite.interactor is not None and runner.builds is not None
        self.declared = suite.interactor
        self.runner = runner
        self.program = program
        self.got: dict[int, float] = {}  # the points of each test the interactor judged

    def prepared(self, job: Job) -> tuple[Job, TrustedTests | InteractorFiles | None]:
        assert self.runner.builds is not None
        cpu_s = checker_runs.interactor_cpu_s(self.runner, self.declared)
        entry, memory = self.runner.builds.cache.entry(self.program.key), self.runner.settings.memory_mb << 20
        job = interactor.job(job, self.program, self.declared.protocol, entry, cpu_s, memory)
        return job, interactor.files(self.suite.tests, self.suite.expected)

    def take(self, run: Outcome) -> None:
        if not isinstance(run, InteractOutcome):
            super().take(run)
            return
        found = interactor.verdict(run, self.declared.protocol)
        if found is None:
            raise JudgeFailure(f"exit {run.interactor_exit}: {run.interactor_report:.300}")
        self.statuses[run.index], self.got[run.index] = found

    def points(self, deadline: float, uid: int) -> list[float]:
        return [self.got.get(index, float(status == "passed")) for index, status in enumerate(self.statuses)]


def mode_of(suite: Suite, runner: Runner, tolerance: float, checker: Program | None) -> Judged:
    """The mode ``suite``'s tests are judged in, given its label's checker or interactor as built
    (``checker_runs.checker_built``: None when the label has neither)."""
    if checker is None:
        return Judged(suite, tolerance)
    if suite.interactor is not None:
        return Interactive(suite, tolerance, runner, checker)
    return CheckedAfter(suite, tolerance, runner, checker)


def judged(suite: Suite, run: Outcome, tolerance: float) -> str:
    """``judge``, where whatever the program's output makes fail stays its own verdict."""
    try:
        return judge(suite, run, tolerance)
    except Exception as exc:  # e.g. RecursionError on deeply nested output
        log.warning("judging a code test failed (%s: %.200s); judged a runtime error", type(exc).__name__, exc)
        return "runtime_error"
