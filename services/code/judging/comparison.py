"""Whether what a program printed or returned answers the expected output: the one rule for
the label's checker modes and for call results.

Numbers follow testlib's checkers: two integer tokens (or two ints in a call's result) compare
exactly; when either side is a real number both are read as doubles and compared within an
absolute *or* relative tolerance (``doubleCompare``: ``2.000000000`` answers ``2``); ``nan``
and ``inf`` (any case, ``infinity`` too, as C reads them) as DOMjudge's float comparison reads
them: NaN equals NaN, an infinity the one of its sign. Any other token (``0x10``, ``1_0``) is
compared as text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MODES = ("default", "tokens", "lines", "exact", "float", "yes_no")
_INTEGER = re.compile(r"[+-]?\d+")
# What testlib's ``readDouble`` accepts: digits, one point, one exponent; never nan or inf.
_REAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# NaN and the infinities as C's ``strtod`` reads them.
_NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
# testlib's own slack on doubles.
TESTLIB_EPSILON = 1e-15


def output_matches(mode: str, got: str, want: str, abs_tol: float = 0.0, rel_tol: float = 0.0) -> bool:
    """Whether output ``got`` answers ``want`` under a built-in checker ``mode``.

    ``default``: line by line after stripping, tokens equal or (with a tolerance) equal numbers;
    ``tokens``: the whitespace-separated tokens equal; ``lines``: the lines without trailing
    whitespace, trailing blank lines ignored; ``exact``: the text (``\\r\\n`` as ``\\n``);
    ``float``: tokens, equal numbers or equal text; ``yes_no``: tokens, case-insensitive.
    """
    if mode == "default":
        return _default(got, want, abs_tol, rel_tol)
    if mode == "tokens":
        return got.split() == want.split()
    if mode == "yes_no":
        return [t.lower() for t in got.split()] == [t.lower() for t in want.split()]
    if mode == "lines":
        return _trimmed_lines(got) == _trimmed_lines(want)
    if mode == "exact":
        return got.replace("\r\n", "\n") == want.replace("\r\n", "\n")
    if mode == "float":
        return _tokens_equal(got.split(), want.split(), abs_tol, rel_tol)
    raise ValueError(f"not a built-in checker: {mode}")


def _default(got: str, want: str, abs_tol: float, rel_tol: float) -> bool:
    got_lines, want_lines = _stripped_lines(got), _stripped_lines(want)
    if len(got_lines) != len(want_lines):
        return False
    numeric = abs_tol > 0 or rel_tol > 0
    return all(
        g == w or (numeric and _tokens_equal(g.split(), w.split(), abs_tol, rel_tol))
        for g, w in zip(got_lines, want_lines, strict=True)
    )


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def _trimmed_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _tokens_equal(got: list[str], want: list[str], abs_tol: float, rel_tol: float) -> bool:
    return len(got) == len(want) and all(token_equal(g, w, abs_tol, rel_tol) for g, w in zip(got, want, strict=True))


def token_equal(got: str, want: str, abs_tol: float, rel_tol: float) -> bool:
    """One token against the expected one: integers exactly, reals as doubles, else text."""
    if got == want:
        return True
    if _INTEGER.fullmatch(got) and _INTEGER.fullmatch(want):
        return int(got) == int(want)
    if _double(got) and _double(want):
        return double_equal(float(got), float(want), abs_tol, rel_tol)
    return False


def _double(token: str) -> bool:
    return bool(_REAL.fullmatch(token) or _NON_FINITE.fullmatch(token))


def double_equal(result: float, expected: float, abs_tol: float, rel_tol: float) -> bool:
    """testlib's ``doubleCompare``, with separate absolute and relative tolerances."""
    if math.isnan(expected):
        return math.isnan(result)
    if math.isinf(expected):
        return result == expected
    if math.isnan(result) or math.isinf(result):
        return False
    if abs(result - expected) <= abs_tol + TESTLIB_EPSILON:
        return True
    low, high = sorted((expected * (1 - rel_tol - TESTLIB_EPSILON), expected * (1 + rel_tol + TESTLIB_EPSILON)))
    return low <= result <= high


def result_matches(got: Any, want: Any, tolerance: float = 0.0) -> bool:
    """A call's JSON result against the expected value; APPS wraps a return value in a list."""
    if _data_equal(got, want, tolerance):
        return True
    return isinstance(want, list) and len(want) == 1 and _data_equal(got, want[0], tolerance)


def _json_key(key: Any) -> Any:
    """A result's dict key as JSON (the labels' format) writes it: ``1`` -> ``"1"``."""
    return json.dumps(key) if key is None or isinstance(key, (bool, int, float)) else key


def _data_equal(got: Any, want: Any, tolerance: float) -> bool:
    """Structural equality of JSON data (tuples arrive as lists); bools are not numbers."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return got == want or (tolerance > 0 and _numbers_close(got, want, tolerance))
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(want) and all(_data_equal(g, w, tolerance) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        got = {_json_key(k): v for k, v in got.items()}
        return got.keys() == want.keys() and all(_data_equal(got[k], want[k], tolerance) for k in want)
    return type(got) is type(want) and got == want


def _numbers_close(got: int | float, want: int | float, tolerance: float) -> bool:
    """Two ints never (they were compared exactly); an int and a real as doubles."""
    if isinstance(got, int) and isinstance(want, int):
        return False
    try:
        return double_equal(float(got), float(want), tolerance, tolerance)
    except OverflowError:  # an int past a double's range is no real's equal
        return False
