"""Real gunicorn processes for the tests: started on a free port, waited on until ready."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter, Retry

from common.setup import registry

ROOT = Path(__file__).resolve().parent.parent
# The node id of the ``unit`` test now running (tests/conftest.py): it may not start a server.
UNIT_TEST: str | None = None

# The service preparations already run in this process (run.sh runs them before a service starts).
_PREPARED: set[tuple[str, ...]] = set()


def prepare(service: str, env: dict[str, str] | None, python: str | None) -> None:
    """Run what ``run.sh`` runs before ``service`` starts (``Service.prepare``: the code
    sandbox's packages), once per interpreter and settings."""
    full_env = {**os.environ, **(env or {})}
    settings = tuple(sorted(f"{k}={v}" for k, v in full_env.items() if k.startswith("SCORER_")))
    for module in registry.get(service).prepare:
        key = (python or sys.executable, module, *settings)
        if key not in _PREPARED:
            subprocess.run([key[0], "-m", module], cwd=ROOT, env=full_env, check=True)
            _PREPARED.add(key)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A gunicorn master running one scorer service, with its output kept in a log file."""

    def __init__(
        self,
        service: str,
        env: dict[str, str] | None,
        workers: int,
        threads: int | None,
        log: Path,
        port: int = 0,
        python: str | None = None,
        cpus: set[int] | None = None,
        root: Path = ROOT,
    ) -> None:
        if UNIT_TEST is not None:
            raise RuntimeError(f"{UNIT_TEST} is marked unit but starts a {service} server: it is an integration test")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        if root == ROOT:  # another copy's services are in its registry, not this process's: none prepares
            prepare(service, env, python)
        full_env = {
            **os.environ,
            "SCORER_SERVICE": service,
            "SCORER_BIND": f"127.0.0.1:{self.port}",
            "SCORER_WORKERS": str(workers),
            **(env or {}),
        }
        full_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if threads:
            full_env["SCORER_THREADS"] = str(threads)
        self._log = open(log, "wb")
        self.process = subprocess.Popen(
            [python or sys.executable, "-m", "gunicorn", "-c", str(root / "gunicorn.conf.py")],
            cwd=root,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Pinned, the node sizes itself for these CPUs alone (``common.configuration.cpus``), whatever the machine.
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        )

    def wait_ready(self, timeout: float = 120.0, require_ready: bool = True) -> None:
        deadline = time.monotonic() + timeout
        path = "/ready" if require_ready else "/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if requests.get(self.url + path, timeout=2).status_code == 200:
                    return
            except requests.RequestException:  # not listening yet, or a worker still importing
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.logs()}")

    def settled_ready(self, tries: int, pause: float) -> requests.Response:
        """``/ready`` once the model's setup has come to a verdict (its reason no longer says
        loading), or the last answer after ``tries`` polls ``pause`` seconds apart."""
        for _ in range(tries):
            ready = requests.get(self.url + "/ready", timeout=10)
            if "loading" not in ready.json().get("reason", ""):
                break
            time.sleep(pause)
        return ready

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def worker_pids(self) -> list[int]:
        """Pids of the gunicorn workers (children of the master)."""
        return child_pids(self.process.pid)

    def sockets(self) -> int:
        """Sockets the workers hold: their listeners and the connections they have accepted."""
        held = 0
        for pid in self.worker_pids():
            fds = f"/proc/{pid}/fd"
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):  # closed meanwhile
                    held += os.readlink(f"{fds}/{fd}").startswith("socket:")
        return held

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


@contextlib.contextmanager
def gunicorn_server(
    service: str,
    env: dict[str, str] | None = None,
    workers: int = 1,
    threads: int | None = None,
    require_ready: bool = True,
    log_dir: Path | None = None,
    port: int = 0,
    python: str | None = None,
    cpus: set[int] | None = None,
    root: Path = ROOT,
) -> Iterator[Server]:
    """Start ``service`` under gunicorn, yield the running ``Server`` (``.url``), stop it after.

    ``port`` pins the port (a node restarted behind a balancer comes back on its address);
    ``python`` runs it from another virtual environment; ``cpus`` pins it to those CPUs; ``root``
    serves another copy of the tree (one a test has added a service to)."""
    log_dir = log_dir or Path(os.environ.get("SCORER_TEST_LOGS", "/tmp"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{service}-{free_port()}.log"
    server = Server(service, env, workers, threads, log, port, python, cpus, root)
    try:
        server.wait_ready(require_ready=require_ready)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running_server(
    service: str, env: dict[str, str] | None = None, workers: int = 1, threads: int | None = None
) -> Iterator[str]:
    """Like ``gunicorn_server``, yielding only the base URL."""
    with gunicorn_server(service, env, workers, threads) as server:
        yield server.url


def batch_stats(url: str, service: str) -> tuple[float, float]:
    """(count, sum) of the batch-size histogram in /metrics."""
    text = requests.get(url + "/metrics", timeout=10).text

    def total(suffix: str) -> float:
        pattern = rf'^scorer_batch_size_{suffix}\{{[^}}]*service="{service}"[^}}]*\}} (\S+)$'
        return sum(float(value) for value in re.findall(pattern, text, re.M))

    return total("count"), total("sum")


def metric_total(url: str, name: str) -> float:
    """A metric's samples summed over their labels, from /metrics (``scorer_images_decoded_total``)."""
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(float(value) for value in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def answered(url: str, status: int) -> float:
    """Scoring requests the node answered with ``status`` so far, from its /metrics (its workers' merged)."""
    text = requests.get(url + "/metrics", timeout=10).text
    pattern = rf'^scorer_requests_total\{{[^}}]*status="{status}"[^}}]*\}} (\S+)$'
    return sum(float(value) for value in re.findall(pattern, text, re.M))


def child_pids(pid: int) -> list[int]:
    """Pids of the processes whose parent is ``pid``."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in out.split()]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def refused_without_weights(service: str, env: dict[str, str], variable: str, payload: dict, log_dir: Path) -> None:
    """``service`` with ``variable`` naming no weights file: the server stays up, ``/ready`` and a
    request answer 503 with the variable named, and run.sh's preflight (under a bare python3)
    refuses it for the same reason before anything is installed."""
    with gunicorn_server(service, env=env, require_ready=False, log_dir=log_dir) as server:
        ready = server.settled_ready(100, 0.2)
        assert ready.status_code == 503
        assert variable in ready.json()["reason"]
        assert post(server.url, payload).status_code == 503
    done = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.preflight"],
        cwd=ROOT,
        env={**os.environ, "SCORER_SERVICE": service, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert variable in done.stderr and "not a directory or a checkpoint file" in done.stderr


def post(url: str, payload: dict) -> requests.Response:
    """``payload`` pickled to an image service, as flow_grpo sends it."""
    return requests.post(url, data=pickle.dumps(payload), timeout=120)


def flow_grpo_call(url: str, body: bytes, key: str = "scores") -> list[float]:
    """One call of flow_grpo's remote rewards, as ``geneval_score`` makes it (``outputs`` for
    ``deqa_score_remote`` and ``unifiedreward_score_remote``): a session retrying 500 only, a
    thousand times with backoff, 120 s an attempt; the body unpickled whatever the status and
    ``key`` read (an error's body has none: ``KeyError``)."""
    session = requests.Session()
    retries = Retry(total=1000, backoff_factor=1, status_forcelist=[500], allowed_methods=False)
    session.mount("http://", HTTPAdapter(max_retries=retries))
    response = session.post(url, data=body, timeout=120)
    return pickle.loads(response.content)[key]


def scores_of(response: requests.Response) -> list[float]:
    """A 200's scores; flow_grpo's ``outputs`` must be the same list."""
    assert response.status_code == 200, response.content[:500]
    body = pickle.loads(response.content)
    assert body["outputs"] == body["scores"]
    return body["scores"]
