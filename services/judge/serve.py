"""``run.sh judge --serve MODEL``: the engine (vLLM by default) as a managed child of the service.

Starts the engine on a free loopback port in a session of its own, waits until it answers,
then runs the judge service (gunicorn) pointed at it; a signal to this process stops
both, and either one ending stops the other, so no engine outlives its service.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common.configuration.config import from_env
from common.configuration.devices import visible_gpus
from services.judge.settings import SECTION, JudgeSettings

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_command(settings: JudgeSettings, port: int) -> list[str]:
    """The child engine's command line, its placeholders filled in."""
    gpus = max(1, len(visible_gpus()))
    return shlex.split(settings.serve_command.format(model=settings.serve, port=port, gpus=gpus))


def wait_until_up(url: str, engine: subprocess.Popen, seconds: float, stopping: list[int]) -> bool:
    """True once the engine lists its models (or, where its ``/v1/models`` fails, as
    ``transformers serve``'s does offline, its ``/health`` answers); False when it exits, a
    signal comes or the time runs out."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and engine.poll() is None and not stopping:
        for path in ("/v1/models", "/health"):
            try:
                with urllib.request.urlopen(f"{url}{path}", timeout=5) as answer:
                    if answer.status == 200:
                        return True
            except OSError:
                pass
        time.sleep(1.0)
    return False


def stop(process: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM to the process's session (an engine's workers with it), SIGKILL after ``grace``."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def main() -> int:
    settings = from_env(JudgeSettings, SECTION)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = engine_command(settings, port)
    print(f"[judge] starting the engine: {shlex.join(command)}", file=sys.stderr, flush=True)
    engine = subprocess.Popen(command, start_new_session=True)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    service = None
    try:
        if not wait_until_up(url, engine, settings.engine_wait_s, stopping):
            if stopping:
                return 0
            print(f"[judge] the engine did not come up at {url} (exit {engine.poll()})", file=sys.stderr)
            return 1
        env = {**os.environ, "SCORER_SERVICE": "judge", "SCORER_JUDGE_ENGINE": url}
        env.setdefault("SCORER_JUDGE_MODEL", settings.serve)
        gunicorn = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")]
        service = subprocess.Popen(gunicorn, env=env, start_new_session=True)
        while not stopping and service.poll() is None and engine.poll() is None:
            time.sleep(0.5)
        if engine.poll() is not None and not stopping:
            print(f"[judge] the engine exited ({engine.returncode}); stopping the service", file=sys.stderr)
        return 0 if stopping else 1
    finally:
        if service is not None:
            stop(service)
        stop(engine)


if __name__ == "__main__":
    sys.exit(main())
