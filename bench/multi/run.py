"""Several image rewards in one call (the ``multi`` service) against the same rewards served
alone, each sample uploaded and decoded once per reward (issue 20).

For each set of rewards (``--sets``: OCR + PickScore, and OCR + PickScore + aesthetic), the same
``--requests`` samples (flow_grpo OCR prompts, their quoted text rendered in ``--image-size``
JPEGs; one image per request, pickle protocol, all at once as VeRL-Omni sends a batch) are
scored three ways, in a different order each round:

- combined: one request per sample to the ``multi`` service serving the set, the weights in the
  URL (``/?ocr=0.7&pickscore=0.3``, the form VeRL-Omni's client can be given); its ``scores``
  are the weighted sums, its ``details`` each reward's own scores;
- sequential: flow_grpo's ``multi_score``: the client sends the batch to each reward's own
  service in turn, the next reward once the last answer of the one before is in, and sums;
- concurrent: the batch to every reward's own service at once, one client thread per reward.

Per way: request bytes uploaded per sample (the bodies; headers left out), images decoded per
sample (``scorer_images_decoded_total`` in the services' ``/metrics``), the services' CPU
seconds per sample and the cores they had (CPU seconds over wall time), samples/s (every
reward of every sample answered), p50/p99 of a sample's latency (its first request sent to its
last answer in); each the median over rounds. Every combined answer is checked: each
``details`` entry against what that reward's own service answered for the sample in the same
round, ``scores`` against the weighted sum.

    .venv/bin/python -m bench.multi.run [--requests 64] [--rounds 3] [--sets ocr+pickscore,ocr+pickscore+aesthetic]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import requests
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.aesthetic.bench import percentiles  # noqa: E402
from bench.clip.bench import cpu_seconds  # noqa: E402
from bench.common import burst, write_report  # noqa: E402
from bench.ocr.run import one_image_bodies  # noqa: E402
from common.sdk.client import parse_answer  # noqa: E402
from testing.clip_models import save_random_clip_model  # noqa: E402
from testing.images import ocr_prompts, quoted, render_text  # noqa: E402
from testing.random_clip import save_random_clip  # noqa: E402
from testing.server import Server  # noqa: E402

DECODES = "scorer_images_decoded_total"
# Each reward's weight in every set it is part of (OCR first: the reward a recipe protects).
WEIGHTS = {"ocr": 0.7, "pickscore": 0.3, "aesthetic": 0.1}
WAYS = ("combined", "sequential", "concurrent")
# A CLIP's score from a batch of 8 and from a batch of 1 differ by float rounding only.
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Calls:
    """What one way's requests did in one round: each burst's result, per reward or combined."""

    bursts: list[dict[str, Any]]
    wall_s: float


def decodes(server: Server) -> float:
    """The images ``server`` has decoded so far, all its scorers together."""
    text = requests.get(server.url + "/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == DECODES
    )


def sample_latencies(bursts: Sequence[dict[str, Any]]) -> list[float]:
    """Each sample's latency over the bursts that scored it: first request sent to last answer."""
    spans = zip(*(result["spans"] for result in bursts))
    return [max(end for _, end in pairs) - min(start for start, _ in pairs) for pairs in spans]


def scores_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    if result["statuses"] != {200: len(result["answers"])}:
        raise RuntimeError(f"answers {result['statuses']}: {result['answers'][0][:300]!r}")
    return [parse_answer(answer, "application/octet-stream") for answer in result["answers"]]


def combined(url: str, rewards: Sequence[str], bodies: list[bytes]) -> Calls:
    query = urlencode({reward: WEIGHTS[reward] for reward in rewards})
    started = time.perf_counter()
    result = burst(f"{url}/?{query}", bodies)
    return Calls([result], time.perf_counter() - started)


def sequential(urls: Sequence[str], bodies: list[bytes]) -> Calls:
    started = time.perf_counter()
    results = [burst(url + "/", bodies) for url in urls]
    return Calls(results, time.perf_counter() - started)


def concurrent(urls: Sequence[str], bodies: list[bytes]) -> Calls:
    started = time.perf_counter()
    with ThreadPoolExecutor(len(urls)) as pool:
        results = list(pool.map(lambda url: burst(url + "/", bodies), urls))
    return Calls(results, time.perf_counter() - started)


