"""From a sample to a verdict: its admission and plan, its slot and deadline, the one re-run,
its tests judged (``judging.statuses``) and checked (``checker_runs``), and its score."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from common.limits.deadlines import Deadline
from common.pipeline import metrics
from services.code.grading import checker_runs, modes, trials
from services.code.grading.build_step import built
from services.code.grading.checker_runs import JudgeFailure
from services.code.grading.runner import Owner, Runner
from services.code.grading.trials import RunCall, Trial
from services.code.judging.statuses import (
    LONG_OUTPUT,
    Verdict,
    answers_needed,
    cut_short,
    too_long,
)
from services.code.labels.suites import Suite
from services.code.languages import LANGUAGES, PYTHON, Program
from services.code.sandbox.compile_cache import Builds
from services.code.sandbox.host import RESERVE_FROM_SLOTS, Sandbox, SandboxFailure
from services.code.sandbox.inside.messages import Job, Outcome, StdinOutcome
from services.code.scheduling.admission import Admission, Admitted, Cost, Rates, floor_shown
from services.code.scheduling.cancelling import Cancellation, Cancelled, HangUps
from services.code.settings import CodeSettings

log = logging.getLogger(__name__)

MASK_BLOCK = 100
MASK_WARN_ABOVE = 5


class Replan(Exception):
    """A sample's plan ran out, and the node's floor for it now, or what its own tests that ended
    showed (``floor_shown``), is more than that plan: it is run once more, planned at least
    ``needed_s`` (``Grader._run``)."""

    def __init__(self, needed_s: float) -> None:
        super().__init__(f"a code sample's plan was short: it needs {needed_s:.1f} s")
        self.needed_s = needed_s


@dataclass(frozen=True)
class Attempt:
    """One try at a sample: by ``deadline``, in ``owner``'s turn at the slots, as the ``index``-th
    of its request's ``admitted`` samples (``None``: admission off), planned at least ``needed_s``
    (its re-run; 0 at first), stopped once ``cancellation`` is."""

    deadline: float
    owner: Owner
    admitted: Admitted | None
    index: int
    needed_s: float
    cancellation: Cancellation


@dataclass(frozen=True)
class Sample:
    """One sample to grade. ``suite`` is ``None`` when its prompt could not be located."""

    code: str
    suite: Suite | None
    language: str = PYTHON


class Grader:
    """Grades samples with at most ``settings.parallel`` runs at once, by the request's deadline
    (the core's, from when the request arrived; ``timeout_s`` from now outside a request).

    Slots are shared between clients in turn (``FairSlots``): each request runs its samples on
    threads of its own, at most ``settings.parallel``, and a client's requests wait in one line,
    so no client waits behind another's queue.
    """

    def __init__(
        self, settings: CodeSettings, sandbox: Sandbox, timeout_s: float, builds: Builds | None = None
    ) -> None:
        self.settings = settings
        self.sandbox = sandbox
        self.timeout_s = timeout_s
        self.builds = builds
        self.runner = Runner(settings, sandbox, builds)
        slots = settings.parallel - (settings.parallel >= RESERVE_FROM_SLOTS)  # what one client may hold
        self.rates = Rates()
        self.admission = Admission(slots)
        self.cancelled = 0  # samples whose client went away before they were graded
        self.hang_ups = HangUps()
        self._mask_lock = threading.Lock()
        self._block_seen = 0
        self._block_masked = 0

    def grade(
        self,
        samples: Sequence[Sample],
        by: Deadline | None = None,
        client: str = "",
        gone: Callable[[], bool] = lambda: False,
    ) -> list[Verdict]:
        """Verdicts in order, ``by`` the request's deadline, in ``client``'s turn at the slots;
        never raises for what a sample's code does. Once ``gone()`` (the client hung up, looked
        at every ``HANG_UP_POLL_S``), the samples not yet graded are not run and those running
        are stopped (``cancelling``): "cancelled", no verdict."""
        deadline = (by or Deadline(self.timeout_s)).expires
        owner = (client, object())  # this request's place in its client's turn at the slots
        with self._admitted(samples, deadline, client) as admitted, self.hang_ups.watching(gone) as cancellation:

            def one(index: int) -> Verdict:
                try:
                    if gone():
                        cancellation.cancel()
                    return self.grade_one(samples[index], deadline, owner, admitted, index, cancellation)
                except Cancelled:
                    with self._mask_lock:
                        self.cancelled += 1
                    return Verdict("cancelled", 0, 0, None)
                finally:
                    if admitted is not None:
                        admitted.done(index)

            if len(samples) == 1:
                verdicts = [one(0)]
            else:
                with ThreadPoolExecutor(min(len(samples), self.settings.parallel), "code-grade") as pool:
                    verdicts = list(pool.map(one, range(len(samples))))
        self._count_masked(verdicts)
        invalid = [s.suite for s, v in zip(samples, verdicts, strict=True) if v.status == "invalid_label"]
        if invalid and invalid[0] is not None:
            reason = invalid[0].invalid or LONG_OUTPUT
            log.warning("%d code sample(s) scored 0 for an invalid label; one: %s", len(invalid), reason)
        return verdicts

    @contextlib.contextmanager
    def _admitted(self, samples: Sequence[Sample], deadline: float, client: str) -> Iterator[Admitted | None]:
        """The request's samples admitted at the node's measured rate (``admission``; 413 / 503
        when they do not fit), or ``None`` with admission off."""
        if self.settings.admission == "off":
            yield None
            return
        with self.admission.admit(client, [self.cost(sample) for sample in samples], deadline) as admitted:
            yield admitted

    def cost(self, sample: Sample) -> Cost:
        """What ``sample`` costs in slot seconds: its tests (and build) at the measured rate,
        and at its limits (its sample's wall time, its build and its label's checker)."""
        suite = sample.suite
        if suite is None or suite.invalid or not sample.code:
            return Cost(self.rates, sample.language, 0, 0.0)
        s = self.settings
        # A sample's tests may take their own wall limits each and more wall time under load: its
        # own time bounds it (``Job.sample_s``).
        worst = self.runner.own_sample_s(suite, sample.language)
        compiled = sample.language != PYTHON
        worst += s.compile_cpu_s if compiled else 0.0
        if suite.checker.mode == "custom":
            worst += checker_runs.check_reserve(self.runner, suite)
            worst += s.compile_cpu_s if suite.checker.language != PYTHON else 0.0
        elif suite.interactor is not None:
            worst += s.compile_cpu_s if suite.interactor.language != PYTHON else 0.0
        return Cost(self.rates, sample.language, len(suite.tests), worst, compiled)

    def grade_one(
        self,
        sample: Sample,
        deadline: float,
        owner: Owner,
        admitted: Admitted | None = None,
        index: int = 0,
        cancellation: Cancellation | None = None,
    ) -> Verdict:
        """``sample``'s verdict, re-run once after a ``SandboxFailure``; raises ``Cancelled``
        once ``cancellation`` is (never re-run: its init was killed on purpose)."""
        cancellation = cancellation or Cancellation()
        if cancellation.cancelled:
            raise Cancelled()
        if sample.suite is None:
            return Verdict("prompt_not_found", 0, 0, None)
        total = len(sample.suite.tests)
        if sample.suite.invalid or too_long(sample.suite, self.runner.kept_bytes()):
            return Verdict("invalid_label", 0, total, 0.0)
        if not sample.code:
            return Verdict("no_code", 0, total, 0.0)
        failures, needed_s = 0, 0.0
        while True:
            try:
                attempt = Attempt(deadline, owner, admitted, index, needed_s, cancellation)
                if sample.language != PYTHON:
                    return self._run_built(sample, attempt)
                return self._run(sample.suite, sample.code, attempt)
            except Replan as replan:
                needed_s = replan.needed_s
            except SandboxFailure as exc:
                failures += 1
                log.warning("code sandbox failed a run (attempt %d): %s", failures, exc)
                if failures > 1 or deadline - time.monotonic() <= self.settings.retry_pause_s + 1.0:
                    return Verdict("sandbox_error", 0, total, None)
                time.sleep(self.settings.retry_pause_s)

    def _run_built(self, sample: Sample, attempt: Attempt) -> Verdict:
        """A program in a compiled language: its build (once per source, ``sandbox.compile_cache``),
        then its tests, each running the build."""
        suite = sample.suite
        assert suite is not None
        total = len(suite.tests)
        language = LANGUAGES[sample.language]
        if self.builds is None or self.builds.missing(language):
            return Verdict("language_unavailable", 0, total, None)
        program = self.builds.program(language, sample.code, self.settings.memory_mb)
        started = time.monotonic()
        with built(self.runner, program, attempt.deadline, attempt.owner) as error:
            self.rates.measured(sample.language, 0.0, 0, time.monotonic() - started)
            if error is not None:
                return Verdict("compile_error", 0, total, 0.0)
            return self._run(suite, sample.code, attempt, program)

    def _run(self, suite: Suite, code: str, attempt: Attempt, program: Program | None = None) -> Verdict:
        """The sample's tests in one slot, within its plan (at least ``needed_s`` on its re-run),
        each outcome handed to its test mode (``modes``). Raises ``Replan``, once, when the plan
        ran out before its tests did and the node's floor for it now, or what its tests that ended
        on their own showed, is more: the plan was the node's estimate running behind (a burst's
        first wave, a problem heavier than its language's mean), not the program's own spending.
        A spinner's tests never end on their own: it is never re-run; one that spins after quick
        tests is re-run once, within its limits, and counted as it runs."""
        language = program.language.name if program else PYTHON
        deadline, admitted = attempt.deadline, attempt.admitted
        with contextlib.ExitStack() as stack:
            uid = stack.enter_context(self.runner.slot(attempt.owner, deadline))
            slot_taken = time.monotonic()
            plan = admitted.started(attempt.index, attempt.needed_s) if admitted is not None else math.inf
            # A label's checker is built, and its time kept, before the program runs: whatever
            # time the program spends, its outputs are checked in this slot (a verdict, not NaN).
            by = suite.interactor or suite.checker  # the label's checker or interactor
            try:
                checker = stack.enter_context(checker_runs.checker_built(self.runner, by, deadline, attempt.owner, uid))
            except JudgeFailure as exc:
                log.warning("a label's checker failed a code sample (no verdict): %s", exc)
                return Verdict("judge_failure", 0, len(suite.tests), None)
            mode = modes.mode_of(suite, self.runner, self.settings.float_tolerance, checker)
            runs_by = deadline - mode.reserve_s
            now = time.monotonic()
            if runs_by <= now:
                raise SandboxFailure("no time left before the request deadline for the program and its checker")
            # The sample's own time: its limits, and its plan (``admission``) where that is less.
            own_s = self.runner.own_sample_s(suite, language)
            job = self.runner.job(suite, code, runs_by, language, plan)
            # A sample the request's deadline ends before its own time ran late through no choice
            # of its program: a test cut short is no verdict, never its timeout. One that ran to its
            # plan spent it (with admission off, it may have spent the deadline itself): its timeout.
            deadline_cuts = self.settings.admission != "off" and runs_by < now + min(own_s, plan)
            if program is not None:
                assert self.builds is not None
                job = self.builds.run_job(program, job, self.runner.cgroups())
            job, trusted = mode.prepared(job)
            # Every test runs, whatever the scoring: which ran must not tell the program
            # which of its answers were right.
            runs = self.sandbox.run(job, uid, trusted, answers_needed(suite), attempt.cancellation)
            try:
                cut, plan_cut = self._taken(mode, runs, job, deadline_cuts, plan < own_s)
                if cut:
                    log.warning(
                        "the request's deadline cut a code sample's test short (no verdict): a node behind its plan"
                    )
                    return Verdict("deadline", 0, len(suite.tests), None, job.sample_s)
                # Measured before the sample is judged: a cut sample's floor then counts what it showed.
                slot_s = time.monotonic() - slot_taken
                self._measure(language, slot_s, mode.statuses)
                if plan_cut and not attempt.needed_s and admitted is not None:
                    ended = sum(status != "timeout" for status in mode.statuses)
                    needed = max(admitted.floor(attempt.index), floor_shown(slot_s, len(mode.statuses), ended))
                    if needed > plan:
                        raise Replan(needed)
                points = mode.points(deadline, uid)
            except JudgeFailure as exc:
                log.warning("a label's %s failed a code sample (no verdict): %s", mode.judged_by, exc)
                return Verdict("judge_failure", 0, len(suite.tests), None)
        return self._score(suite, mode.statuses, points, job.sample_s)

    @staticmethod
    def _taken(
        mode: modes.Judged, runs: Iterator[Outcome], job: Job, deadline_cuts: bool, plan_short: bool
    ) -> tuple[bool, bool]:
        """Each run's outcome handed to ``mode``, but a test cut short where the request's
        deadline cuts the sample (no verdict, ``deadline_cuts``); whether a test was cut so, and
        whether one the plan's end stopped (the node's time, not its own limits: ``plan_short``)."""
        cut = plan_cut = False
        try:
            for run in runs:
                if cut_short(run, job):
                    cut = cut or deadline_cuts
                    plan_cut = plan_cut or plan_short
                    if deadline_cuts:
                        continue
                mode.take(run)
        finally:
            runs.close()
        return cut, plan_cut

    def _measure(self, language: str, slot_s: float, statuses: list[str]) -> None:
        """What a test costs here, from the tests that ended on their own: a sample cut short
        after some (a heavy program at its plan) counts one more; one whose tests all timed out
        (a spinner) counts none, so spinners never raise anyone's floor."""
        ended = sum(status != "timeout" for status in statuses)
        if ended:
            self.rates.measured(language, slot_s, ended + (ended < len(statuses)))

    def _score(self, suite: Suite, statuses: list[str], points: list[float], budget_s: float) -> Verdict:
        """The sample's verdict by its label's scoring (else the server's): the fraction of the
        tests' points, all or nothing, or subtasks (a group's points when all its tests pass)."""
        passed = statuses.count("passed")
        status = next((st for st in statuses if st != "passed"), "passed")
        scoring = suite.scoring or self.settings.scoring
        if scoring == "all":
            score = float(status == "passed")
        elif scoring == "subtasks":
            total = sum(group.points for group in suite.subtasks)
            score = sum(group.points * min(points[i] for i in group.tests) for group in suite.subtasks) / total
        else:
            score = sum(points) / len(points)
        return Verdict(status, passed, len(statuses), score, budget_s)

    def admission_stats(self) -> dict[str, object]:
        """What ``/info`` shows of admission: the work admitted, and the rates it plans with."""
        return {**self.admission.stats(), "cancelled": self.cancelled, "rates": self.rates.stats()}

    def time_limits(self) -> dict[str, dict[str, float]]:
        """Per language graded programs may be written in, each test's CPU and wall limits."""
        return self.runner.time_limits()

    def trial(self, code: str, language: str = PYTHON, inputs: Sequence[str] = ("",)) -> list[StdinOutcome]:
        """``trials.trial`` within this grader's ``timeout_s``: for the startup checks and the benches."""
        return trials.trial(self.runner, self.timeout_s, code, language, inputs)

    def run_once(self, call: RunCall, gone: Callable[[], bool] = lambda: False) -> Trial:
        """``trials.run_once`` admitted beside this grader's samples: SandboxFusion's ``/run_code``;
        raises ``Cancelled`` once ``gone()`` (its client hung up: the run is stopped)."""
        admission = self.admission if self.settings.admission != "off" else None
        with self.hang_ups.watching(gone) as cancellation:
            return trials.run_once(self.runner, admission, self.rates, call, cancellation)

    def _count_masked(self, verdicts: Sequence[Verdict]) -> None:
        """Warn per sample left without a verdict, and when more than 5 of 100 were."""
        for verdict in verdicts:
            if verdict.score is None:
                metrics.UNSCORED.labels("code", verdict.status).inc()
                log.warning(
                    "code sample left without a verdict (%s): scored %s",
                    verdict.status, self.settings.infra_failure_score,
                )  # fmt: skip
        with self._mask_lock:
            for verdict in verdicts:
                self._block_seen += 1
                self._block_masked += verdict.score is None
                if self._block_seen == MASK_BLOCK:
                    if self._block_masked > MASK_WARN_ABOVE:
                        log.warning(
                            "%d of the last %d code samples got no verdict (infra_failure_score=%s); check the sandbox",
                            self._block_masked, MASK_BLOCK, self.settings.infra_failure_score,
                        )  # fmt: skip
                    self._block_seen = self._block_masked = 0
