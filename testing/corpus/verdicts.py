"""The verdict corpus: public contest problems (Kattis problem packages) with submissions in
several languages, each filed by its authors under the verdict it must get
(``verdicts.jsonl.gz``, and ``interactive.jsonl.gz`` for interactive problems; ``SOURCES.md``
says where each problem comes from and under which licence, ``bench/code/corpus/build_verdicts.py``
and ``build_interactive.py`` build the files).

Each ``Submission`` becomes one sample: the package's tests (sample, then secret, in the
order Kattis judges them) as a stdin label in the submission's language, the package's
output validation as a ``checker`` (an interactive problem's validator as its ``interactor``,
Kattis' protocol), all or nothing (a contest verdict), graded by a server whose per-test CPU
limit and memory limit are the package's (``server_env``).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from testing.corpus import grade
from testing.server import gunicorn_server

DATA = tuple(Path(__file__).resolve().parent / name for name in ("verdicts.jsonl.gz", "interactive.jsonl.gz"))
# Kattis's default memory limit (MiB), for packages that state none.
DEFAULT_MEMORY_MB = 1024
# The error types each expected verdict may get (Kattis files a run over its memory limit
# under run_time_error; we name it).
ERROR_TYPES: dict[str, frozenset[str | None]] = {
    "accepted": frozenset({None}),
    "wrong_answer": frozenset({"wrong_answer"}),
    "time_limit_exceeded": frozenset({"timeout"}),
    "run_time_error": frozenset({"runtime_error", "memory_limit"}),
}

# Every submission we grade otherwise than it is filed, with the cause.
CPYTHON = (
    "time: 31.5 s and 33.4 s of CPython 3.11's CPU on secret/11-lollipop-1 against the package's 8 s "
    "(the contest's judge accepted it within 8 s: a faster Python, PyPy, or machine); a Python "
    "time factor of 4 would not be enough"
)
PYTHON_3_9 = "data: written for Python < 3.9 (fractions.gcd, removed in 3.9); an ImportError on 3.11"
KNOWN_DISAGREEMENTS: dict[str, str] = {
    "rmrc2022/profitabletrip/accepted/profitabletrip-zf.py": CPYTHON,
    "rmrc2022/profitabletrip/accepted/profitabletrip-2-zf.py": CPYTHON,
    "rmrc2018/forestforthetrees/accepted/trees-db.py": PYTHON_3_9,
}

# Verdicts within a few percent of the limit, the machine's rather than the judge's: left out
# of the full run's comparison. drivinglanes-zf.py (filed as too slow) needs 1.80 s of
# CPython's CPU on secret/30 against 2 s (here, outside the sandbox); hello_alarm.c spins
# until alarm(1) fires, about 1 s of CPU on an idle core against 1 s. memory_limit.cc (filed as a
# run-time error) writes 512 MB byte by byte against 512 MB and 1 s: 1.05 s of CPU to write it
# all on an idle core here (0.8 user, 0.2 sys), so the memory cap or the time limit comes first
# by a few percent either way (a run-time error, or a timeout in CI at 2,846 s); Kattis's own
# harness bounds the address space, so its `new` fails at once.
MACHINE_DEPENDENT = {
    "rmrc2018/drivinglanes/time_limit_exceeded/drivinglanes-zf.py",
    "problemtools/hello/accepted/hello_alarm.c",
    "problemtools/hello/run_time_error/memory_limit.cc",
}


@dataclass(frozen=True)
class Submission:
    """One submission of one problem, with what it must get."""

    id: str  # "<problem id>/<directory>/<file>"
    problem: str
    language: str
    expected: str  # the package's directory name: accepted, wrong_answer, ...
    code: str
    label: dict[str, Any]
    time_limit_s: float
    memory_mb: int

    @property
    def limits(self) -> tuple[float, int]:
        """What the grading server must be started with (``server_env``)."""
        return self.time_limit_s, self.memory_mb


def checker(problem: dict[str, Any]) -> str | dict[str, Any]:
    """The package's output validation as a label's ``checker``: its own custom validator, run
    as Kattis runs it; Kattis's default validator compares tokens, case-insensitively unless
    ``case_sensitive``; with a float tolerance, numbers within the absolute or relative one
    (``float_tolerance``: both)."""
    if problem["validation"] != "default":
        return {"program": problem["validator"], "language": "cpp", "protocol": "kattis"}
    flags = problem["validator_flags"].split()
    tolerance = {"abs": 0.0, "rel": 0.0}
    for flag, key in (("float_absolute_tolerance", ("abs",)), ("float_relative_tolerance", ("rel",)),
                      ("float_tolerance", ("abs", "rel"))):  # fmt: skip
        if flag in flags:
            for name in key:
                tolerance[name] = float(flags[flags.index(flag) + 1])
    assert "space_change_sensitive" not in flags, problem["id"]
    if any(tolerance.values()):
        return {"mode": "float", **tolerance}
    return "tokens" if "case_sensitive" in flags else "yes_no"


@cache
def problems() -> tuple[dict[str, Any], ...]:
    rows = []
    for path in DATA:
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            rows += [json.loads(line) for line in lines]
    return tuple(rows)


def tests_of(problem: dict[str, Any]) -> dict[str, Any]:
    """The package's tests and how they are judged, as a label."""
    if "interactor" in problem:
        interactor = {"program": problem["interactor"], "language": "cpp", "protocol": "kattis"}
        return {
            "interactor": interactor,
            "tests": [{"input": t["input"], "answer": t["output"]} for t in problem["tests"]],
        }
    return {
        "tests": [{"input": t["input"], "output": t["output"]} for t in problem["tests"]],
        "checker": checker(problem),
    }


