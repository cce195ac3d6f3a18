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

from bench.code.corpus.build_verdicts import ARCHIVES, Archive, write_rows

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
    write_rows("interactive.jsonl.gz", [(args.problemtools, GUESS)], rename={"validator": "interactor"})


if __name__ == "__main__":
    main()
