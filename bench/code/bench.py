"""Code verifier throughput: our service vs a fresh python3 per test vs DeepGym 0.6.2 (local).

All three grade the same coin_change solutions (correct and wrong ones) and must agree on
which pass. Usage (from the repo root, with .venv active and .venv-deepgym built):

    python -m bench.code.bench [--samples 64] [--parallel 2]

The service gets one sample per request, each on a new connection, as OpenRLHF sends them.
The client shares the cores with the service here (a trainer's client runs on its own node),
so it is ``http.client``, which costs a fraction of a millisecond of CPU per request;
``BENCH_CODE_CLIENT=requests`` uses ``requests.post`` (a ``Session`` per call, about 1 ms of
CPU each), as OpenRLHF's client does. The service's work is the same either way.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from services.code.environments import load  # noqa: E402
from services.code.judging.comparison import result_matches  # noqa: E402
from testing.server import gunicorn_server  # noqa: E402

ENV = "coin_change"
SOLUTIONS = {
    "dp": load(ENV).reference,
    "bfs": (
        "from collections import deque\n\ndef coin_change(coins, amount):\n    seen = {0}\n"
        "    todo = deque([(0, 0)])\n    while todo:\n        value, steps = todo.popleft()\n"
        "        if value == amount:\n            return steps\n"
        "        for c in coins:\n            if value + c <= amount and value + c not in seen:\n"
        "                seen.add(value + c)\n                todo.append((value + c, steps + 1))\n    return -1\n"
    ),
    "greedy (wrong)": (
        "def coin_change(coins, amount):\n    count = 0\n    for c in sorted(coins, reverse=True):\n"
        "        count += amount // c\n        amount %= c\n    return count if amount == 0 else -1\n"
    ),
    "zero (wrong)": "def coin_change(coins, amount):\n    return 0\n",
    "crash": "def coin_change(coins, amount):\n    return coins[amount]\n",
    "syntax error": "def coin_change(coins, amount)\n    return 0\n",
}
HARNESS = (
    "import json, sys\ndata = json.load(sys.stdin)\nns = {}\nexec(data['code'], ns)\n"
    "print(json.dumps({'result': ns[data['fn']](*data['args'])}))"
)


def samples(count: int) -> list[str]:
    names = list(SOLUTIONS)
    return [names[i % len(names)] for i in range(count)]


def assert_labels() -> dict[str, dict]:
    """The environment's tests as assert labels: MBPP style (one test per assert) and
    HumanEval style (one ``check`` with every assert: one test)."""
    suite = load(ENV).suite
    asserts = [f"assert {suite.fn_name}(*{args!r}) == {want!r}" for args, want in zip(suite.tests, suite.expected)]
    check = "def check(candidate):\n" + "".join(f"    {a.replace(suite.fn_name, 'candidate', 1)}\n" for a in asserts)
    return {
        "assert, one test per assert": {"test": asserts},
        "assert, one check()": {"test": check, "entry_point": suite.fn_name},
    }


def post_http(url: str, body: dict) -> dict:
    """POST ``body`` as JSON on a new connection; the answer's JSON."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    try:
        conn.request("POST", parts.path, json.dumps(body), {"Content-Type": "application/json"})
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def post_requests(url: str, body: dict) -> dict:
    return requests.post(url, json=body, timeout=300).json()


CLIENTS = {"http.client": post_http, "requests": post_requests}


