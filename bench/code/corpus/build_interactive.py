"""Build the interactive part of the verdict corpus (``testing/corpus/interactive.jsonl.gz``)
from a local git mirror of Kattis/problemtools. Reproducible: same commit, same bytes.

    python -m bench.code.corpus.build_interactive --problemtools MIRROR.git

Each problem is an interactive Kattis problem package, read as ``build_verdicts`` reads one
(tests, settings, submissions by verdict), its output validator the interactor (one source a
label carries: ``validate.cc`` with problemtools' ``validate.h`` in the place of its
``#include``).
"""

from __future__ import annotations

import argparse

from bench.code.corpus.build import OUT, write_jsonl_gz
from bench.code.corpus.build_verdicts import ARCHIVES, Archive, problem_row

GUESS = Archive(
    "problemtools",
    "Kattis/problemtools",
    ARCHIVES["problemtools"].commit,
    ("examples/guess",),
    default_time_limit_s=1.0,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problemtools", required=True, help="git dir of Kattis/problemtools")
    args = parser.parse_args()
    rows = []
    for package in GUESS.problems:
        row, left_out = problem_row(args.problemtools, GUESS, package)
        validator = row.pop("validator")
        rows.append({**row, "interactor": validator})
        for line in left_out:
            print(f"left out {GUESS.repository} {line}")
    path = OUT / "interactive.jsonl.gz"
    write_jsonl_gz(path, rows)
    print(path.name, path.stat().st_size, "bytes;", len(rows), "problems,", sum(len(r["submissions"]) for r in rows),
          "submissions")  # fmt: skip


if __name__ == "__main__":
    main()
