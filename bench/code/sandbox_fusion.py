"""SandboxFusion's ``/run_code`` beside the graded path: runs/s and latency of an A+B program in
Python and in C++ (built once, then run per test case).

Against one running code service: ``--cases`` test cases per language, posted to ``/run_code``
one per call, ``--concurrency`` at a time, each on a new connection (``requests.post``, as
verl's ``call_sandbox_api`` sends them); then the same cases through the graded path
(``/reward/score``), ``--tests`` per sample, one sample per request. Each answer is checked.

    python -m bench.code.sandbox_fusion [--cases 200] [--concurrency 16] [--tests 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

from testing.server import gunicorn_server

PROGRAMS = {
    "python": ("python", "a, b = map(int, input().split())\nprint(a + b)"),
    "cpp": ("cpp", "#include <iostream>\nint main(){long long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}"),
}
ENV = {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan"}


def run_code(url: str, language: str, code: str, case: int) -> float:
    """One verl-style call; its latency in seconds."""
    body = {"code": code, "language": language, "stdin": f"{case} {case + 1}\n", "compile_timeout": 10,
            "run_timeout": 10, "memory_limit_MB": 1024, "files": {}, "fetch_files": []}  # fmt: skip
    started = time.perf_counter()
    answer = requests.post(url + "/run_code", json=body, timeout=300).json()
    took = time.perf_counter() - started
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == f"{2 * case + 1}\n", answer
    return took


def graded(url: str, tag: str, code: str, first: int, tests: int) -> float:
    """One sample of ``tests`` cases through ``/reward/score``; its latency in seconds."""
    cases = range(first, first + tests)
    label = {"inputs": [f"{i} {i + 1}\n" for i in cases], "outputs": [f"{2 * i + 1}\n" for i in cases]}
    body = {"outputs": [f"```{tag}\n{code}\n```"], "prompts": ["p"], "labels": [label]}
    started = time.perf_counter()
    answer = requests.post(url + "/reward/score", json=body, timeout=300).json()
    took = time.perf_counter() - started
    assert answer["rewards"] == [1.0], answer
    return took


def measure(calls: list, concurrency: int) -> tuple[float, list[float]]:
    """Wall seconds for all ``relay`` (``concurrency`` at a time) and each one's latency."""
    with ThreadPoolExecutor(concurrency) as pool:
        started = time.perf_counter()
        latencies = list(pool.map(lambda call: call(), calls))
        return time.perf_counter() - started, latencies


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def bench(url: str, language: str, code: str, args: argparse.Namespace) -> dict[str, float]:
    """``/run_code`` and the graded path on ``code`` (its build cached first)."""
    tag = PROGRAMS[language][0]
    run_code(url, language, code, 0)
    alone = statistics.median(run_code(url, language, code, i) for i in range(5))
    wall, latencies = measure([lambda i=i: run_code(url, language, code, i) for i in range(args.cases)],
                              args.concurrency)  # fmt: skip
    samples = args.cases // args.tests
    graded_wall, _ = measure(
        [lambda i=i: graded(url, tag, code, i * args.tests, args.tests) for i in range(samples)], args.concurrency
    )
    return {
        "run_code_runs_per_s": args.cases / wall, "run_code_alone_ms": 1000 * alone,
        "run_code_p50_ms": 1000 * statistics.median(latencies), "run_code_p95_ms": 1000 * percentile(latencies, 0.95),
        "graded_tests_per_s": samples * args.tests / graded_wall,
        "graded_ms_per_test": 1000 * graded_wall / (samples * args.tests),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tests", type=int, default=10, help="test cases per sample on the graded path")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    with gunicorn_server("code", ENV, threads=64) as server:
        for language, (_, source) in PROGRAMS.items():
            code = f"{source}\n{'#' if language == 'python' else '//'} {uuid.uuid4().hex}"  # a fresh build
            figures = bench(server.url, language, code, args)
            figures["run_code_runs_per_s_per_core"] = figures["run_code_runs_per_s"] / cores
            shown = {k: round(v, 2) for k, v in figures.items()}
            print(json.dumps({"language": language, "cores": cores, "load": os.getloadavg()[0], **shown}), flush=True)


if __name__ == "__main__":
    main()
