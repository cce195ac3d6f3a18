"""How a stdin test's output is checked against its answer (a label's ``"checker"``).

Built-in modes (``comparison.MODES``) compare in the service, by ``comparison.output_matches``:
``default`` (the server's rule, numbers within its ``float_tolerance`` if set), ``tokens``,
``lines``, ``exact``, ``float`` (numbers within an absolute *or* relative tolerance, ``abs``
and ``rel``: 1e-6 by default) and ``yes_no``.

A *custom* checker (``{"program": source, "language": "cpp" | "python", "protocol": "testlib" |
"kattis"}``) is a program run in a sandbox of its own after the graded program exited: testlib's
``checker input output answer``, or a Kattis output validator's ``validator input answer
feedback_dir < output`` (exit 42 accepted, 43 rejected; ``custom_verdict``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from common.limits.errors import Unprocessable
from services.code.judging.comparison import MODES
from services.code.languages import CHECKER_LANGUAGES, language_of

DEFAULT_TOLERANCE = 1e-6
# The longest checker source a label may carry.
MAX_CHECKER_CHARS = 200_000


@dataclass(frozen=True)
class Checker:
    """A label's checker: a built-in ``mode`` with its tolerances, or a custom ``program``."""

    mode: str = "default"
    abs_tol: float = DEFAULT_TOLERANCE
    rel_tol: float = DEFAULT_TOLERANCE
    program: str = ""
    language: str = ""
    # How its exit codes read: testlib's, or Kattis' (42 accepted, 43 rejected).
    protocol: str = "testlib"
    # Mode ``kattis`` (a package's default validation, ``kattis_default``): its flag; its
    # tolerances are ``abs_tol`` and ``rel_tol``, negative when not set.
    case_sensitive: bool = False


DEFAULT = Checker()
# The mode of a problem package's default validation: not a label's to ask for.
KATTIS_DEFAULT = "kattis"


def parse_checker(value: Any) -> Checker:
    """A label's ``"checker"``: a mode name, ``{"mode", "abs", "rel"}`` or ``{"program", "language"}``."""
    if isinstance(value, str):
        value = {"mode": value}
    if not isinstance(value, dict):
        raise Unprocessable("labels: 'checker' must be a mode name or a dict")
    if "program" in value:
        program, language = value["program"], language_of(value.get("language", "cpp"))
        if not isinstance(program, str) or not program.strip() or len(program) > MAX_CHECKER_CHARS:
            raise Unprocessable(f"labels: a checker's 'program' must be source code of at most {MAX_CHECKER_CHARS}")
        if language not in CHECKER_LANGUAGES:
            raise Unprocessable("labels: a checker program is C++ (testlib.h) or Python")
        protocol = value.get("protocol", "testlib")
        if protocol not in REJECTIONS:
            raise Unprocessable(f"labels: a checker's 'protocol' is one of {', '.join(REJECTIONS)}")
        return Checker(mode="custom", program=program, language=language, protocol=protocol)
    mode = value.get("mode", "default")
    if mode not in MODES:
        raise Unprocessable(f"labels: unknown checker mode {str(mode)[:40]!r}; one of {', '.join(MODES)}")
    tolerances = [value.get("abs", DEFAULT_TOLERANCE), value.get("rel", DEFAULT_TOLERANCE)]
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1 for t in tolerances):
        raise Unprocessable("labels: a checker's 'abs' and 'rel' must be numbers in [0, 1)")
    return Checker(mode=mode, abs_tol=float(tolerances[0]), rel_tol=float(tolerances[1]))


# testlib's exit codes: accepted, wrong answer, presentation error, judge failure, partial;
# Kattis' output validators': accepted, rejected.
EXIT_OK, EXIT_WRONG, EXIT_PRESENTATION, EXIT_FAIL, EXIT_POINTS = 0, 1, 2, 3, 7
KATTIS_ACCEPTED, KATTIS_REJECTED = 42, 43
REJECTIONS = {"testlib": (EXIT_WRONG, EXIT_PRESENTATION), "kattis": (KATTIS_REJECTED,)}
_POINTS = re.compile(r"^\s*(?:points\s+)?([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", re.IGNORECASE)


def custom_verdict(exit_code: int, timed_out: bool, report: str, protocol: str = "testlib") -> tuple[str, float] | None:
    """(status, points in [0, 1]) of a test from its custom checker's exit, or None when the
    checker failed (a judge failure: no verdict for the sample). Exit 7 reports the test's
    fraction as the first number of what the checker printed (testlib's ``quitp``)."""
    if timed_out:
        return None
    if protocol == "kattis":
        return {KATTIS_ACCEPTED: ("passed", 1.0), KATTIS_REJECTED: ("wrong_answer", 0.0)}.get(exit_code)
    if exit_code == EXIT_OK:
        return "passed", 1.0
    if exit_code in (EXIT_WRONG, EXIT_PRESENTATION):
        return "wrong_answer", 0.0
    if exit_code == EXIT_POINTS:
        found = _POINTS.match(report)
        if found is None:
            return None
        points = float(found.group(1))
        if not 0.0 <= points <= 1.0:
            return None
        return ("passed" if points >= 1.0 else "wrong_answer"), points
    return None
