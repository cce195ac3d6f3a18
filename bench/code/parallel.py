"""How many runs at once (``max_parallel``): correct programs that need CPU, many in one request.

One request of ``--copies`` copies of a correct stdin program that needs 0.75 s of CPU, under
the default limits (4 s CPU, 10 s wall per test), for each ``max_parallel``, in another
checkout (``--before``) and this one; then the 64 coin_change samples' throughput (one per
request, all at once) at each ``max_parallel`` in this one.

    git worktree add /tmp/before <commit>
    python -m bench.code.parallel --before /tmp/before [--slots 2 8 32] [--copies 31]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bench.code.before_after import run_in_tree

ROOT = Path(__file__).resolve().parents[2]

# Run inside a checkout (cwd): one server at ``max_parallel``, the request, its outcome.
RUNNER = """
import json, sys, time
import requests
from testing.server import gunicorn_server

slots, copies = sys.argv[1], int(sys.argv[2])
code = "import time\\nend = time.process_time() + 0.75\\nwhile time.process_time() < end:\\n    pass\\nprint('ok')"
# The grader's throughput past what admission would take on (services/code/README.md#admission).
env = {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan", "SCORER_CODE_MAX_PARALLEL": slots, "SCORER_CODE_ADMISSION": "off"}
label = {"inputs": [""], "outputs": ["ok"]}
with gunicorn_server("code", env, threads=64) as server:
    body = {"outputs": [f"```python\\n{code}\\n```"] * copies, "prompts": ["p"] * copies, "labels": [label] * copies}
    started = time.perf_counter()
    out = requests.post(server.url + "/reward/score", json=body, timeout=300).json()
    took = time.perf_counter() - started
print(json.dumps({"passed": out["rewards"].count(1.0), "seconds": took,
                  "errors": sorted(set(e for e in out["error_types"] if e))}))
"""
THROUGHPUT = """
import json, sys
from bench.code.bench import bench_service, samples
print(json.dumps(bench_service(samples(64), 2)))
"""


def run(tree: Path, code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    return run_in_tree(tree, code, *args, env={**os.environ, "PYTHONPATH": str(tree), **(env or {})})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier code")
    parser.add_argument("--slots", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--copies", type=int, default=31)
    args = parser.parse_args()
    print(f"{args.copies} copies of a correct program needing 0.75 s of CPU in one request, {os.cpu_count()} cores")
    print("| checkout | max_parallel | passed | request (s) | other verdicts |")
    print("|---|---|---|---|---|")
    for slots in args.slots:
        for name, tree in (("before", args.before), ("after", ROOT)):
            got = run(tree, RUNNER, str(slots), str(args.copies))
            errors = ", ".join(got["errors"]) or "-"
            print(f"| {name} | {slots} | {got['passed']}/{args.copies} | {got['seconds']:.1f} | {errors} |")
    print("\n64 coin_change samples, one per request, all at once (this checkout)")
    print("| max_parallel | label | samples/s |")
    print("|---|---|---|")
    for slots in args.slots:
        results = run(ROOT, THROUGHPUT, env={"SCORER_CODE_MAX_PARALLEL": str(slots)})
        for design, result in results.items():
            print(f"| {slots} | {design} | {64 / result['seconds']:.1f} |")


if __name__ == "__main__":
    main()