def bench_service(names: list[str], parallel: int) -> dict[str, dict]:
    """One sample per request, all at once, as OpenRLHF sends them: call-based labels (the
    environment's), then the same tests as assert labels."""
    # The grader's throughput past what admission would take on (services/code/README.md#admission).
    env = {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan", "SCORER_CODE_ENV": ENV, "SCORER_CODE_ADMISSION": "off"}
    labels = {"call-based": {}, **assert_labels()}
    post = CLIENTS[os.environ.get("BENCH_CODE_CLIENT", "http.client")]
    results = {}
    with gunicorn_server("code", env, threads=256) as server:
        url = server.url + "/reward/score"
        isolation = requests.get(server.url + "/info").json()["model"]["isolation"]
        for style, label in labels.items():

            def one(name: str, label: dict = label) -> float:
                body = {"outputs": [f"```python\n{SOLUTIONS[name]}```"], "prompts": ["p"], "labels": [label]}
                return post(url, body)["rewards"][0]

            one("dp")
            single = timed(lambda: one("dp"))
            with ThreadPoolExecutor(max(parallel, 64)) as pool:
                start = time.perf_counter()
                scores = list(pool.map(one, names))
                seconds = time.perf_counter() - start
            results[f"service, {style} (warm zygote, bwrap)"] = {
                "scores": scores, "seconds": seconds, "single_s": single, "isolation": isolation
            }  # fmt: skip
    return results


def timed(fn, repeat: int = 5) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def bench_fresh_python(names: list[str], parallel: int) -> dict:
    """The simple baseline: a fresh python3 per test, no isolation, compared here."""
    suite = load(ENV).suite

    def one(name: str) -> float:
        passed = 0
        for args, expected in zip(suite.tests, suite.expected, strict=True):
            data = json.dumps({"code": SOLUTIONS[name], "fn": suite.fn_name, "args": args})
            run = subprocess.run(
                ["python3", "-I", "-c", HARNESS], input=data, capture_output=True, text=True, timeout=10
            )
            with contextlib.suppress(ValueError, KeyError):
                passed += run.returncode == 0 and result_matches(json.loads(run.stdout)["result"], expected)
        return passed / len(suite.tests)

    single = timed(lambda: one("dp"), repeat=3)
    with ThreadPoolExecutor(parallel) as pool:
        start = time.perf_counter()
        scores = list(pool.map(one, names))
        seconds = time.perf_counter() - start
    return {"scores": scores, "seconds": seconds, "single_s": single, "isolation": "none"}


def bench_deepgym(names: list[str], parallel: int) -> dict:
    python = ROOT / ".venv-deepgym" / "bin" / "python"
    job = json.dumps({"env": ENV, "solutions": [SOLUTIONS[n] for n in names], "max_parallel": parallel})
    out = subprocess.run(
        [str(python), str(Path(__file__).with_name("deepgym_runner.py"))],
        input=job, capture_output=True, text=True, timeout=900, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    single_job = json.dumps({"env": ENV, "solutions": [SOLUTIONS["dp"]], "max_parallel": 1})
    single = subprocess.run(
        [str(python), str(Path(__file__).with_name("deepgym_runner.py"))],
        input=single_job, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return {**result, "single_s": json.loads(single.stdout)["seconds"], "isolation": "bwrap (DeepGym local)"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=2, help="concurrency of the baseline and DeepGym")
    args = parser.parse_args()
    names = samples(args.samples)
    tests = len(load(ENV).suite.tests)
    results = {
        **bench_service(names, args.parallel),
        "fresh python3 per test": bench_fresh_python(names, args.parallel),
        "DeepGym 0.6.2 local": bench_deepgym(names, args.parallel),
    }
    verdicts = {design: [score == 1.0 for score in r["scores"]] for design, r in results.items()}
    agree = len({tuple(v) for v in verdicts.values()}) == 1
    print(f"{args.samples} samples of {ENV} ({tests} tests each), {len(SOLUTIONS)} solutions, {os.cpu_count()} cores")
    print("| design | isolation | samples/s | one sample (s) | per test (ms) |")
    print("|---|---|---|---|---|")
    for design, r in results.items():
        rate, single = args.samples / r["seconds"], r["single_s"]
        print(f"| {design} | {r['isolation']} | {rate:.1f} | {single:.3f} | {1000 * single / tests:.2f} |")
    print(f"verdicts agree: {agree}")
    for name in SOLUTIONS:
        index = names.index(name)
        print(f"  {name}: " + ", ".join(f"{d.split(' (')[0]}={r['scores'][index]:.2f}" for d, r in results.items()))
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "code.json").write_text(json.dumps({"agree": agree, "results": results}, indent=1))
    if not agree:
        sys.exit(1)


if __name__ == "__main__":
    main()
