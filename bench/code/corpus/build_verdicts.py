"""Build the verdict corpus's data file (``testing/corpus/verdicts.jsonl.gz``) from local git
mirrors of the contest archives it comes from. Reproducible: same commits, same bytes.

    python -m bench.code.corpus.build_verdicts --problemtools MIRROR.git \\
        --rmrc2018 MIRROR.git --rmrc2019 MIRROR.git --rmrc2022 MIRROR.git

Each problem is a Kattis problem package: ``data/{sample,secret}/*.in`` with ``.ans``,
``problem.yaml`` (validator flags, memory limit, licence), the time limit (``.timelimit``),
and ``submissions/<expected verdict>/*`` in several languages. Taken: the tests, the settings,
the submissions and a custom output validator (which judges its problem), no other tool of theirs.
"""

from __future__ import annotations

import argparse
import ast
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

import yaml

from bench.code.corpus.build import OUT, git, write_jsonl_gz


@dataclass(frozen=True)
class Archive:
    """A repository's problems taken into the corpus, at one commit."""

    name: str  # short id, the first part of each problem's id
    repository: str
    commit: str
    problems: tuple[str, ...]  # package directories
    # The time limit of packages that state none (problemtools sets it from the accepted
    # submissions' times: a second at the least, which every package here gets).
    default_time_limit_s: float = 0.0


# Problems with default output validation (or a custom validator that compares what the
# default compares), small test data (a few hundred KB at most), and a time limit.
ARCHIVES = {
    "problemtools": Archive(
        "problemtools",
        "Kattis/problemtools",
        "a185fe9741dd28ba838a7bd21ab98b11211f6521",
        ("examples/different", "examples/hello"),
        default_time_limit_s=1.0,
    ),
    "rmrc2018": Archive(
        "rmrc2018",
        "icpc/na-rocky-mountain-2018-public",
        "416a94258f99ab68ff7d9777faca55c94cdaf5f5",
        tuple(
            f"problems/{p}"
            for p in ("drivinglanes", "forestforthetrees", "gwensgift", "plowking", "qaly", "smallschedule")
        ),
    ),
    "rmrc2019": Archive(
        "rmrc2019",
        "icpc/na-rocky-mountain-2019-public",
        "daff77263decd076147dda943d5720ced65b6f3a",
        tuple(f"problems/{p}" for p in ("biggesttriangle", "lostlineup", "watchlater")),
    ),
    "rmrc2022": Archive(
        "rmrc2022",
        "icpc/na-rocky-mountain-2022-2023-public",
        "f89e714870361724a4bd8359fb552464439a938d",
        tuple(
            f"problems/{p}"
            for p in (
                "blueberrywaffle",
                "champernownecount",
                "familyvisits",
                "icouldhavewon",
                "profitabletrip",
                "sunandmoon",
            )
        ),
    ),
}

# A submissions directory to the verdict it expects (the package format's names, and the
# 2018 archive's ``time_limit`` and ``runtime_error``). Directories of no single verdict
# (``slow_accepted``: accepted or too slow; ``slow_do_not_use_for_tle``,
# ``time_limit_exceeded_not_needed``; ``partially_accepted``) are left out.
EXPECTED = {
    "accepted": "accepted",
    "wrong_answer": "wrong_answer",
    "time_limit_exceeded": "time_limit_exceeded",
    "time_limit": "time_limit_exceeded",
    "run_time_error": "run_time_error",
    "runtime_error": "run_time_error",
}
# A file's extension to the language we grade it in; others (Scala, C#, Haskell, ...) are left out.
LANGUAGE = {".c": "c", ".cc": "cpp", ".cpp": "cpp", ".java": "java", ".go": "go", ".rs": "rust", ".js": "javascript",
            ".py": "python"}  # fmt: skip


def python3(source: str) -> bool:
    """Whether a ``.py`` submission is Python 3 (Kattis runs a Python 2 one as Python 2, which we do not)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            ast.parse(source)
    except SyntaxError:
        return False
    return True


INCLUDE = re.compile(r'^#include "([^"/]+)"\n', re.M)


def validator_source(package: str, files: list[str], show: Callable[[str], str]) -> str:
    """A custom output validator as one C++ source a label carries: its one ``.cc`` file in
    ``output_validators/<name>/`` (``output_validator/`` in newer packages), each header of
    its folder it includes put in the place of its ``#include "..."``."""
    folders = (f"{package}/output_validators/", f"{package}/output_validator/")
    [source] = [f for f in files if f.startswith(folders) and f.endswith(".cc")]
    folder = source.rpartition("/")[0]
    return INCLUDE.sub(lambda include: show(f"{folder}/{include.group(1)}") + "\n", show(source))


