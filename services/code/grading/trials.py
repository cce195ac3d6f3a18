"""Unjudged runs: SandboxFusion's ``/run_code`` (one program on one stdin, within a client's
limits, admitted beside the graded samples) and the trial runs of the startup checks and the
benches."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from services.code.grading.build_step import built
from services.code.grading.runner import Owner, Runner
from services.code.judging.statuses import cut_short
from services.code.labels.suites import Suite
from services.code.languages import LANGUAGES, PYTHON
from services.code.sandbox.host import SandboxFailure
from services.code.sandbox.inside.messages import Fetched, Job, StdinOutcome
from services.code.scheduling.admission import Admission, Cost, Rates
from services.code.scheduling.cancelling import Cancellation, Cancelled


@dataclass(frozen=True)
class RunLimits:
    """What a client asks of one run (``run_once``); the server's own limits cap each.
    ``files`` are placed under its ``/tmp`` (path -> base64), ``fetch`` read back after it."""

    cpu_s: float
    wall_s: float
    memory_mb: int
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    fetch: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunCall:
    """One run a client asks for (``run_once``): ``code`` in ``language`` on ``stdin``, within
    ``limits``, by ``deadline``, in ``client``'s turn at the slots."""

    code: str
    language: str
    stdin: str
    limits: RunLimits
    deadline: float
    client: str


@dataclass(frozen=True)
class Trial:
    """One unjudged run (``run_once``): the build's compile error and how long getting the
    build took (a cached one: its wait), for a compiled language; the run, when it built."""

    compile_error: str | None
    compile_s: float | None
    run: StdinOutcome | None
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # fetched: path -> base64


def trial(
    runner: Runner, timeout_s: float, code: str, language: str = PYTHON, inputs: Sequence[str] = ("",)
) -> list[StdinOutcome]:
    """What a run of ``code`` in ``language`` (built first when it is compiled) on each of
    ``inputs`` reported, unjudged, within ``timeout_s``: for the startup checks and the benches."""
    deadline = time.monotonic() + timeout_s
    owner = ("", object())  # the node's own runs: a client of their own
    job = runner.job(Suite("stdin", list(inputs), [""] * len(inputs)), code, deadline, language)
    job = dataclasses.replace(job, keep_bytes=runner.settings.max_output_bytes)
    if language == PYTHON:
        return _trial_runs(runner, job, owner, deadline)
    assert runner.builds is not None
    program = runner.builds.program(LANGUAGES[language], code, runner.settings.memory_mb)
    with built(runner, program, deadline, owner) as error:
        if error is not None:
            raise SandboxFailure(f"a trial program does not build: {error[:300]}")
        return _trial_runs(runner, runner.builds.run_job(program, job, runner.cgroups()), owner, deadline)


def run_once(
    runner: Runner, admission: Admission | None, rates: Rates, call: RunCall, cancellation: Cancellation | None = None
) -> Trial:
    """``call``'s run (built first, through the compile cache, when compiled), unjudged, within
    its limits (never more than the server's): SandboxFusion's ``/run_code``. Admitted at the
    measured rate (``admission``; ``None``: off), it runs at its full limits or not at all: a run
    the deadline would cut short raises ``SandboxFailure`` (retried by the client), never a time
    limit its program did not reach."""
    code, language, limits, deadline, client = call.code, call.language, call.limits, call.deadline, call.client
    s = runner.settings
    memory_mb = min(limits.memory_mb, s.memory_mb)
    less = (s.memory_mb - memory_mb) << 20
    job = runner.job(Suite("stdin", [call.stdin], [""]), code, deadline, language)
    job = dataclasses.replace(
        job, cpu_s=min(job.cpu_s, limits.cpu_s), wall_s=min(job.wall_s, limits.wall_s),
        keep_bytes=s.max_output_bytes, memory_bytes=job.memory_bytes - less,
        judged_memory_bytes=job.judged_memory_bytes - less, cgroup_memory_bytes=job.cgroup_memory_bytes - less,
        files=limits.files, fetch=list(limits.fetch), fetch_bytes=s.run_code_file_bytes,
    )  # fmt: skip
    owner = (client, object())
    compiled = language != PYTHON
    cost = Cost(rates, language, 1, job.wall_s + (s.compile_cpu_s if compiled else 0.0), compiled)
    with _admitted(admission, client, cost, deadline):
        if language == PYTHON:
            return _run_once(runner, rates, job, language, owner, deadline, None, cancellation)
        assert runner.builds is not None
        program = runner.builds.program(LANGUAGES[language], code, memory_mb)
        started = time.monotonic()
        with built(runner, program, deadline, owner) as error:
            built_s = time.monotonic() - started
            rates.measured(language, 0.0, 0, built_s)
            if error is not None:
                return Trial(error, built_s, None)
            job = runner.builds.run_job(program, job, runner.cgroups())
            return _run_once(runner, rates, job, language, owner, deadline, built_s, cancellation)


@contextlib.contextmanager
def _admitted(admission: Admission | None, client: str, cost: Cost, deadline: float) -> Iterator[None]:
    """A ``/run_code`` run admitted beside the graded samples (413 / 503, which its route
    answers as SandboxFusion's retried 504, when it does not fit)."""
    if admission is None:
        yield
        return
    with admission.admit(client, [cost], deadline):
        yield


def _run_once(
    runner: Runner,
    rates: Rates,
    job: Job,
    language: str,
    owner: Owner,
    deadline: float,
    built_s: float | None,
    cancellation: Cancellation | None,
) -> Trial:
    with runner.slot(owner, deadline) as uid:
        if cancellation is not None and cancellation.cancelled:
            raise Cancelled()
        started = time.monotonic()
        if deadline - started < job.wall_s:
            raise SandboxFailure("the run could not have its time limit before the client's timeout")
        job = dataclasses.replace(job, sample_s=max(0.1, min(job.sample_s, deadline - started)))
        messages = list(runner.sandbox.run(job, uid, cancellation=cancellation))
        slot_s = time.monotonic() - started
    fetched = next((m.files for m in messages if isinstance(m, Fetched)), {})
    runs = [m for m in messages if not isinstance(m, Fetched)]
    if len(runs) != 1 or not isinstance(runs[0], StdinOutcome):
        raise SandboxFailure(f"a run answered {runs}")
    if not runs[0].timed_out:  # as a graded test's: a run stopped at a limit says nothing of what one costs
        rates.measured(language, slot_s, 1)
    if cut_short(runs[0], job):
        raise SandboxFailure("the client's timeout would have cut the run short of its own time limits")
    return Trial(None, built_s, runs[0], fetched)


def _trial_runs(runner: Runner, job: Job, owner: Owner, deadline: float) -> list[StdinOutcome]:
    runs = runner.run_all(job, owner, deadline)
    if not all(isinstance(run, StdinOutcome) for run in runs):
        raise SandboxFailure(f"a trial run answered {runs}")
    return runs  # type: ignore[return-value]