def load() -> list[Submission]:
    items = []
    for problem in problems():
        label = {**tests_of(problem), "scoring": "all"}
        for sub in problem["submissions"]:
            items.append(
                Submission(
                    id=f"{problem['id']}/{sub['path']}",
                    problem=problem["id"],
                    language=sub["language"],
                    expected=sub["expected"],
                    code=sub["code"],
                    label={**label, "language": sub["language"]},
                    time_limit_s=problem["time_limit_s"],
                    memory_mb=problem["memory_mb"] or DEFAULT_MEMORY_MB,
                )
            )
    return items


def server_env(limits: tuple[float, int]) -> dict[str, str]:
    """A code server judging with a package's limits: its time limit as each test's CPU
    seconds (Kattis's limit is CPU time too), its memory limit; a wall limit of a test's own
    that a program waiting for its CPU does not reach; a few runs at once (2 shared cores)."""
    time_limit, memory_mb = limits
    return {
        "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
        "SCORER_CODE_MAX_PARALLEL": "4",
        "SCORER_CODE_TEST_CPU_S": str(time_limit),
        "SCORER_CODE_TEST_WALL_S": str(max(10.0, 2 * time_limit)),
        "SCORER_CODE_MEMORY_MB": str(memory_mb),
        # The corpus is sent as fast as the server answers, not sized for admission at full limits.
        "SCORER_CODE_ADMISSION": "off",
    }


def agrees(item: Submission, score: float, error_type: str | None) -> bool:
    """Whether our verdict is the one the submission is filed under."""
    return error_type in ERROR_TYPES[item.expected] and (score == 1.0) == (item.expected == "accepted")


def judge(items: Sequence[Submission], log_dir: Path) -> dict[str, tuple[float, str | None]]:
    """Each submission's (reward, error type) from a server started with its package's limits
    (one per distinct limits, in turn), 4 at a time; one that disagrees is graded once more
    alone, and that verdict stands (a wall limit under load is not a verdict)."""
    groups: dict[tuple[float, int], list[Submission]] = defaultdict(list)
    for item in items:
        groups[item.limits].append(item)
    found: dict[str, tuple[float, str | None]] = {}
    for limits, group in sorted(groups.items()):
        with gunicorn_server("code", server_env(limits), threads=64, log_dir=log_dir) as server:
            with ThreadPoolExecutor(4) as pool:
                graded = list(pool.map(lambda item: grade(server.url, [item], fence="")[0], group))
            for item, verdict in zip(group, graded, strict=True):
                found[item.id] = verdict if agrees(item, *verdict) else grade(server.url, [item], fence="")[0]
    return found
