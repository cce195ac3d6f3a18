"""The judge service in front of a real OpenAI-compatible engine (``transformers serve`` with a
tiny random Qwen2-VL steered to answer a UnifiedReward 2.0 reply, testing/judge_engine.py)
against the same chat completions sent the way VeRL-Omni's ``unified_reward.py`` sends them.

Each round, the same ``--samples`` images are scored two ways, in a different order each round:

- service: one request to the judge service with every sample (its engine client sends one
  chat completion per sample, at most ``SCORER_JUDGE_CONCURRENCY`` at once);
- direct: one chat completion per sample straight to the engine, all at once, each image
  base64-encoded by the caller, as VeRL-Omni's reward loop runs ``compute_score_unified_reward``
  for every sample of a batch concurrently (one request per image, no cap).

Per way: samples/s and the round's wall time, the median over rounds, and the service's ratio to
the direct calls'. Every score is checked: the steered reply's from the service, and the same
reply from each direct call. The engine runs under ``--engine-python`` (an environment with
transformers' serving extras and torchvision), on ``--device``. ``--judge qwenvl`` measures
flow_grpo's Qwen-VL aesthetic judge the same way (its task text, up to 2,048 new tokens; the
direct calls send what the judge sends, straight to the engine).

    .venv/bin/python -m bench.judge.run --engine-python .venv-reference/bin/python [--samples 64] [--rounds 3]
    .venv/bin/python -m bench.judge.run --engine-python .venv-reference/bin/python --judge qwenvl
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from bench.common import burst, write_report
from common.sdk.client import ScorerClient
from services.judge import prompts
from testing.judge_engine import engine, save_judge_model
from testing.server import ROOT, Server, free_port


@dataclass(frozen=True)
class Judge:
    """A judge as the bench runs it: the reply the engine's model is steered to, the score the
    service makes of it, and the chat completion a direct caller sends for one sample."""

    reply: str
    expected: float
    task: Callable[[str], str]  # the caption -> the text sent after the image
    sampling: prompts.Sampling
    score: Callable[[str], float]  # a reply -> its score


JUDGES = {
    "unifiedreward": Judge(
        "Alignment Score (1-5): 4\nCoherence Score (1-5): 3\nStyle Score (1-5): 5",
        0.75,
        prompts.unified_reward_prompt,
        prompts.UNIFIED_REWARD_SAMPLING,
        lambda reply: prompts.unified_reward_score(prompts.parse_unified_reward(reply)),
    ),
    "qwenvl": Judge(
        "<Thought>\nSharp, vibrant, a clear focal point.\n</Thought>\n<Score>4</Score>",
        0.8,
        lambda _caption: prompts.QWENVL_TASK,  # flow_grpo sends no caption
        prompts.QWENVL_SAMPLING,
        lambda reply: prompts.parse_qwenvl(reply) / 5,
    ),
}


def direct_body(judge: Judge, image: bytes, caption: str, model: str) -> bytes:
    """One sample's chat completion as VeRL-Omni builds it: the image as a base64 PNG data URL,
    then the judge's text, with its sampling parameters."""
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": judge.task(caption)}]
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": content}], **judge.sampling.body()}
    ).encode()


def direct_wrong(judge: Judge, answers: list[bytes]) -> int:
    """Direct replies whose score is not the steered one."""
    return sum(
        judge.score(json.loads(answer)["choices"][0]["message"]["content"]) != judge.expected for answer in answers
    )


def png(size: int, shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (shade, 255 - shade, 128)).save(buffer, format="PNG")
    return buffer.getvalue()


def run(args: argparse.Namespace) -> dict[str, Any]:
    judge = JUDGES[args.judge]
    images = [png(args.image_size, 7 * i % 256) for i in range(args.samples)]
    captions = [f"a photo of object {i}" for i in range(args.samples)]
    logs = args.out.parent / "judge-logs"
    logs.mkdir(parents=True, exist_ok=True)
    rounds: list[dict[str, Any]] = []
    started = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {what}", flush=True)

    with tempfile.TemporaryDirectory(prefix="judge-bench-") as tmp, contextlib.ExitStack() as stack:
        model = str(Path(tmp) / "model")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            "SCORER_JUDGE_ENGINE": url,
            "SCORER_JUDGE_MODEL": model,
            "SCORER_JUDGE_JUDGE": args.judge,
            "SCORER_JUDGE_PARSE_FAILURE_SCORE": "nan",
            "SCORER_REQUEST_TIMEOUT_S": "600",
        }
        servers: list[Server] = []

        def while_starting() -> None:
            """The model saved and the service started while the engine imports its packages
            (the service's worker waits for the engine to answer)."""
            save_judge_model(Path(model), judge.reply)
            progress("model saved")
            servers.append(Server("judge", env, workers=1, threads=None, log=logs / "judge.log"))
            stack.callback(servers[0].stop)

        with engine(args.engine_python, logs / "engine.log", port, args.device, while_starting):
            progress("engine up")
            server = servers[0]
            server.wait_ready(timeout=300)
            progress("service up")
            client = ScorerClient(server.url, timeout=600)
            bodies = [direct_body(judge, image, caption, model) for image, caption in zip(images, captions)]
            client.scores(images[:1], captions[:1])  # the engine's first call loads the model
            progress("model loaded by the engine")
            for number in range(args.rounds):
                result: dict[str, Any] = {}
                for way in ["service", "direct"] if number % 2 == 0 else ["direct", "service"]:
                    if way == "service":
                        sent_at = time.perf_counter()
                        scores = client.scores(images, captions)
                        wall = time.perf_counter() - sent_at
                        wrong = sum(score != judge.expected for score in scores)
                    else:
                        sent = burst(f"{url}/v1/chat/completions", bodies, {"Content-Type": "application/json"})
                        wall, wrong = sent["wall_s"], direct_wrong(judge, sent["answers"])
                    result[way] = {"wall_s": wall, "samples_per_s": args.samples / wall, "wrong": wrong}
                rounds.append(result)
                progress(json.dumps(result))
    median = {
        way: {key: statistics.median(r[way][key] for r in rounds) for key in ("wall_s", "samples_per_s", "wrong")}
        for way in ("service", "direct")
    }
    ratio = median["service"]["samples_per_s"] / median["direct"]["samples_per_s"]
    return {"config": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds, "median": median, "ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-python", default=sys.executable, help="the engine's interpreter")
    parser.add_argument("--device", default="cpu", help="the engine's: cpu, cuda")
    parser.add_argument("--judge", choices=sorted(JUDGES), default="unifiedreward", help="which judge the service runs")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "judge.json")
    args = parser.parse_args()
    report = write_report(args, run)
    m = report["median"]
    print(
        f"{args.judge}: service {m['service']['samples_per_s']:.2f} samples/s, direct engine calls "
        f"{m['direct']['samples_per_s']:.2f} samples/s: ratio {report['ratio']:.2f}; "
        f"wrong {m['service']['wrong']:.0f} / {m['direct']['wrong']:.0f}"
    )


if __name__ == "__main__":
    main()
