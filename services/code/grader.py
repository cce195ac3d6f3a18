"""From a sample to a verdict: slots, deadlines, the one re-run, and per-test judging.

The sandbox only reports what each test printed or returned; every verdict is made here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from common.batching import Deadline
from services.code import checkers
from services.code.compile_cache import Builds
from services.code.labels import Suite, result_matches, stdout_matches
from services.code.languages import CHECKER_LANGUAGES, LANGUAGES, PYTHON, Program, TimeScale, time_scales
from services.code.sandbox import HELD_OUTPUT_FACTOR, Sandbox, SandboxFailure
from services.code.sandboxed import wire
from services.code.sandboxed.wire import CallOutcome, Job, Outcome, Skipped, StdinOutcome, TrustedTests, from_plain
from services.code.settings import SUPERVISOR_MB, CodeSettings

log = logging.getLogger(__name__)

STATUSES = (
    "passed", "wrong_answer", "runtime_error", "timeout", "memory_limit", "output_limit", "compile_error", "no_code",
    "invalid_label", "sandbox_error", "language_unavailable", "judge_failure", "prompt_not_found",
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
    """The status of test ``run.index`` from what the sandbox reported."""
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
    if checker.mode == "default":
        return "passed" if stdout_matches(run.stdout, want, tolerance) else "wrong_answer"
    return "passed" if checkers.matches(checker, run.stdout, want) else "wrong_answer"


# What a program that failed to allocate prints as it dies: Python's and Java's error, C++'s
# exception, Go's and Rust's runtimes, a V8 heap at its limit. Without cgroups the address
# space limit makes an allocation fail; with them, the kernel's OOM kill says it.
OUT_OF_MEMORY = ("MemoryError", "std::bad_alloc", "out of memory", "memory allocation of ")


# A stdin test whose program exited cleanly, for the label's custom checker to judge. What
# a sample's tests printed waits for it in this process (``HELD_OUTPUT_FACTOR``), then goes to
# the checker's sandbox as one job.
UNCHECKED = "unchecked"


class JudgeFailure(Exception):
    """A label's custom checker failed (did not build, crashed, hung, flooded, exit 3): the
    sample gets no verdict."""


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
        return "passed" if result_matches(answer[1], suite.expected[run.index], tolerance) else "wrong_answer"
    return "memory_limit" if isinstance(answer, list) and answer[1:2] == ["MemoryError"] else "runtime_error"


def too_long(suite: Suite, kept: int) -> bool:
    """Whether an expected output of ``suite`` needs more than ``kept`` bytes of a program's
    output to be matched (``KEEP_FACTOR``): no program could pass it."""
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
        self._mask_lock = threading.Lock()
        self._block_seen = 0
        self._block_masked = 0

    def grade(self, samples: Sequence[Sample], by: Deadline | None = None) -> list[Verdict]:
        """Verdicts in order, ``by`` the request's deadline; never raises for what a sample's code does."""
        deadline = (by or Deadline(self.timeout_s)).expires
        request = object()  # this request's place in the round-robin of slots
        if len(samples) == 1:
            verdicts = [self.grade_one(samples[0], deadline, request)]
        else:
            threads = min(len(samples), self.settings.parallel)
            with ThreadPoolExecutor(threads, thread_name_prefix="code-grade") as pool:
                verdicts = list(pool.map(lambda s: self.grade_one(s, deadline, request), samples))
        self._count_masked(verdicts)
        invalid = [s.suite for s, v in zip(samples, verdicts, strict=True) if v.status == "invalid_label"]
        if invalid and invalid[0] is not None:
            reason = invalid[0].invalid or LONG_OUTPUT
            log.warning("%d code sample(s) scored 0 for an invalid label; one: %s", len(invalid), reason)
        return verdicts

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
    def _built(self, program: Program, deadline: float, request: object) -> Iterator[str | None]:
        """``program``'s build held in the compile cache (built in a slot if it is not there):
        yields its compile error, or None."""
        builds = self.builds
        assert builds is not None

        def build() -> str | None:
            job = builds.build_job(program, self._job(Suite("stdin", [""], [""]), "", deadline), self._cgroups())
            with self.sandbox.slot(request, deadline - time.monotonic()) as uid:
                if uid is None or time.monotonic() >= deadline:
                    raise SandboxFailure("no run slot came free before the request deadline")
                runs = self.sandbox.run(job, uid)
                try:
                    return builds.compile_error(next(runs, None))
                finally:
                    runs.close()

        with builds.cache.held(program.key, build, deadline - time.monotonic()) as error:
            yield error

    def _cgroups(self) -> bool:
        return bool(self.sandbox.cgroups.version)

    def _run(
        self, suite: Suite, code: str, deadline: float, request: object, program: Program | None = None
    ) -> Verdict:
        statuses = ["timeout"] * len(suite.tests)
        outputs: dict[int, str] = {}  # what the custom checker judges
        with self.sandbox.slot(request, deadline - time.monotonic()) as uid:
            if uid is None or time.monotonic() >= deadline:
                raise SandboxFailure("no run slot came free before the request deadline")
            job = self._job(suite, code, deadline, program.language.name if program else PYTHON)
            if program is not None:
                assert self.builds is not None
                job = self.builds.run_job(program, job, self._cgroups())
            # Every test runs, whatever the scoring: which ran must not tell the program
            # which of its answers were right.
            runs = self.sandbox.run(job, uid, self._trusted(suite), held_bytes=answers_needed(suite))
            try:
                held = 0  # characters of output waiting for the checker
                for run in runs:
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
        points = [float(status == "passed") for status in statuses]
        if outputs:
            try:
                for index, (status, got) in self._check(suite, outputs, deadline, request).items():
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

    def _check(
        self, suite: Suite, outputs: dict[int, str], deadline: float, request: object
    ) -> dict[int, tuple[str, float]]:
        """The label's custom checker on each test's output, in a sandbox of its own (the
        program has exited): ``checker input output answer``. Raises ``JudgeFailure``."""
        if self.builds is None:
            raise JudgeFailure("this server builds no programs")
        checker = suite.checker
        language = LANGUAGES[CHECKER_LANGUAGES[checker.language]]
        if self.builds.missing(language):
            raise JudgeFailure(f"the checker's toolchain is missing ({', '.join(self.builds.missing(language))})")
        program = self.builds.program(language, checker.program, self.settings.memory_mb)
        order = sorted(outputs)
        with self._built(program, deadline, request) as error:
            if error is not None:
                raise JudgeFailure(f"the checker does not compile: {error[:300]}")
            files = [[str(suite.tests[i]), outputs[i], str(suite.expected[i])] for i in order]
            job = self.builds.check_job(program, self._job(Suite("stdin", [""] * len(order), [""]), "", deadline,
                                                                    language.name),
                                        files, self._cgroups())  # fmt: skip
            found: dict[int, tuple[str, float]] = {}
            with self.sandbox.slot(request, deadline - time.monotonic()) as uid:
                if uid is None or time.monotonic() >= deadline:
                    raise SandboxFailure("no run slot came free before the request deadline")
                runs = self.sandbox.run(job, uid)
                try:
                    for run in runs:
                        if not isinstance(run, StdinOutcome):
                            raise JudgeFailure("the checker ran out of time")
                        verdict = checkers.custom_verdict(
                            run.exit, run.timed_out or run.output_exceeded, run.stderr or run.stdout
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
        # The sample's wall time scales too, its seconds once per test (each pays a start).
        sample_s = s.sample_wall_s * scale.factor + scale.offset_s * len(suite.tests)
        cgroups = self.sandbox.cgroups
        return Job(
            kind=suite.kind, code=code, fn_name=suite.fn_name,
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

    def _run_once(self, job: Job, request: object, deadline: float, built_s: float | None) -> Trial:
        messages = self._sandbox_run(job, request, deadline)
        fetched = next((m.files for m in messages if isinstance(m, wire.Fetched)), {})
        runs = [m for m in messages if not isinstance(m, wire.Fetched)]
        if len(runs) != 1 or not isinstance(runs[0], StdinOutcome):
            raise SandboxFailure(f"a run answered {runs}")
        return Trial(None, built_s, runs[0], fetched)

    def _trial_runs(self, job: Job, request: object, deadline: float) -> list[StdinOutcome]:
        runs = self._sandbox_run(job, request, deadline)
        if not all(isinstance(run, StdinOutcome) for run in runs):
            raise SandboxFailure(f"a trial run answered {runs}")
        return runs  # type: ignore[return-value]

    def _sandbox_run(self, job: Job, request: object, deadline: float) -> list[Outcome | wire.Fetched]:
        with self.sandbox.slot(request, deadline - time.monotonic()) as uid:
            if uid is None or time.monotonic() >= deadline:
                raise SandboxFailure("no run slot came free before the deadline")
            return list(self.sandbox.run(job, uid))

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
