"""What an interactive test costs next to a stdin test: one running server, a GRPO group of
``--group`` identical C++ programs on ``--tests`` tests each, warm (the program's and the
interactor's builds cached by a first request), medians of ``--rounds``.

- stdin: the program reads a number and prints it (one run per test);
- interactive: the same program and tests as guess the number (``testing.interactive``), a
  binary search of 30 questions over [1, 10^9], each a round trip through the interactor.

    python -m bench.code.interactive [--group 8] [--tests 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import requests

from testing.interactive import CPP_SEARCH, GUESS
from testing.server import gunicorn_server

ENV = {
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    "SCORER_CODE_ADMISSION": "off",
    "SCORER_CODE_SAMPLE_WALL_S": "120",
    "SCORER_CODE_MEMORY_MB": "256",
}
ECHO = '#include <cstdio>\nint main(){long long x;scanf("%lld",&x);printf("%lld\\n",x);}'


def labels(tests: int) -> dict[str, tuple[dict, str]]:
    """Per kind, its label and its program: the same numbers as tests."""
    numbers = [1 + (i * 7919 * 104729) % 1_000_000_000 for i in range(tests)]
    stdin = {"inputs": [f"{n}\n" for n in numbers], "outputs": [f"{n}\n" for n in numbers]}
    interactive = {"interactor": GUESS, "tests": [{"input": f"{n}\n", "answer": "30\n"} for n in numbers]}
    return {"stdin": (stdin, ECHO), "interactive": (interactive, CPP_SEARCH.replace("OFFSET", "0"))}


def request(url: str, label: dict, source: str, group: int) -> float:
    body = {"outputs": [f"```cpp\n{source}\n```"] * group, "prompts": ["p"] * group, "labels": [label] * group}
    started = time.perf_counter()
    out = requests.post(url + "/reward/score", json=body, timeout=600).json()
    took = time.perf_counter() - started
    assert out["rewards"] == [1.0] * group, out["error_types"]
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tests", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with gunicorn_server("code", ENV, threads=64) as server:
        for kind, (label, source) in labels(args.tests).items():
            request(server.url, label, source, args.group)  # the builds
            took = statistics.median(request(server.url, label, source, args.group) for _ in range(args.rounds))
            figures = {"s_per_request": took, "ms_per_test": 1000 * took / (args.group * args.tests)}
            print(json.dumps({"kind": kind, **{k: round(v, 3) for k, v in figures.items()}}), flush=True)


if __name__ == "__main__":
    main()
