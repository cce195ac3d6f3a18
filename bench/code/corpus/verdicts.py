"""Grade every submission of the verdict corpus (``testing/corpus/verdicts.py``) by our code
verifier (real gunicorn, real sandbox, one server per package's limits) and count agreements
per language and expected verdict.

    python -m bench.code.corpus.verdicts [--only ID-PREFIX ...] [--out /tmp/verdicts.json]

A disagreement is graded once more on its own (``verdicts.judge``: the load is no verdict).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from testing.corpus import verdicts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="submission id prefixes")
    parser.add_argument("--out", type=Path, default=Path("/tmp/verdicts.json"))
    args = parser.parse_args()
    items = [item for item in verdicts.load() if not args.only or item.id.startswith(tuple(args.only))]
    started = time.monotonic()
    found = verdicts.judge(items, Path("/tmp/verdicts-logs"))
    print(f"{len(items)} submissions graded in {time.monotonic() - started:.0f} s", file=sys.stderr)
    rows = [
        {"id": item.id, "language": item.language, "expected": item.expected, "time_limit_s": item.time_limit_s,
         "score": found[item.id][0], "error": found[item.id][1], "agrees": verdicts.agrees(item, *found[item.id]),
         "known": verdicts.KNOWN_DISAGREEMENTS.get(item.id, "")}
        for item in items
    ]  # fmt: skip
    args.out.write_text(json.dumps(rows, indent=1))
    table: Counter[tuple[str, str, bool]] = Counter((r["language"], r["expected"], r["agrees"]) for r in rows)
    for language in sorted({r["language"] for r in rows}):
        cells = []
        for expected in verdicts.ERROR_TYPES:
            agree, disagree = table[language, expected, True], table[language, expected, False]
            total = agree + disagree
            if total:
                cells.append(f"{expected} {agree}/{total}")
        print(f"{language:11} " + ", ".join(cells))
    for row in rows:
        if not row["agrees"]:
            cause = row["known"] or "NEW"
            print(f"disagrees: {row['id']}: expected {row['expected']}, got {row['score']} {row['error']} ({cause})")
    print(f"{sum(r['agrees'] for r in rows)}/{len(rows)} agree")


if __name__ == "__main__":
    main()
