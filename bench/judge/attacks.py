"""What a misbehaving engine or one flooding client costs the judge service: each scenario
against a judge under gunicorn in front of the stand-in engine (testing/engine_standin.py).

- slow: the engine sends its answer at 1 byte/s; the request's deadline 8 s. When the answer
  came, and when the judge hung up on the engine (its sender thread and engine slot free again).
- huge: a 60 MB completion. The worker's resident memory before, at its peak and after, and
  the bytes the engine got to send.
- malformed: usage counts negative, Infinity, 1e400, and a JSON body nested 100,000 deep: the
  statuses.
- flood: three 4.3 kB pickles from one client, each one 64x64 PNG referenced 1,024 times
  (1,024 engine calls), 8 calls at once of 50 ms each, the deadline 8 s; then a one-image
  request from another client: its latency alone and during the flood, and the flood's answers.
- ready: the engine goes down: how long until ``/ready`` says so, and the probes it sent the
  engine while polled ten times a second.

Prints one JSON object. Run it in a checkout to measure that checkout (the before of a change: a
copy of the older tree with this file and testing/engine_standin.py in it).

    .venv/bin/python -m bench.judge.attacks
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from testing.engine_standin import StandInEngine, completion, judge_server, memo_flood, post
from testing.images import blank


def worker_memory(pid: int) -> dict[str, float]:
    """The worker's resident and peak resident memory, MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def timed(send: Any) -> tuple[int, float]:
    started = time.monotonic()
    try:
        status = send().status_code
    except requests.RequestException as exc:
        status = type(exc).__name__
    return status, round(time.monotonic() - started, 2)


def slow(logs: Path) -> dict[str, Any]:
    engine = StandInEngine()
    engine.bytes_per_s = 1.0
    try:
        with judge_server(engine, logs, REQUEST_TIMEOUT_S="8") as server:
            started = time.monotonic()
            status, took = timed(lambda: post(server, [blank(64)], timeout=300))
            while not engine.answers[0].ended and time.monotonic() - started < 300:
                time.sleep(0.1)
            return {
                "status": status,
                "answer_s": took,
                "engine_released_s": round(engine.answers[0].ended - started, 2),
            }
    finally:
        engine.close()


def huge(logs: Path) -> dict[str, Any]:
    engine = StandInEngine()
    try:
        with judge_server(engine, logs) as server:
            pid = server.worker_pids()[0]
            assert post(server, [blank(64)]).status_code == 200  # the worker warm
            engine.body, before = completion("Final Score: 4 " + "x" * 60_000_000), worker_memory(pid)
            status, took = timed(lambda: post(server, [blank(64)]))
            time.sleep(2)
            after = worker_memory(pid)
            return {
                "status": status,
                "answer_s": took,
                "rss_before_mb": round(before["VmRSS"]),
                "peak_mb": round(after["VmHWM"]),
                "rss_after_mb": round(after["VmRSS"]),
                "engine_sent_mb": round(engine.answers[-1].sent / 1e6, 1),
            }
    finally:
        engine.close()


def malformed(logs: Path) -> dict[str, Any]:
    base = completion("Final Score: 4").rsplit(b'"usage"', 1)[0] + b'"usage": '
    bodies = {
        "negative": base + b'{"prompt_tokens": -5}}',
        "infinity": base + b'{"prompt_tokens": Infinity}}',
        "1e400": base + b'{"completion_tokens": 1e400}}',
        "nested": b"[" * 100_000 + b"]" * 100_000,
    }
    engine = StandInEngine()
    try:
        with judge_server(engine, logs) as server:
            statuses = {}
            for name, body in bodies.items():
                engine.body = body
                statuses[name] = post(server, [blank(64)]).status_code
            return statuses
    finally:
        engine.close()


def flood(logs: Path) -> dict[str, Any]:
    engine = StandInEngine()
    engine.delay_s = 0.05
    settings = {"concurrency": "8", "REQUEST_TIMEOUT_S": "8", "TRUSTED_PROXIES": "127.0.0.1"}
    try:
        with judge_server(engine, logs, **settings) as server:
            post(server, [blank(64)] * 16, client="10.0.0.9")  # the call time known
            alone = timed(lambda: post(server, [blank(64)], client="10.0.0.2"))
            images, outcomes = memo_flood(), []
            attackers = [
                threading.Thread(target=lambda: outcomes.append(timed(lambda: post(server, images, "10.0.0.1"))))
                for _ in range(3)
            ]
            for thread in attackers:
                thread.start()
            calls, waited = engine.calls, time.monotonic()
            # Until the flood's calls reach the engine; a flood refused whole never does.
            while engine.calls < calls + 64 and time.monotonic() - waited < 30:
                time.sleep(0.01)
            during = timed(lambda: post(server, [blank(64)], client="10.0.0.2"))
            for thread in attackers:
                thread.join()
            return {"victim_alone": alone, "victim_during_flood": during, "flood": sorted(outcomes)}
    finally:
        engine.close()


def ready(logs: Path) -> dict[str, Any]:
    engine = StandInEngine()
    try:
        with judge_server(engine, logs, ready_probe_s="1") as server:
            engine.down()
            probes, started, polls = engine.probes, time.monotonic(), 0
            while time.monotonic() - started < 30:
                polls += 1
                if requests.get(server.url + "/ready", timeout=10).status_code == 503:
                    break
                time.sleep(0.1)
            took = time.monotonic() - started
            return {
                "not_ready_after_s": round(took, 2) if took < 30 else None,
                "polls": polls,
                "probes": engine.probes - probes,
            }
    finally:
        engine.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as logs:
        report = {name: run(Path(logs)) for name, run in [("slow", slow), ("huge", huge), ("malformed", malformed)]}
        report |= {"flood": flood(Path(logs)), "ready": ready(Path(logs))}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
