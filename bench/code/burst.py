"""A trainer's burst at the code verifier (issue 37): ``--requests`` concurrent one-sample
requests of ``coin_change``'s correct solution (25 tests), as OpenRLHF sends them, beside
DeepGym 0.6.2's OpenRLHF router and the service before admission by measured rate.

Each server is pinned to the same 2 cores and started afresh each round, with one sample
graded first (its warm-up). The client is OpenRLHF's: one request per sample, all at once,
180 s per attempt, 5 attempts 1 s apart, any failure retried; a sample left without a reward
after them, or rewarded NaN (no verdict), is lost. The base's service is also asked by a
client that retries, 1 s apart, until it is served. Rows per round: this checkout's service,
DeepGym's router (local mode, ``max_parallel`` 32), then the checkout ``before``. Usage:

    git worktree add /tmp/before-37 40d4ae2
    python -m bench.code.burst /tmp/before-37 --requests 256 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.code.bench import ENV, SOLUTIONS, load  # noqa: E402
from testing.server import free_port  # noqa: E402

CPUS = "0,1"
PROMPT = "Write coin_change(coins, amount): the fewest coins that make the amount, or -1.\n"
BODY = json.dumps({"query": [f"{PROMPT}```python\n{SOLUTIONS['dp']}```"], "prompts": [PROMPT], "labels": [{}]})
# OpenRLHF's remote reward client: 180 s per attempt, 5 attempts, 1 s apart.
ATTEMPT_S = 180.0
ATTEMPTS = 5
PAUSE_S = 1.0
# A client that retries until served gives up here all the same, so that a round ends.
UNTIL_SERVED_S = 900.0
LOGS = "/tmp/bench-burst"
# The code service of a checkout, run from that checkout, until SIGTERM.
SERVE = (
    "import signal, sys; sys.path.insert(0, sys.argv[1]); from testing.server import gunicorn_server\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "with gunicorn_server('code', port=int(sys.argv[2])):\n    print('ready', flush=True); signal.pause()"
)


def post(port: int) -> float | None:
    """One attempt at the server on ``port``: the sample's reward, or ``None`` for any failure
    (refused, an error status, a connection that failed)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ATTEMPT_S)
    try:
        conn.request("POST", "/reward/score", BODY, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        return json.loads(answer)["rewards"][0] if response.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def ask(port: int, attempts: int | None) -> tuple[float | None, int]:
    """One sample, retried ``PAUSE_S`` apart up to ``attempts`` times (``None``: until served);
    its reward (``None`` if never served) and the attempts it took."""
    given_up = time.monotonic() + UNTIL_SERVED_S
    tries = 0
    while True:
        tries += 1
        reward = post(port)
        if reward is not None or tries == attempts or time.monotonic() > given_up:
            return reward, tries
        time.sleep(PAUSE_S)


def burst(port: int, count: int, attempts: int | None) -> dict[str, float]:
    """``count`` samples at once; what came of them, and when the last came back."""
    ask(port, None)  # the warm-up sample
    started = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(lambda _: ask(port, attempts), range(count)))
    seconds = time.perf_counter() - started
    rewards = [reward for reward, _ in answers]
    lost = sum(reward is None or math.isnan(reward) for reward in rewards)
    return {"correct": rewards.count(1.0), "lost": lost, "seconds": seconds,
            "per_s": (count - lost) / seconds, "attempts": sum(tries for _, tries in answers)}  # fmt: skip


