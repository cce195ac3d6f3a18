"""Kattis problem packages for the tests (``services.code.labels.problem_packages``), written into a directory:
``anysum``, an "any valid answer" problem written for the tests (print two non-negative
integers summing to N), judged by a Python output validator; the verdict corpus's problems
(``testing/corpus``, which carries their licences) as packages: problemtools' ``guess``
(interactive) and ``hello``, Rocky Mountain 2018's ``qaly`` (a float tolerance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testing.corpus.verdicts import problems

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


def corpus_row(ident: str) -> dict[str, Any]:
    """The corpus's problem ``ident`` (``problemtools/guess``): its tests, settings, submissions."""
    return next(row for row in problems() if row["id"] == ident)


def from_corpus(root: Path, ident: str, version: str = "legacy") -> Path:
    """The corpus's problem ``ident`` as a package named as its last part in ``root`` (with
    ``-VERSION`` but for the legacy format): an interactive one with its validator
    (``validate.h`` already in place of its ``#include``, as the corpus holds it), its
    ``problem.yaml`` in the package format ``version`` (``legacy``: ``validation:``; 2023-07
    and later: ``type:``, as BAPCtools writes it)."""
    row, name = corpus_row(ident), ident.rsplit("/", 1)[-1] + ("" if version == "legacy" else f"-{version}")
    if "interactor" in row:
        config = "validation: custom interactive\n"
        if version != "legacy":
            config = f"problem_format_version: {version}\nname: Guess\ntype:\n  - pass-fail\n  - interactive\n"
        files = {"problem.yaml": config, "output_validator/validator/validate.cc": row["interactor"]}
    else:
        files = {"problem.yaml": f"validation: {row['validation']}\nvalidator_flags: '{row['validator_flags']}'\n"}
    for test in row["tests"]:
        files[f"data/{test['name']}.in"], files[f"data/{test['name']}.ans"] = test["input"], test["output"]
    return write(root / name, files)