def check(rewards: Sequence[str], combined_calls: Calls, separate: Calls) -> dict[str, Any]:
    """The combined answers against the separate services' answers for the same samples."""
    answers = scores_of(combined_calls.bursts[0])
    alone = {reward: [a["scores"][0] for a in scores_of(r)] for reward, r in zip(rewards, separate.bursts)}
    detail_diff = max(
        abs(answer["details"][reward][0] - alone[reward][i]) for i, answer in enumerate(answers) for reward in rewards
    )
    sum_diff = max(
        abs(answer["scores"][0] - math.fsum(WEIGHTS[r] * answer["details"][r][0] for r in rewards))
        for answer in answers
    )
    wrong = sum(
        any(abs(answer["details"][r][0] - alone[r][i]) > TOLERANCE for r in rewards)
        or abs(answer["scores"][0] - math.fsum(WEIGHTS[r] * alone[r][i] for r in rewards)) > TOLERANCE
        for i, answer in enumerate(answers)
    )
    return {"wrong": wrong, "max_detail_diff": detail_diff, "max_weighted_sum_diff": sum_diff}


def measure_way(way: Callable[[], Calls], servers: Sequence[Server], samples: int) -> tuple[dict[str, float], Calls]:
    """One round of one way: its figures per sample, and its calls (for the check)."""
    decoded, cpu = sum(decodes(s) for s in servers), sum(cpu_seconds(s.process.pid) for s in servers)
    calls = way()
    decoded = sum(decodes(s) for s in servers) - decoded
    cpu = sum(cpu_seconds(s.process.pid) for s in servers) - cpu
    for result in calls.bursts:
        scores_of(result)  # every answer a 200
    return {
        "samples_per_s": samples / calls.wall_s,
        **percentiles(sample_latencies(calls.bursts)),
        "upload_bytes_per_sample": sum(result["sent_bytes"] for result in calls.bursts) / samples,
        "download_bytes_per_sample": sum(len(answer) for r in calls.bursts for answer in r["answers"]) / samples,
        "decodes_per_sample": decoded / samples,
        "server_cpu_s_per_sample": cpu / samples,
        # The cores the services had: on a shared machine, what other jobs left them.
        "server_cores": cpu / calls.wall_s,
    }, calls


