"""Build the false-negative corpus's data files (``testing/corpus/``) from local git
mirrors of the repositories they are published in. Reproducible: same commits, same bytes.

    python -m bench.code.corpus.build --codecontests MIRROR.git --mbpp MIRROR.git

Only data is taken: each problem's accepted solution and its tests, never a harness.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
from pathlib import Path

OUT = Path(__file__).resolve().parents[3] / "testing" / "corpus"

# justinchiu-test/codecontests-repo: 300 CodeContests problems (DeepMind, CC BY 4.0), each with
# the dataset's accepted Python solution (main.py) and its first 10 tests, run by its run.sh.
CODECONTESTS_COMMIT = "a366655d4c8b7ab29805e625b943d8d8dbe0d68e"
CODECONTESTS_DIR = "problems_original"
# OckBench/OckBench: a copy of MBPP's mbpp.jsonl (974 problems, Google, CC BY 4.0).
MBPP_COMMIT = "b72752a0ba5989d3c212675ec60d3eedcd838628"
MBPP_PATH = "data/mbpp.jsonl"


def git(mirror: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", mirror, *args], check=True, capture_output=True).stdout


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    # mtime=0: the same rows give the same bytes.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as out:
        for row in rows:
            out.write((json.dumps(row, ensure_ascii=False) + "\n").encode())


def codecontests(mirror: str, commit: str) -> list[dict]:
    files = git(mirror, "ls-tree", "-r", "--name-only", commit, CODECONTESTS_DIR).decode().splitlines()
    problems = sorted({Path(f).parent for f in files if f.endswith("/main.py")})
    rows = []
    for problem in problems:
        tests_dir = f"{problem}/tests/"
        numbers = sorted(int(m[1]) for f in files if (m := re.fullmatch(re.escape(tests_dir) + r"input_(\d+)\.txt", f)))
        # run.sh runs input_1 .. input_N with N the number of input files.
        assert numbers == list(range(1, len(numbers) + 1)), problem
        tests = [
            {
                "input": git(mirror, "show", f"{commit}:{tests_dir}input_{n}.txt").decode(),
                "output": git(mirror, "show", f"{commit}:{tests_dir}output_{n}.txt").decode(),
            }
            for n in numbers
        ]
        code = git(mirror, "show", f"{commit}:{problem}/main.py").decode()
        rows.append({"name": problem.name, "path": str(problem), "code": code, "tests": tests})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codecontests", required=True, help="git dir of justinchiu-test/codecontests-repo")
    parser.add_argument("--mbpp", required=True, help="git dir of OckBench/OckBench")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    write_jsonl_gz(OUT / "codecontests.jsonl.gz", codecontests(args.codecontests, CODECONTESTS_COMMIT))
    mbpp = [json.loads(line) for line in git(args.mbpp, "show", f"{MBPP_COMMIT}:{MBPP_PATH}").decode().splitlines()]
    write_jsonl_gz(OUT / "mbpp.jsonl.gz", mbpp)
    for name in ("codecontests.jsonl.gz", "mbpp.jsonl.gz"):
        print(name, (OUT / name).stat().st_size, "bytes")


if __name__ == "__main__":
    main()