def problem_row(mirror: str, archive: Archive, package: str) -> tuple[dict, list[str]]:
    """One problem's row, and what was left out of it (and why): a package with a custom
    output validator (``validation: custom``, or an interactive problem's) has its ``validator``."""
    commit = archive.commit
    files = git(mirror, "ls-tree", "-r", "--name-only", commit, package).decode().splitlines()

    def show(path: str) -> str:
        return git(mirror, "show", f"{commit}:{path}").decode()

    settings = yaml.safe_load(show(f"{package}/problem.yaml")) or {}
    limit_file = f"{package}/.timelimit"
    time_limit = float(show(limit_file).strip()) if limit_file in files else archive.default_time_limit_s
    assert time_limit > 0, package
    tests = []
    for group in ("sample", "secret"):  # the order Kattis judges them in
        inputs = sorted(f for f in files if f.startswith(f"{package}/data/{group}/") and f.endswith(".in"))
        for path in inputs:
            answer = path[: -len(".in")] + ".ans"
            assert answer in files, answer
            name = path[len(f"{package}/data/") : -len(".in")]
            tests.append({"name": name, "input": show(path), "output": show(answer)})
    submissions, left_out = [], []
    for path in sorted(f for f in files if f.startswith(f"{package}/submissions/")):
        parts = PurePosixPath(path).relative_to(package).parts
        directory, suffix = parts[1], PurePosixPath(path).suffix
        if directory not in EXPECTED or len(parts) != 3 or suffix not in LANGUAGE:
            why = "no single verdict" if directory not in EXPECTED else "not a language we grade"
            left_out.append(f"{path}: {why}")
            continue
        code = show(path)
        if LANGUAGE[suffix] == "python" and not python3(code):
            left_out.append(f"{path}: Python 2")
            continue
        submissions.append(
            {"path": "/".join(parts[1:]), "expected": EXPECTED[directory], "language": LANGUAGE[suffix], "code": code}
        )
    row = {
        "id": f"{archive.name}/{PurePosixPath(package).name}",
        "repository": archive.repository,
        "commit": commit,
        "path": package,
        "name": settings.get("name", ""),
        "source": settings.get("source", ""),
        "author": settings.get("author", ""),
        "rights_owner": settings.get("rights_owner", ""),
        "license": settings.get("license", ""),
        "validation": settings.get("validation", "default"),
        "validator_flags": settings.get("validator_flags", "") or "",
        "time_limit_s": time_limit,
        "memory_mb": (settings.get("limits") or {}).get("memory", 0),
        "tests": tests,
        "submissions": submissions,
    }
    if row["validation"].startswith("custom") or settings.get("type") == "interactive":
        row["validator"] = validator_source(package, files, show)
    return row, left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, archive in ARCHIVES.items():
        parser.add_argument(f"--{name}", required=True, help=f"git dir of {archive.repository}")
    args = parser.parse_args()
    write_rows("verdicts.jsonl.gz", [(getattr(args, name), archive) for name, archive in ARCHIVES.items()])


def write_rows(name: str, sources: list[tuple[str, Archive]], rename: dict[str, str] | None = None) -> None:
    """Write the rows of every package of ``sources`` (a mirror and its archive) to ``OUT/name``,
    a row's keys renamed by ``rename`` (at the end of the row), saying what was left out."""
    rows = []
    for mirror, archive in sources:
        for package in archive.problems:
            row, left_out = problem_row(mirror, archive, package)
            renamed = {new: row.pop(old) for old, new in (rename or {}).items()}
            rows.append({**row, **renamed})
            for line in left_out:
                print(f"left out {archive.repository} {line}")
    path = OUT / name
    write_jsonl_gz(path, rows)
    print(path.name, path.stat().st_size, "bytes;", len(rows), "problems,", sum(len(r["submissions"]) for r in rows),
          "submissions")  # fmt: skip


if __name__ == "__main__":
    main()