def summarize(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    medians = {way: {key: statistics.median(r[way][key] for r in rounds) for key in rounds[0][way]} for way in WAYS}

    def ratio(key: str, numerator: str, denominator: str) -> float:
        return statistics.median(r[numerator][key] / r[denominator][key] for r in rounds)

    medians["ratios"] = {
        "throughput_combined_vs_sequential": ratio("samples_per_s", "combined", "sequential"),
        "throughput_combined_vs_concurrent": ratio("samples_per_s", "combined", "concurrent"),
        "uploads_separate_vs_combined": ratio("upload_bytes_per_sample", "sequential", "combined"),
        "decodes_separate_vs_combined": ratio("decodes_per_sample", "sequential", "combined"),
        "server_cpu_sequential_vs_combined": ratio("server_cpu_s_per_sample", "sequential", "combined"),
    }
    return medians


def model_env(args: argparse.Namespace, models: Path) -> dict[str, str]:
    """One node's settings for all its scorers: the single services and the multi service read
    the same ones."""
    return {
        "SCORER_DEVICE": args.device,
        "SCORER_OCR_ENGINE": args.ocr_engine,
        "SCORER_PICKSCORE_MODEL": str(save_random_clip_model(models / "pickscore", size=args.pickscore_size)),
        "SCORER_PICKSCORE_PRECISION": args.precision,
        "SCORER_AESTHETIC_CLIP": str(save_random_clip(models / "aesthetic", size=args.aesthetic_size)),
        "SCORER_AESTHETIC_PRECISION": args.precision,
    }


def measure_set(
    rewards: tuple[str, ...], multi: Server, alone: Sequence[Server], bodies: list[bytes], rounds: int
) -> dict[str, Any]:
    """Rounds of the three ways for one set of rewards: medians, the check, each round's figures."""
    urls = [server.url for server in alone]
    ways: dict[str, tuple[Callable[[], Calls], Sequence[Server]]] = {
        "combined": (partial(combined, multi.url, rewards, bodies), [multi]),
        "sequential": (partial(sequential, urls, bodies), alone),
        "concurrent": (partial(concurrent, urls, bodies), alone),
    }
    combined(multi.url, rewards, bodies[:8])  # warm-up
    concurrent(urls, bodies[:8])
    figures, checks = [], []
    for index in range(rounds):
        round_figures, calls = {}, {}
        for way in WAYS[index % 3 :] + WAYS[: index % 3]:  # each way first in turn
            function, servers = ways[way]
            round_figures[way], calls[way] = measure_way(function, servers, len(bodies))
            print(f"  {'+'.join(rewards)} round {index + 1} {way}: {json.dumps(round_figures[way])}", flush=True)
        figures.append(round_figures)
        checks.append(check(rewards, calls["combined"], calls["sequential"]))
    return {
        "median": summarize(figures),
        "check": {
            "wrong": sum(c["wrong"] for c in checks),
            "max_detail_diff": max(c["max_detail_diff"] for c in checks),
            "max_weighted_sum_diff": max(c["max_weighted_sum_diff"] for c in checks),
        },
        "rounds": figures,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    sets = [tuple(s.split("+")) for s in args.sets.split(",")]
    prompts = ocr_prompts(args.requests)
    bodies = one_image_bodies([render_text(quoted(p), size=args.image_size) for p in prompts], prompts)
    logs = args.out.parent / "multi-logs"
    logs.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"config": {k: str(v) for k, v in vars(args).items()}, "weights": WEIGHTS, "sets": {}}
    with tempfile.TemporaryDirectory(prefix="multi-bench-") as tmp, contextlib.ExitStack() as stack:
        env = model_env(args, Path(tmp))

        def start(service: str, rewards: tuple[str, ...] = ()) -> Server:
            """A server started, not waited for: they all load their models at once."""
            extra = {"SCORER_MULTI_REWARDS": ",".join(rewards)} if rewards else {}
            log = logs / f"{'multi-' + '+'.join(rewards) if rewards else service}.log"
            server = Server(service, {**env, **extra}, workers=1, threads=None, log=log)
            stack.callback(server.stop)
            return server

        alone = {reward: start(reward) for reward in dict.fromkeys(r for s in sets for r in s)}
        multi = {rewards: start("multi", rewards) for rewards in sets}
        for server in [*alone.values(), *multi.values()]:
            server.wait_ready(timeout=600)
        print(f"{len(alone) + len(multi)} services up; {args.requests} samples, {args.rounds} rounds", flush=True)
        for rewards in sets:
            separate = [alone[r] for r in rewards]
            report["sets"]["+".join(rewards)] = measure_set(rewards, multi[rewards], separate, bodies, args.rounds)
    return report


def table(report: dict[str, Any]) -> str:
    lines = []
    for name, result in report["sets"].items():
        lines += [
            f"\n{name} ({result['check']['wrong']} wrong; largest details difference "
            f"{result['check']['max_detail_diff']:.2g})\n",
            "| way | samples/s | p50 s | p99 s | uploaded bytes/sample | decodes/sample | server CPU s/sample |"
            " cores |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for way in WAYS:
            m = result["median"][way]
            lines.append(
                f"| {way} | {m['samples_per_s']:.2f} | {m['p50_s']:.2f} | {m['p99_s']:.2f} | "
                f"{m['upload_bytes_per_sample']:.0f} | {m['decodes_per_sample']:.2f} | "
                f"{m['server_cpu_s_per_sample']:.3f} | {m['server_cores']:.2f} |"
            )
        lines.append("\n" + ", ".join(f"{key} {value:.2f}" for key, value in result["median"]["ratios"].items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="ocr+pickscore,ocr+pickscore+aesthetic", help="reward sets, '+' within")
    parser.add_argument("--requests", type=int, default=64, help="samples per round, one request each, all at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ocr-engine", default="auto", choices=["auto", "rapidocr", "torch"])
    parser.add_argument("--pickscore-size", default="tiny", choices=["tiny", "b14", "h14"])
    parser.add_argument("--aesthetic-size", default="tiny", choices=["tiny", "b16", "l14"])
    parser.add_argument("--precision", default="float16", help="the CLIPs' on a GPU (the CPU runs float32)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "multi.json")
    args = parser.parse_args()
    report = write_report(args, run)
    print(table(report))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
