"""How a stdin test's output is checked against its answer (a label's ``"checker"``).

Built-in modes compare here, in the service:

- ``default``: today's rule (``labels.stdout_matches``, applied by the grader: lines after
  stripping, numbers within the server's ``float_tolerance`` if set);
- ``tokens``: the whitespace-separated tokens, equal;
- ``lines``: the lines, each without trailing whitespace (``\\r`` included), trailing blank
  lines ignored;
- ``exact``: the text, byte for byte (``\\r\\n`` as ``\\n``);
- ``float``: tokens; numbers within an absolute *or* relative tolerance (``abs``, ``rel``:
  1e-6 by default) by testlib's rules (an expected NaN wants a NaN, an infinity the same
  infinity); an expected integer token wants that integer exactly, never compared as a float
  (so 50000000000000001 is not 5e16); other tokens equal;
- ``yes_no``: tokens, case-insensitive (``YES`` is ``yes``).

A *custom* checker (``{"program": source, "language": "cpp" | "python"}``) is a program run in a
sandbox of its own after the graded program exited, as ``checker input output answer`` with
testlib's exit codes (``custom_verdict``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from common.errors import Unprocessable
from services.code.languages import CHECKER_LANGUAGES, language_of

MODES = ("default", "tokens", "lines", "exact", "float", "yes_no")
DEFAULT_TOLERANCE = 1e-6
# The longest checker source a label may carry.
MAX_CHECKER_CHARS = 200_000
_INTEGER = re.compile(r"[+-]?\d+")
_REAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
# testlib's own slack on doubles.
TESTLIB_EPSILON = 1e-15


@dataclass(frozen=True)
class Checker:
    """A label's checker: a built-in ``mode`` with its tolerances, or a custom ``program``."""

    mode: str = "default"
    abs_tol: float = DEFAULT_TOLERANCE
    rel_tol: float = DEFAULT_TOLERANCE
    program: str = ""
    language: str = ""


DEFAULT = Checker()


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
        return Checker(mode="custom", program=program, language=language)
    mode = value.get("mode", "default")
    if mode not in MODES:
        raise Unprocessable(f"labels: unknown checker mode {str(mode)[:40]!r}; one of {', '.join(MODES)}")
    tolerances = [value.get("abs", DEFAULT_TOLERANCE), value.get("rel", DEFAULT_TOLERANCE)]
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1 for t in tolerances):
        raise Unprocessable("labels: a checker's 'abs' and 'rel' must be numbers in [0, 1)")
    return Checker(mode=mode, abs_tol=float(tolerances[0]), rel_tol=float(tolerances[1]))


def matches(checker: Checker, got: str, want: str) -> bool:
    """Whether output ``got`` answers ``want`` under a built-in ``checker`` other than ``default``."""
    mode = checker.mode
    if mode == "tokens":
        return got.split() == want.split()
    if mode == "yes_no":
        return [t.lower() for t in got.split()] == [t.lower() for t in want.split()]
    if mode == "lines":
        return _lines(got) == _lines(want)
    if mode == "exact":
        return got.replace("\r\n", "\n") == want.replace("\r\n", "\n")
    if mode == "float":
        got_tokens, want_tokens = got.split(), want.split()
        return len(got_tokens) == len(want_tokens) and all(
            _number_equal(g, w, checker.abs_tol, checker.rel_tol) for g, w in zip(got_tokens, want_tokens, strict=True)
        )
    raise ValueError(f"not a built-in checker: {mode}")


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _number_equal(got: str, want: str, abs_tol: float, rel_tol: float) -> bool:
    """testlib's ``doubleCompare`` with separate absolute and relative tolerances; integers exact."""
    if got == want:
        return True
    if _INTEGER.fullmatch(want):
        return _INTEGER.fullmatch(got) is not None and int(got) == int(want)
    if not (_REAL.fullmatch(got) and _REAL.fullmatch(want)):
        return False
    result, expected = float(got), float(want)
    if math.isnan(expected):
        return math.isnan(result)
    if math.isinf(expected):
        return result == expected
    if math.isnan(result) or math.isinf(result):
        return False
    if abs(result - expected) <= abs_tol + TESTLIB_EPSILON:
        return True
    low, high = sorted((expected * (1 - rel_tol), expected * (1 + rel_tol)))
    return low - TESTLIB_EPSILON <= result <= high + TESTLIB_EPSILON


# testlib's exit codes: accepted, wrong answer, presentation error, judge failure, partial.
EXIT_OK, EXIT_WRONG, EXIT_PRESENTATION, EXIT_FAIL, EXIT_POINTS = 0, 1, 2, 3, 7
_POINTS = re.compile(r"^\s*(?:points\s+)?([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", re.IGNORECASE)


def custom_verdict(exit_code: int, timed_out: bool, report: str) -> tuple[str, float] | None:
    """(status, points in [0, 1]) of a test from its custom checker's exit, or None when the
    checker failed (a judge failure: no verdict for the sample). Exit 7 reports the test's
    fraction as the first number of what the checker printed (testlib's ``quitp``)."""
    if timed_out:
        return None
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
