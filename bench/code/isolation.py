"""What a sample's isolation costs: one sample at a time through the sandbox, in-process (no
HTTP), in another checkout (``--before``, e.g. the commit before per-sample namespaces and
cgroups) and in this one with and without cgroups, rounds interleaved, medians.

    git worktree add /tmp/before <commit>
    python -m bench.code.isolation --before /tmp/before [--rounds 5] [--samples 30]

Rows: a stdin sample of one test (``print(input())``) and of eight (each test after the
first starts afresh: a new ``/tmp`` and IPC namespace), the coin_change reference as a
call-based sample (25 calls), and an assert sample whose one call answers a 15 MiB string
(the supervisor relays it to the tests' process; since ``compared_output_bytes`` (4 MiB)
bounds an answer, it ends as ``output_limit`` once 4 MiB have crossed).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.code.before_after import run_in_sandbox_tree, sandbox_designs

# Run inside a checkout (cwd): grades each case ``samples`` times in a row, one sample at a
# time, and prints the median seconds per sample of each and the verdicts it got.
RUNNER = """
import json, sys, time
from services.code.environments import load
from services.code.grading.grader import Grader, Sample
from services.code.labels.suites import Suite
from services.code.sandbox.host import Sandbox
from services.code.settings import CodeSettings

samples, cgroups, uid_base = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
fields = {"infra_failure_score": "nan", "max_parallel": 8, "uid_base": uid_base}
if cgroups != "-":
    fields["cgroups"] = cgroups
settings = CodeSettings(**fields)
extra = [settings.cgroups] if cgroups != "-" else []
sandbox = Sandbox("bwrap", 8, settings.uid_base, *extra)
sandbox.start()
grader = Grader(settings, sandbox, 150.0)
env = load("coin_change")
big = "def big():\\n    return 'x' * (15 << 20)\\n"
cases = {
    "stdin, 1 test": Sample("print(input())", Suite("stdin", ["ok\\n"], ["ok"])),
    "stdin, 8 tests": Sample("print(input())", Suite("stdin", ["ok\\n"] * 8, ["ok"] * 8)),
    "call-based, 25 tests": Sample(env.reference, env.suite),
    "assert, a 15 MiB answer": Sample(big, Suite("assert", ["assert len(big()) == 15 << 20"], [None])),
}
medians = {}
for name, sample in cases.items():
    took, statuses = [], set()
    for _ in range(samples):
        started = time.perf_counter()
        statuses.add(grader.grade([sample])[0].status)
        took.append(time.perf_counter() - started)
    medians[name] = [sorted(took)[len(took) // 2], sorted(statuses)]
sandbox.close()
print(json.dumps(medians))
"""


def run(tree: Path, samples: int, cgroups: str, uid_base: int) -> dict[str, list]:
    return run_in_sandbox_tree(tree, RUNNER, str(samples), cgroups, str(uid_base))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier code")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--uid-base", type=int, default=400000)
    args = parser.parse_args()
    designs = sandbox_designs(args.before, "-")  # "-": a checkout without the setting
    rows: dict[str, dict[str, list[float]]] = {name: {} for name in designs}
    verdicts: dict[str, dict[str, set[str]]] = {name: {} for name in designs}
    for _ in range(args.rounds):
        for name, (tree, cgroups) in designs.items():
            for case, (seconds, statuses) in run(tree, args.samples, cgroups, args.uid_base).items():
                rows[name].setdefault(case, []).append(seconds)
                verdicts[name].setdefault(case, set()).update(statuses)
    cases = list(next(iter(rows.values())))
    print(f"one sample at a time, {args.samples} per case and round, {args.rounds} rounds, medians (ms)")
    print("| design | " + " | ".join(cases) + " |")
    print("|---|" + "---|" * len(cases))
    for name, by_case in rows.items():
        cells = []
        for case in cases:
            got = verdicts[name][case] - {"passed"}  # any other verdict is named beside the time
            note = f" ({', '.join(sorted(got))})" if got else ""
            cells.append(f"{1000 * statistics.median(by_case[case]):.1f}{note}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
