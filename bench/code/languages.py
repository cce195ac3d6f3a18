"""Per language: a GRPO group of identical A+B programs with the compile cache cold and warm,
and the same programs compiled for every test (what peers do).

For each language, against one running server: ``--group`` copies of a correct A+B program
with ``--tests`` stdin tests, first with a fresh source (cold: one build, then every run),
then the same request again (warm: the build is cached); then, as judges that recompile for
every test do, ``--group`` distinct sources with one test each (``--group`` builds: the cost
of a build plus a run, per test). Medians of ``--rounds``.

    python -m bench.code.languages [--group 8] [--tests 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import requests

from testing.code import LANGUAGES_ENV
from testing.code_cases import CASES, TAGS
from testing.server import gunicorn_server


def request(url: str, sources: list[str], tag: str, tests: int) -> float:
    label = {"inputs": [f"{i} {i + 1}\n" for i in range(tests)], "outputs": [f"{2 * i + 1}\n" for i in range(tests)]}
    body = {
        "outputs": [f"```{tag}\n{code}\n```" for code in sources],
        "prompts": ["p"] * len(sources),
        "labels": [label] * len(sources),
    }
    started = time.perf_counter()
    out = requests.post(url + "/reward/score", json=body, timeout=600).json()
    took = time.perf_counter() - started
    assert out["rewards"] == [1.0] * len(sources), out["error_types"]
    return took


def bench(url: str, language: str, group: int, tests: int, rounds: int) -> dict[str, float]:
    source, tag = CASES[language][0][2], TAGS[language]
    cold, warm, per_test = [], [], []
    for _ in range(rounds):
        salted = f"{source}\n// {uuid.uuid4().hex}\n"
        cold.append(request(url, [salted] * group, tag, tests))
        warm.append(request(url, [salted] * group, tag, tests))
        distinct = [f"{source}\n// {uuid.uuid4().hex}\n" for _ in range(group)]
        per_test.append(request(url, distinct, tag, 1))
    runs = group * tests
    return {
        "cold_s": statistics.median(cold),
        "warm_s": statistics.median(warm),
        "warm_ms_per_test": 1000 * statistics.median(warm) / runs,
        "samples_per_s_warm": group / statistics.median(warm),
        # Judges that build for every test pay a build and a run per test.
        "rebuild_ms_per_test": 1000 * statistics.median(per_test) / group,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tests", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--languages", nargs="*", default=list(CASES))
    args = parser.parse_args()
    env = {**LANGUAGES_ENV, "SCORER_CODE_SAMPLE_WALL_S": "120", "SCORER_CODE_TEST_WALL_S": "10"}
    with gunicorn_server("code", env, threads=64) as server:
        for language in args.languages:
            figures = bench(server.url, language, args.group, args.tests, args.rounds)
            print(json.dumps({"language": language, **{k: round(v, 3) for k, v in figures.items()}}), flush=True)


if __name__ == "__main__":
    main()
