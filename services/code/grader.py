# Over 400 lines: its split waits for the interactive problems being added to it (issue 27 item 4).
"""From a sample to a verdict: slots, deadlines, the one re-run, and per-test judging.

The sandbox only reports what each test printed or returned; every verdict is made here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from common.cpus import usable_cpus
from common.deadlines import Deadline
from services.code import checkers, compare, interactive, kattis_default
from services.code.admission import Admission, Cost
from services.code.checkers import KATTIS_DEFAULT, Checker
from services.code.compile_cache import Builds
from services.code.labels import Suite
from services.code.languages import (
    CHECKER_LANGUAGES,
    LANGUAGES,
    OUT_OF_MEMORY,
    PYTHON,
    Program,
    TimeScale,
    time_scales,
)
from services.code.preludes import prelude
from services.code.sandbox.host import HELD_OUTPUT_FACTOR, RESERVE_FROM_SLOTS, Sandbox, SandboxFailure
from services.code.sandbox.inside.messages import (
    CallOutcome,
    Fetched,
    InteractorFiles,
    InteractOutcome,
    Job,
    Outcome,
    Skipped,
    StdinOutcome,
    TrustedTests,
    from_plain,
)
from services.code.settings import SUPERVISOR_MB, CodeSettings

log = logging.getLogger(__name__)

STATUSES = (
    "passed", "wrong_answer", "runtime_error", "timeout", "memory_limit", "output_limit", "compile_error", "no_code",
    "invalid_label", "sandbox_error", "language_unavailable", "judge_failure", "prompt_not_found", "deadline",
)  # fmt: skip
MASK_BLOCK = 100
MASK_WARN_ABOVE = 5
# How much of the kept output (``compared_output_bytes``) an expected output may need: a
# program's stdout may pad each line (twice), a call's answer tags tuples, sets and dicts
# (four times its JSON). A label that needs more could never pass: an invalid label.
KEEP_FACTOR = {"stdin": 2, "call": 4}
LONG_OUTPUT = "an expected output longer than compared_output_bytes allows"
# A sample's cgroup holds its supervisor (the sample's init) too: these tasks (it, a clean-up
# helper, the tests' process) besides the program's, and ``SUPERVISOR_MB`` of memory.
SUPERVISOR_TASKS = 4


@dataclass(frozen=True)
class Sample:
    """One sample to grade. ``suite`` is ``None`` when its prompt could not be located."""

    code: str
    suite: Suite | None
    language: str = PYTHON


@dataclass(frozen=True)
class RunLimits:
    """What a client asks of one run (``Grader.run_once``); the server's own limits cap each.
    ``files`` are placed under its ``/tmp`` (path -> base64), ``fetch`` read back after it."""

    cpu_s: float
    wall_s: float
    memory_mb: int
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    fetch: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trial:
    """One unjudged run (``Grader.run_once``): the build's compile error and how long getting
    the build took (a cached one: its wait), for a compiled language; the run, when it built."""

    compile_error: str | None
    compile_s: float | None
    run: StdinOutcome | None
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # fetched: path -> base64


@dataclass(frozen=True)
class Verdict:
    status: str
    passed: int
    total: int
    # None: no verdict (the service's infra_failure_score applies).
    score: float | None


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
    if run.timed_out:
        return "timeout"
    if run.output_exceeded:
        return "output_limit"
    if run.over_memory:
        return "memory_limit"
    if run.exit != 0:
        return "memory_limit" if any(sign in run.stderr for sign in OUT_OF_MEMORY) else "runtime_error"
    if run.stdout_truncated:
        return "wrong_answer"
    checker, want = suite.checker, suite.expected[run.index]
    if checker.mode == "custom":
        return UNCHECKED
    if checker.mode == KATTIS_DEFAULT:
        matched = kattis_default.matches(run.stdout, want, checker.case_sensitive, checker.abs_tol, checker.rel_tol)
        return "passed" if matched else "wrong_answer"
    abs_tol, rel_tol = (tolerance, tolerance) if checker.mode == "default" else (checker.abs_tol, checker.rel_tol)
    return "passed" if compare.output_matches(checker.mode, run.stdout, want, abs_tol, rel_tol) else "wrong_answer"


def cut_short(run: Outcome, job: Job) -> bool:
    """Whether the sample's time, not the test's own limits, ended test ``run.index``: it was
    never reached, or it was stopped under its CPU and wall limits."""
    if isinstance(run, Skipped):
        return True
    if not isinstance(run, (StdinOutcome, InteractOutcome)) or not run.timed_out:
        return False
    return not (run.exit == -signal.SIGXCPU or run.cpu_s > job.cpu_s or run.wall_s >= job.wall_s)


# A stdin test whose program exited cleanly, for the label's custom checker to judge. What
# a sample's tests printed waits for it in this process (``HELD_OUTPUT_FACTOR``), then goes to
# the checker's sandbox as one job.
UNCHECKED = "unchecked"


class JudgeFailure(Exception):
    """A label's custom checker failed (did not build, crashed, hung, flooded, exit 3): the
    sample gets no verdict."""


# What a label's checker is given to start, beyond its tests' wall limits (``_check_reserve``).
CHECK_START_S = 1.0


# What a call-based or assert test that failed before an answer or a report gets.
FAILURES = {
    "compile_error": "compile_error", "timeout": "timeout", "output_exceeded": "output_limit",
    "memory_limit": "memory_limit",
}  # fmt: skip
# An assert test's report names the exception that ended it.
ASSERT_ERRORS = {"AssertionError": "wrong_answer", "MemoryError": "memory_limit"}


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
        return "passed" if compare.result_matches(answer[1], suite.expected[run.index], tolerance) else "wrong_answer"
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


class Grader:
    """Grades samples with at most ``settings.parallel`` runs at once, by the request's deadline
    (the core's, from when the request arrived; ``timeout_s`` from now outside a request).

    Slots are shared between requests in turn (``FairSlots``): each request runs its samples
    on threads of its own, at most ``settings.parallel``, so none waits behind another's queue.
    """

    def __init__(
        self, settings: CodeSettings, sandbox: Sandbox, timeout_s: float, builds: Builds | None = None
    ) -> None:
        self.settings = settings
        self.sandbox = sandbox
        self.timeout_s = timeout_s
        self.builds = builds
        self.time_scales = time_scales(settings.time_scales)
        slots = settings.parallel - (settings.parallel >= RESERVE_FROM_SLOTS)  # what one request may hold
        limits = "SCORER_CODE_TEST_CPU_S / _TEST_WALL_S / _SAMPLE_WALL_S"
        self.admission = Admission(usable_cpus(), slots, limits)
        self._mask_lock = threading.Lock()
        self._block_seen = 0
        self._block_masked = 0

    def grade(self, samples: Sequence[Sample], by: Deadline | None = None) -> list[Verdict]:
        """Verdicts in order, ``by`` the request's deadline; never raises for what a sample's code does."""
        deadline = (by or Deadline(self.timeout_s)).expires
        request = object()  # this request's place in the round-robin of slots
        with self._admitted(samples, deadline) as done:

            def one(index: int) -> Verdict:
                try:
                    return self.grade_one(samples[index], deadline, request)
                finally:
                    done(index)

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
    def _admitted(self, samples: Sequence[Sample], deadline: float) -> Iterator[Callable[[int], None]]:
        """The request's samples admitted at their full limits (``admission``; 413 / 503 when
        they do not fit): yields what gives a sample's cost back as it ends."""
        if self.settings.admission == "off":
            yield lambda index: None
            return
        with self.admission.admit([self.cost(sample) for sample in samples], deadline) as admitted:
            yield admitted.done

    def cost(self, sample: Sample) -> Cost:
        """What ``sample`` may take at its limits: its build, its tests (no more than its sample's
        wall time; CPU no more than that on every core) and its label's checker."""
        suite = sample.suite
        if suite is None or suite.invalid or not sample.code:
            return Cost(0.0, 0.0)
        s = self.settings
        scale = self._scale(sample.language)
        tests = len(suite.tests)
        own = self._own_sample_s(suite, sample.language)
        cpu = min(tests * scale.of(s.test_cpu_s), own * self.admission.cores)
        slot = min(tests * scale.of(s.test_wall_s), own)
        if sample.language != PYTHON:
            cpu, slot = cpu + s.compile_cpu_s, slot + s.compile_cpu_s
        if suite.checker.mode == "custom":
            reserve = self._check_reserve(suite) + (s.compile_cpu_s if suite.checker.language != PYTHON else 0.0)
            cpu, slot = cpu + reserve, slot + reserve
        elif suite.interactor is not None:  # beside its program, on its own CPU
            build = s.compile_cpu_s if suite.interactor.language != PYTHON else 0.0
            cpu, slot = cpu + tests * self._interactor_cpu_s(suite.interactor) + build, slot + build
        return Cost(cpu, slot)

    def grade_one(self, sample: Sample, deadline: float, request: object) -> Verdict:
        if sample.suite is None:
            return Verdict("prompt_not_found", 0, 0, None)
        total = len(sample.suite.tests)
        if sample.suite.invalid or too_long(sample.suite, self._kept_bytes()):
            return Verdict("invalid_label", 0, total, 0.0)
        if not sample.code:
            return Verdict("no_code", 0, total, 0.0)
        for attempt in range(2):
            try:
                if sample.language != PYTHON:
                    return self._run_built(sample, deadline, request)
                return self._run(sample.suite, sample.code, deadline, request)
            except SandboxFailure as exc:
                log.warning("code sandbox failed a run (attempt %d): %s", attempt + 1, exc)
                if attempt == 0 and deadline - time.monotonic() > self.settings.retry_pause_s + 1.0:
                    time.sleep(self.settings.retry_pause_s)
                    continue
        return Verdict("sandbox_error", 0, total, None)

    def _run_built(self, sample: Sample, deadline: float, request: object) -> Verdict:
        """A program in a compiled language: its build (once per source, ``compile_cache``),
        then its tests, each running the build."""
        suite = sample.suite
        assert suite is not None
        total = len(suite.tests)
        language = LANGUAGES[sample.language]
        if self.builds is None or self.builds.missing(language):
            return Verdict("language_unavailable", 0, total, None)
        program = self.builds.program(language, sample.code, self.settings.memory_mb)
        with self._built(program, deadline, request) as error:
            if error is not None:
                return Verdict("compile_error", 0, total, 0.0)
            return self._run(suite, sample.code, deadline, request, program)

    @contextlib.contextmanager
    def _built(
        self, program: Program, deadline: float, request: object, uid: int | None = None
    ) -> Iterator[str | None]:
        """``program``'s build held in the compile cache (built if it is not there, in the slot
        ``uid`` when the caller holds one, else in one of its own): yields its compile error, or None."""
        builds = self.builds
        assert builds is not None

        def build_in(slot: int) -> str | None:
            job = builds.build_job(program, self._job(Suite("stdin", [""], [""]), "", deadline), self._cgroups())
            runs = self.sandbox.run(job, slot)
            try:
                return builds.compile_error(next(runs, None))
            finally:
                runs.close()

        def build() -> str | None:
            if uid is not None:
                return build_in(uid)
            with self._slot(request, deadline) as slot:
                return build_in(slot)

        with builds.cache.held(program.key, build, deadline - time.monotonic()) as error:
            yield error

    def _cgroups(self) -> bool:
        return bool(self.sandbox.cgroups.version)

    def _run(
        self, suite: Suite, code: str, deadline: float, request: object, program: Program | None = None
    ) -> Verdict:
        statuses = ["timeout"] * len(suite.tests)
        outputs: dict[int, str] = {}  # what the custom checker judges
        cut = False
        with contextlib.ExitStack() as stack:
            uid = stack.enter_context(self._slot(request, deadline))
            # A label's checker is built, and its time kept, before the program runs: whatever
            # time the program spends, its outputs are checked in this slot (a verdict, not NaN).
            try:
                checker = stack.enter_context(self._checker(suite.interactor or suite.checker, deadline, request, uid))
            except JudgeFailure as exc:
                log.warning("a label's checker failed a code sample (no verdict): %s", exc)
                return Verdict("judge_failure", 0, len(statuses), None)
            checks_after = checker is not None and suite.interactor is None
            runs_by = deadline - (self._check_reserve(suite) if checks_after else 0.0)
            if runs_by <= time.monotonic():
                raise SandboxFailure("no time left before the request deadline for the program and its checker")
            language = program.language.name if program else PYTHON
            job = self._job(suite, code, runs_by, language)
            # Admitted at its limits, a sample the request's deadline ends before its own time
            # ran late through no choice of its program: a test cut short is no verdict, never
            # its timeout. Not admitted so, the program may have spent that time: its timeout.
            deadline_cuts = self.settings.admission == "limits" and job.sample_s < self._own_sample_s(suite, language)
            if program is not None:
                assert self.builds is not None
                job = self.builds.run_job(program, job, self._cgroups())
            trusted: TrustedTests | InteractorFiles | None = self._trusted(suite)
            if suite.interactor is not None:
                assert checker is not None and self.builds is not None
                cpu_s, memory = self._interactor_cpu_s(suite.interactor), self.settings.memory_mb << 20
                protocol, entry = suite.interactor.protocol, self.builds.cache.entry(checker.key)
                job = interactive.job(job, checker, protocol, entry, cpu_s, memory)
                trusted, checker = interactive.files(suite.tests, suite.expected), None
            # Every test runs, whatever the scoring: which ran must not tell the program
            # which of its answers were right.
            runs = self.sandbox.run(job, uid, trusted, held_bytes=answers_needed(suite))
            interacted: dict[int, float] = {}  # the points of each interactive test
            try:
                held = 0  # characters of output waiting for the checker
                for run in runs:
                    if deadline_cuts and cut_short(run, job):
                        cut = True
                        continue
                    if isinstance(run, InteractOutcome):
                        assert suite.interactor is not None
                        found = interactive.verdict(run, suite.interactor.protocol)
                        if found is None:
                            log.warning("a label's interactor failed a code sample (no verdict): exit %d: %.300s",
                                        run.interactor_exit, run.interactor_report)  # fmt: skip
                            return Verdict("judge_failure", 0, len(statuses), None)
                        statuses[run.index], interacted[run.index] = found
                        continue
                    statuses[run.index] = self._judge(suite, run)
                    if statuses[run.index] == UNCHECKED:
                        assert isinstance(run, StdinOutcome)
                        held += len(run.stdout)
                        if held > HELD_OUTPUT_FACTOR * self._kept_bytes():
                            statuses[run.index] = "output_limit"
                        else:
                            outputs[run.index] = run.stdout
            finally:
                runs.close()
            if cut:
                log.warning(
                    "the request's deadline cut a code sample's test short (no verdict): a node behind its plan"
                )
                return Verdict("deadline", 0, len(statuses), None)
            points = [interacted.get(index, float(status == "passed")) for index, status in enumerate(statuses)]
            if outputs:
                assert checker is not None
                try:
                    for index, (status, got) in self._check(suite, checker, outputs, deadline, uid).items():
                        statuses[index], points[index] = status, got
                except JudgeFailure as exc:
                    log.warning("a label's checker failed a code sample (no verdict): %s", exc)
                    return Verdict("judge_failure", 0, len(statuses), None)
        return self._score(suite, statuses, points)

    def _score(self, suite: Suite, statuses: list[str], points: list[float]) -> Verdict:
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
        return Verdict(status, passed, len(statuses), score)

    @contextlib.contextmanager
    def _checker(self, checker: Checker, deadline: float, request: object, uid: int) -> Iterator[Program | None]:
        """The label's custom checker or interactor (None without one), built in the slot
        ``uid`` and held in the compile cache while the sample runs. Raises ``JudgeFailure``."""
        if checker.mode != "custom":
            yield None
            return
        if self.builds is None:
            raise JudgeFailure("this server builds no programs")
        language = LANGUAGES[CHECKER_LANGUAGES[checker.language]]
        if self.builds.missing(language):
            raise JudgeFailure(f"the checker's toolchain is missing ({', '.join(self.builds.missing(language))})")
        program = self.builds.program(language, checker.program, self.settings.memory_mb)
        with self._built(program, deadline, request, uid) as error:
            if error is not None:
                raise JudgeFailure(f"the checker does not compile: {error[:300]}")
            yield program

    def _interactor_cpu_s(self, interactor: Checker) -> float:
        """An interactor's CPU limit per test: a test's, in its language's scale."""
        return self._scale(LANGUAGES[CHECKER_LANGUAGES[interactor.language]].name).of(self.settings.test_cpu_s)

    def _check_reserve(self, suite: Suite) -> float:
        """The time the label's checker may take on every test's output at its CPU limit (its
        language's, each: a checker that sleeps is the label's failure), and a second for its
        start: kept from the program's."""
        language = LANGUAGES[CHECKER_LANGUAGES[suite.checker.language]].name
        return self._scale(language).of(self.settings.test_cpu_s) * len(suite.tests) + CHECK_START_S

    def _check(
        self, suite: Suite, checker: Program, outputs: dict[int, str], deadline: float, uid: int
    ) -> dict[int, tuple[str, float]]:
        """The label's custom checker on each test's output, in a sandbox of its own (the
        program has exited) in the sample's slot, as its protocol runs it. Raises
        ``JudgeFailure``."""
        assert self.builds is not None
        order = sorted(outputs)
        files = [[str(suite.tests[i]), outputs[i], str(suite.expected[i])] for i in order]
        job = self._job(Suite("stdin", [""] * len(order), [""]), "", deadline, checker.language.name)
        job = self.builds.check_job(checker, job, files, self._cgroups(), suite.checker.protocol)
        found: dict[int, tuple[str, float]] = {}
        runs = self.sandbox.run(job, uid)
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

    def _job(self, suite: Suite, code: str, deadline: float, language: str = PYTHON) -> Job:
        """What the sandbox gets to run ``code`` in ``language`` against ``suite`` (never the
        expected outputs), each test's time limits scaled for its language."""
        s = self.settings
        scale = self._scale(language)
        sample_s = self._own_sample_s(suite, language)
        cgroups = self.sandbox.cgroups
        return Job(
            kind=suite.kind, code=code, fn_name=suite.fn_name, prelude=prelude(suite.prelude or s.prelude, suite.kind),
            # Assert tests hold the expected values: they go to the tests' process only (``_trusted``).
            tests=[None] * len(suite.tests) if suite.kind == "assert" else list(suite.tests),
            cpu_s=scale.of(s.test_cpu_s), wall_s=scale.of(s.test_wall_s),
            sample_s=max(0.1, min(sample_s, deadline - time.monotonic())),
            memory_bytes=s.memory_mb << 20, judged_memory_bytes=s.memory_mb << 20, nofile=s.max_open_files,
            # The rlimit counts a uid's threads too: with a cgroup, the cgroup's task limit decides.
            nproc=s.max_threads if cgroups.version else s.max_processes,
            fsize=s.max_file_bytes, output_bytes=s.max_output_bytes, tmp_bytes=s.tmp_mb << 20,
            # The same for every sample: nothing the program can read depends on its answers.
            keep_bytes=self._kept_bytes(),
            cgroup_version=cgroups.version,
            cgroup_memory_bytes=(s.memory_mb + s.tmp_mb + SUPERVISOR_MB) << 20,
            cgroup_tasks=s.max_threads + SUPERVISOR_TASKS,
        )  # fmt: skip

    def _own_sample_s(self, suite: Suite, language: str) -> float:
        """The sample's own wall time: it scales too, its seconds once per test (each pays a start)."""
        scale = self._scale(language)
        return self.settings.sample_wall_s * scale.factor + scale.offset_s * len(suite.tests)

    @staticmethod
    def _trusted(suite: Suite) -> TrustedTests | None:
        """An assert label's code, for the tests' process alone."""
        if suite.kind != "assert":
            return None
        return TrustedTests(tests=list(suite.tests), setup=suite.setup, entry_point=suite.entry_point)

    def _kept_bytes(self) -> int:
        """How much of a stdin test's stdout or a call's answer is kept for comparison."""
        return min(self.settings.compared_output_bytes, self.settings.max_output_bytes)

    def time_limits(self) -> dict[str, dict[str, float]]:
        """Per language graded programs may be written in, each test's CPU and wall limits."""
        names = [PYTHON, *(name for name in LANGUAGES if name not in CHECKER_LANGUAGES.values())]
        s = self.settings
        return {name: {"cpu_s": self._scale(name).of(s.test_cpu_s), "wall_s": self._scale(name).of(s.test_wall_s)}
                for name in names}  # fmt: skip

    def _scale(self, language: str) -> TimeScale:
        return self.time_scales.get(language, TimeScale())

    def trial(self, code: str, language: str = PYTHON, inputs: Sequence[str] = ("",)) -> list[StdinOutcome]:
        """What a run of ``code`` in ``language`` (built first when it is compiled) on each of
        ``inputs`` reported, unjudged: for the startup checks and the benches."""
        deadline = time.monotonic() + self.timeout_s
        request = object()
        job = self._job(Suite("stdin", list(inputs), [""] * len(inputs)), code, deadline, language)
        job = dataclasses.replace(job, keep_bytes=self.settings.max_output_bytes)
        if language == PYTHON:
            return self._trial_runs(job, request, deadline)
        assert self.builds is not None
        program = self.builds.program(LANGUAGES[language], code, self.settings.memory_mb)
        with self._built(program, deadline, request) as error:
            if error is not None:
                raise SandboxFailure(f"a trial program does not build: {error[:300]}")
            return self._trial_runs(self.builds.run_job(program, job, self._cgroups()), request, deadline)

    def run_once(
        self, code: str, language: str, stdin: str, limits: RunLimits, deadline: float, request: object
    ) -> Trial:
        """One run of ``code`` on ``stdin`` (built first, through the compile cache, when
        compiled), unjudged, within ``limits`` (never more than the server's), by ``deadline``,
        in a slot lent to ``request``: SandboxFusion's ``/run_code``. Raises ``SandboxFailure``."""
        s = self.settings
        memory_mb = min(limits.memory_mb, s.memory_mb)
        less = (s.memory_mb - memory_mb) << 20
        job = self._job(Suite("stdin", [stdin], [""]), code, deadline, language)
        job = dataclasses.replace(
            job, cpu_s=min(job.cpu_s, limits.cpu_s), wall_s=min(job.wall_s, limits.wall_s),
            keep_bytes=s.max_output_bytes, memory_bytes=job.memory_bytes - less,
            judged_memory_bytes=job.judged_memory_bytes - less, cgroup_memory_bytes=job.cgroup_memory_bytes - less,
            files=limits.files, fetch=list(limits.fetch), fetch_bytes=s.run_code_file_bytes,
        )  # fmt: skip
        build_s = 0.0 if language == PYTHON else s.compile_cpu_s
        with self._admitted_run(Cost(job.cpu_s + build_s, job.wall_s + build_s), deadline):
            if language == PYTHON:
                return self._run_once(job, request, deadline, None)
            assert self.builds is not None
            program = self.builds.program(LANGUAGES[language], code, memory_mb)
            started = time.monotonic()
            with self._built(program, deadline, request) as error:
                built_s = time.monotonic() - started
                if error is not None:
                    return Trial(error, built_s, None)
                return self._run_once(self.builds.run_job(program, job, self._cgroups()), request, deadline, built_s)

    @contextlib.contextmanager
    def _admitted_run(self, cost: Cost, deadline: float) -> Iterator[None]:
        """A ``/run_code`` run admitted beside the graded samples at its limits (413 / 503, which
        its route answers as SandboxFusion's retried 504, when it does not fit)."""
        if self.settings.admission == "off":
            yield
            return
        with self.admission.admit([cost], deadline):
            yield

    def _run_once(self, job: Job, request: object, deadline: float, built_s: float | None) -> Trial:
        messages = self._sandbox_run(job, request, deadline)
        fetched = next((m.files for m in messages if isinstance(m, Fetched)), {})
        runs = [m for m in messages if not isinstance(m, Fetched)]
        if len(runs) != 1 or not isinstance(runs[0], StdinOutcome):
            raise SandboxFailure(f"a run answered {runs}")
        return Trial(None, built_s, runs[0], fetched)

    def _trial_runs(self, job: Job, request: object, deadline: float) -> list[StdinOutcome]:
        runs = self._sandbox_run(job, request, deadline)
        if not all(isinstance(run, StdinOutcome) for run in runs):
            raise SandboxFailure(f"a trial run answered {runs}")
        return runs  # type: ignore[return-value]

    def _sandbox_run(self, job: Job, request: object, deadline: float) -> list[Outcome | Fetched]:
        with self._slot(request, deadline) as uid:
            return list(self.sandbox.run(job, uid))

    @contextlib.contextmanager
    def _slot(self, request: object, deadline: float) -> Iterator[int]:
        """A run slot lent to ``request``, taken before ``deadline``; else ``SandboxFailure``."""
        with self.sandbox.slot(request, deadline - time.monotonic()) as uid:
            if uid is None or time.monotonic() >= deadline:
                raise SandboxFailure("no run slot came free before the request deadline")
            yield uid

    def _judge(self, suite: Suite, run: Outcome) -> str:
        """``judge``, where whatever the program's output makes fail stays its own verdict."""
        try:
            return judge(suite, run, self.settings.float_tolerance)
        except Exception as exc:  # e.g. RecursionError on deeply nested output
            log.warning("judging a code test failed (%s: %.200s); judged a runtime error", type(exc).__name__, exc)
            return "runtime_error"

    def _count_masked(self, verdicts: Sequence[Verdict]) -> None:
        """Warn per sample left without a verdict, and when more than 5 of 100 were."""
        for verdict in verdicts:
            if verdict.score is None:
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