@contextlib.contextmanager
def pinned(
    command: list[str], cwd: Path, env: dict[str, str], ready: Callable[[subprocess.Popen], None]
) -> Iterator[None]:
    """``command`` on the bench's cores until ``ready`` returns, then until the block ends."""
    process = subprocess.Popen(
        ["taskset", "-c", CPUS, *command], cwd=cwd, env={**os.environ, **env},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        ready(process)
        yield
    finally:
        process.terminate()
        process.wait(timeout=60)


def started(process: subprocess.Popen) -> None:
    if process.stdout.readline() != "ready\n":
        raise RuntimeError(f"the code service did not start (logs in {LOGS})")


def code_service(tree: Path, port: int) -> contextlib.AbstractContextManager[None]:
    """The code service of the checkout ``tree`` on its defaults, grading ``ENV``'s tests."""
    env = {"SCORER_CODE_ENV": ENV, "SCORER_CODE_INFRA_FAILURE_SCORE": "nan", "SCORER_TEST_LOGS": LOGS}
    command = [sys.executable, "-c", SERVE, str(tree), str(port)]
    return pinned(command, tree, env, started)


def deepgym_router(port: int) -> contextlib.AbstractContextManager[None]:
    """DeepGym 0.6.2's OpenRLHF router (``deepgym_openrlhf.py``), once it answers."""

    def listening(process: subprocess.Popen) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(requests.RequestException):
                requests.get(f"http://127.0.0.1:{port}/docs", timeout=2)
                return
            time.sleep(0.2)
        raise RuntimeError("DeepGym's router did not start")

    command = [str(ROOT / ".venv-deepgym" / "bin" / "python"), str(Path(__file__).with_name("deepgym_openrlhf.py"))]
    return pinned([*command, str(port)], ROOT, {}, listening)


def one_round(before: Path, count: int) -> dict[str, dict[str, float]]:
    """Each server afresh on a port of its own, the same burst at each."""
    rows = {}
    with code_service(ROOT, port := free_port()):
        rows["this service, OpenRLHF's 5 attempts"] = burst(port, count, ATTEMPTS)
    with deepgym_router(port := free_port()):
        rows["DeepGym 0.6.2 OpenRLHF router, 5 attempts"] = burst(port, count, ATTEMPTS)
    with code_service(before, port := free_port()):
        rows["before, retried until served"] = burst(port, count, None)
        rows["before, OpenRLHF's 5 attempts"] = burst(port, count, ATTEMPTS)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=Path, help="a checkout of the service before admission by measured rate")
    parser.add_argument("--requests", type=int, default=256, help="one-sample requests sent at once")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every row; medians")
    args = parser.parse_args()
    if not (ROOT / ".venv-deepgym" / "bin" / "uvicorn").exists():
        sys.exit("build .venv-deepgym with deepgym[server] first (see bench/code/README.md)")
    if not (args.before / ".sandbox-packages").exists():  # the graded programs' packages, as installed here
        (args.before / ".sandbox-packages").symlink_to(ROOT / ".sandbox-packages")
    load_at_start = os.getloadavg()[0]
    rounds: dict[str, list[dict[str, float]]] = {}
    for number in range(args.rounds):
        for name, row in one_round(args.before, args.requests).items():
            rounds.setdefault(name, []).append(row)
            print(f"round {number + 1}: {name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    peer = statistics.median(r["per_s"] for r in rounds["DeepGym 0.6.2 OpenRLHF router, 5 attempts"])
    tests = len(load(ENV).suite.tests)
    commit = subprocess.run(
        ["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    print(f"{args.requests} one-sample requests of {ENV}'s correct solution ({tests} tests), at once, "
          f"{args.rounds} rounds, medians; load average {load_at_start:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print("| design | scored 1.0 | lost | completion (s) | (rounds' range) | samples/s | x DeepGym | attempts |")
    print("|---|---|---|---|---|---|---|---|")
    for name, results in rounds.items():
        row = {key: statistics.median(r[key] for r in results) for key in results[0]}
        spread = f"{min(r['seconds'] for r in results):.1f}-{max(r['seconds'] for r in results):.1f}"
        name = name.replace("before", f"before ({commit.stdout.strip() or args.before})")
        counts = f"{row['correct']:.0f} | {row['lost']:.0f}"
        rate = f"{row['per_s']:.1f} | {row['per_s'] / peer:.1f}"
        print(f"| {name} | {counts} | {row['seconds']:.1f} | {spread} | {rate} | {row['attempts']:.0f} |")


if __name__ == "__main__":
    main()
