"""Kattis problem packages for the tests (``services.code.problems``), written into a directory:
``anysum``, an "any valid answer" problem written for the tests (print two non-negative
integers summing to N), judged by a Python output validator; ``guess``, Kattis problemtools'
interactive example, from the verdict corpus (``testing/corpus``, which carries its licence)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from testing.corpus.verdicts import DATA

# Kattis' protocol: input and answer files, a feedback directory; the output on stdin.
SUM_VALIDATOR = """\
import sys

n = int(open(sys.argv[1]).read())
words = sys.stdin.read().split()
ok = len(words) == 2 and all(w.isdigit() for w in words) and sum(map(int, words)) == n
with open(sys.argv[3] + "/judgemessage.txt", "w") as feedback:
    feedback.write("ok" if ok else "not two non-negative integers summing to %d" % n)
sys.exit(42 if ok else 43)
"""
SUM_TESTS = {"sample/1": 10, "secret/01": 0, "secret/02": 7, "secret/group/03": 1000000}


def write(directory: Path, files: dict[str, str]) -> Path:
    """Each of ``files`` (relative path: text) written under ``directory``."""
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return directory


def anysum(root: Path, name: str = "anysum") -> Path:
    """The "any valid answer" package at ``root/name``: its answers are one valid answer each,
    which a program need not print."""
    files = {"problem.yaml": "name: Any sum\nvalidation: custom\n",
             "output_validators/sum/validate.py": SUM_VALIDATOR,
             "input_validators/validate.py": "raise SystemExit(42)\n"}  # fmt: skip
    for test, n in SUM_TESTS.items():
        files[f"data/{test}.in"], files[f"data/{test}.ans"] = f"{n}\n", f"{n} 0\n"
    return write(root / name, files)


def guess_row() -> dict[str, Any]:
    """problemtools' ``guess`` as the corpus holds it (its tests, validator, submissions)."""
    with gzip.open(DATA[1], "rt") as rows:
        return next(row for row in map(json.loads, rows) if row["id"] == "problemtools/guess")


def guess(root: Path) -> Path:
    """problemtools' ``guess`` package at ``root/guess`` (its ``validate.h`` already in place of
    its ``#include``, as the corpus holds it)."""
    row = guess_row()
    files = {"problem.yaml": "name: Guess the Number\nvalidation: custom interactive\n",
             "output_validator/guess_validator/validate.cc": row["interactor"]}  # fmt: skip
    for test in row["tests"]:
        files[f"data/{test['name']}.in"], files[f"data/{test['name']}.ans"] = test["input"], test["output"]
    return write(root / "guess", files)
