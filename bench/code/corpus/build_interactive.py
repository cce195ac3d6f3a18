"""Build the interactive part of the verdict corpus (``testing/corpus/interactive.jsonl.gz``)
from a local git mirror of Kattis/problemtools. Reproducible: same commit, same bytes.

    python -m bench.code.corpus.build_interactive --problemtools MIRROR.git

Each problem is an interactive Kattis problem package, read as ``build_verdicts`` reads one
(tests, settings, submissions by verdict), plus its output validator, which is the
interactor: its ``validate.cc`` with problemtools' ``validate.h`` put in the place of its
``#include "validate.h"``, one source a label carries.
"""

from __future__ import annotations

import argparse

from bench.code.corpus.build import OUT, git, write_jsonl_gz
from bench.code.corpus.build_verdicts import ARCHIVES, Archive, problem_row

GUESS = Archive(
    "problemtools",
    "Kattis/problemtools",
    ARCHIVES["problemtools"].commit,
    ("examples/guess",),
    default_time_limit_s=1.0,
)
VALIDATOR = "output_validator/guess_validator"
INCLUDE = '#include "validate.h"\n'


def interactor(mirror: str, archive: Archive, package: str) -> str:
    """The package's output validator as one C++ source."""

    def show(path: str) -> str:
        return git(mirror, "show", f"{archive.commit}:{package}/{VALIDATOR}/{path}").decode()

    source = show("validate.cc")
    assert source.count(INCLUDE) == 1, package
    return source.replace(INCLUDE, show("validate.h") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problemtools", required=True, help="git dir of Kattis/problemtools")
    args = parser.parse_args()
    rows = []
    for package in GUESS.problems:
        row, left_out = problem_row(args.problemtools, GUESS, package)
        rows.append({**row, "interactor": interactor(args.problemtools, GUESS, package)})
        for line in left_out:
            print(f"left out {GUESS.repository} {line}")
    path = OUT / "interactive.jsonl.gz"
    write_jsonl_gz(path, rows)
    print(path.name, path.stat().st_size, "bytes;", len(rows), "problems,", sum(len(r["submissions"]) for r in rows),
          "submissions")  # fmt: skip


if __name__ == "__main__":
    main()
