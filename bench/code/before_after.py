"""The code verifier before and after a change, side by side: rounds of [the other checkout's
service, this checkout's service, DeepGym 0.6.2], medians. The other checkout runs this
checkout's ``bench.py`` (copied in), so both grade the same samples and label styles.

    git worktree add /tmp/before <commit> && cp bench/code/bench.py /tmp/before/bench/code/
    python -m bench.code.before_after /tmp/before [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.code.bench import ENV, load  # noqa: E402

SAMPLES = 64
RUN = "import json; from bench.code.bench import {0}, samples; print(json.dumps({0}(samples({1}), 2)))"


def run_in_tree(tree: Path, code: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """``code`` run by this Python in the checkout ``tree`` (the code before or after a change);
    the JSON of its last line of output."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tree, capture_output=True, text=True, timeout=1800, env=env
    )
    if out.returncode:
        raise RuntimeError(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sandbox_designs(before: Path, before_cgroups: str) -> dict[str, tuple[Path, str]]:
    """The rows of a bench of the sandbox in-process: the checkout ``before`` (its cgroups
    setting ``before_cgroups``), then this one with cgroups off and on; each a checkout and
    the setting its runner gets."""
    return {f"before ({before})": (before, before_cgroups), "after, cgroups off": (ROOT, "off"),
            "after, cgroups (auto)": (ROOT, "auto")}  # fmt: skip


def run_in_sandbox_tree(tree: Path, code: str, *args: str) -> Any:
    """``run_in_tree`` with the checkout alone on the path and the system's binaries on
    ``PATH``, as a sandbox bench's runner needs."""
    return run_in_tree(tree, code, *args, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})


def run(tree: Path, function: str) -> dict[str, dict]:
    result = run_in_tree(tree, RUN.format(function, SAMPLES))
    return {"DeepGym 0.6.2 local": result} if "scores" in result else result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=Path, help="a checkout of the earlier code, with this bench.py copied in")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not (ROOT / ".venv-deepgym").exists():
        sys.exit("build .venv-deepgym first (see bench/code/README.md)")
    if not (args.before / ".venv-deepgym").exists():
        (args.before / ".venv-deepgym").symlink_to(ROOT / ".venv-deepgym")
    shutil.copy(ROOT / "bench" / "code" / "bench.py", args.before / "bench" / "code" / "bench.py")
    rows: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for label, tree, function in (("before", args.before, "bench_service"), ("after", ROOT, "bench_service"),
                                      ("", ROOT, "bench_deepgym")):  # fmt: skip
            for design, result in run(tree, function).items():
                rows.setdefault(f"{label}: {design}" if label else design, []).append(result)
    peer = statistics.median(SAMPLES / r["seconds"] for r in rows["DeepGym 0.6.2 local"])
    want = [score == 1.0 for score in rows["DeepGym 0.6.2 local"][0]["scores"]]
    tests = len(load(ENV).suite.tests)
    print(f"{SAMPLES} samples of {ENV} ({tests} tests each), {args.rounds} rounds, medians")
    print("| design | samples/s | x DeepGym | one sample (ms) | per test (ms) | verdicts agree |")
    print("|---|---|---|---|---|---|")
    for name, results in rows.items():
        rate = statistics.median(SAMPLES / r["seconds"] for r in results)
        single = statistics.median(r["single_s"] for r in results)
        agree = all([score == 1.0 for score in r["scores"]] == want for r in results)
        print(
            f"| {name} | {rate:.1f} | {rate / peer:.1f} | {1000 * single:.1f} | {1000 * single / tests:.2f} | {agree} |"
        )


if __name__ == "__main__":
    main()
