"""Kattis' default output validator (problemtools' ``default_validator.cc``), re-stated: what a
problem package with ``validation: default`` is judged by (``services.code.labels.problem_packages``).

Tokens are split on C's whitespace (space, ``\\t\\n\\v\\f\\r``; no other character, so a
no-break space is part of a token) and compared one by one, case-insensitively in ASCII
(``strcasecmp``) unless ``case_sensitive``. With a float tolerance, an answer token that reads
whole as a finite double (``strtod``: decimal or hexadecimal, never ``inf`` or ``nan``) must be
answered by one that reads so too, within the absolute *or* the relative tolerance (of the
answer's magnitude); integers are doubles here too. A tolerance not set is negative, as
Kattis keeps it (-1: it accepts nothing). Trailing or missing tokens are wrong.
"""

from __future__ import annotations

import math
import re

_SPACE = re.compile(r"[ \t\n\v\f\r]+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_HEX = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?")


def matches(got: str, want: str, case_sensitive: bool, abs_tol: float, rel_tol: float) -> bool:
    """Whether output ``got`` answers ``want`` as Kattis' default validator judges it."""
    got_tokens, want_tokens = _tokens(got), _tokens(want)
    if len(got_tokens) != len(want_tokens):
        return False
    floats = abs_tol >= 0 or rel_tol >= 0
    return all(
        _token_matches(g, w, case_sensitive, floats, abs_tol, rel_tol)
        for g, w in zip(got_tokens, want_tokens, strict=True)
    )


def _tokens(text: str) -> list[str]:
    return [token for token in _SPACE.split(text) if token]


def _token_matches(got: str, want: str, case_sensitive: bool, floats: bool, abs_tol: float, rel_tol: float) -> bool:
    expected = _double(want) if floats else None
    if expected is not None:
        value = _double(got)
        if value is None:
            return False
        error = abs(expected - value)
        return error <= abs_tol or error <= rel_tol * abs(expected)
    if case_sensitive:
        return got == want
    return _ascii_lower(got) == _ascii_lower(want)


def _double(token: str) -> float | None:
    """The token as C's ``sscanf("%lf")`` reads it whole, when finite; else None."""
    try:
        if _DECIMAL.fullmatch(token):
            value = float(token)
        elif _HEX.fullmatch(token):
            value = float.fromhex(token)
        else:
            return None
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _ascii_lower(token: str) -> str:
    return token.translate(_LOWER)


_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
