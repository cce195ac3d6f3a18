"""Grade every corpus item twice, under the harness its data was published with
(``testing/corpus/reference.py``) and by our code verifier (real gunicorn, real sandbox),
and list every disagreement.

    python -m bench.code.corpus.compare [--only ID ...] [--kind stdin] [--out results.json]

A disagreement is graded once more on its own (to tell load from a verdict), and its tests
one per sample (which test fails, and how).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from testing import corpus  # noqa: E402
from testing.corpus import reference  # noqa: E402
from testing.server import gunicorn_server  # noqa: E402

BATCH = 16


def per_test(url: str, item: corpus.Item) -> list[str | None]:
    """Each of the item's tests graded as a sample of its own: which fail, and how."""
    if item.kind == "stdin":
        labels = [{"tests": [test]} for test in item.label["tests"]]
    elif item.kind == "mbpp":
        labels = [{**item.label, "test": [test]} for test in item.label["test"]]
    else:
        return []
    singles = [corpus.Item(f"{item.id}#{n}", item.kind, item.code, label) for n, label in enumerate(labels, 1)]
    return [error for _, error in corpus.grade(url, singles)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="item ids")
    parser.add_argument("--kind", choices=["human_eval", "mbpp", "stdin"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/corpus-results.json"))
    parser.add_argument("--reference-workers", type=int, default=2)
    args = parser.parse_args()

    items = [
        item
        for item in corpus.load()
        if (not args.only or item.id in args.only) and (not args.kind or item.kind == args.kind)
    ]
    started = time.monotonic()
    with ThreadPoolExecutor(args.reference_workers) as pool:
        refs = list(pool.map(lambda item: reference.run(item.kind, item.code, item.reference), items))
    print(f"reference: {time.monotonic() - started:.0f} s", file=sys.stderr)

    started = time.monotonic()
    ours: list[tuple[float, str | None]] = []
    results: list[dict[str, Any]] = []
    with gunicorn_server("code", corpus.SERVER_ENV, threads=64, log_dir=Path("/tmp/corpus-logs")) as server:
        for start in range(0, len(items), BATCH):
            ours += corpus.grade(server.url, items[start : start + BATCH])
        print(f"ours: {time.monotonic() - started:.0f} s", file=sys.stderr)
        for item, ref, (score, error) in zip(items, refs, ours, strict=True):
            row: dict[str, Any] = {
                "id": item.id,
                "kind": item.kind,
                "reference": ref.detail,
                "reference_passed": ref.passed,
                "ours": score,
                "ours_error": error,
            }
            if (score == 1.0) != ref.passed:
                alone = corpus.grade(server.url, [item])[0]
                row["ours_alone"] = list(alone)
                row["ours_per_test"] = per_test(server.url, item)
            elif item.kind == "stdin" and not ref.passed:
                # Both fail it: do they fail the same tests?
                ours_tests = per_test(server.url, item)
                ref_tests = reference.stdin_tests(item.code, item.reference["tests"])
                differ = [
                    f"test {n}: reference {r}, ours {o or 'passed'}"
                    for n, (r, o) in enumerate(zip(ref_tests, ours_tests, strict=True), 1)
                    if (r == "passed") != (o is None)
                ]
                if differ:
                    row["tests_differ"] = differ
            results.append(row)

    args.out.write_text(json.dumps(results, indent=1))
    summary: dict[str, Counter] = {}
    for row in results:
        count = summary.setdefault(row["kind"], Counter())
        count["items"] += 1
        count["reference 1.0"] += row["reference_passed"]
        count["ours 1.0"] += row["ours"] == 1.0
        count["disagree"] += (row["ours"] == 1.0) != row["reference_passed"]
    for kind, count in summary.items():
        print(kind, dict(count))
    for row in results:
        if (row["ours"] == 1.0) != row["reference_passed"] or "tests_differ" in row:
            cause = corpus.KNOWN_DISAGREEMENTS.get(row["id"]) or (
                "load-dependent" if row["id"] in corpus.LOAD_DEPENDENT else "NEW"
            )
            print(json.dumps({"cause": cause, **{k: row[k] for k in row if k != "kind"}}))


if __name__ == "__main__":
    main()
